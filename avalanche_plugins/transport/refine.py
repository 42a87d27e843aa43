"""Label-free refinement of a fitted key: match the checkpoint's own logits on the anchors through
the frozen late layers, by Adam (:func:`refine_key`) or a few damped Gauss–Newton steps
(:func:`gauss_newton_key`).

.. math:: \\min_T \frac1N \\sum_i \big\\| z_A(x_i) - \\mathrm{late}_A(T(\\mathrm{early}_{AB}(x_i))) \big\\|^2
"""

from __future__ import annotations

import torch

from avalanche_plugins.core.calls import eval_mode, model_forward
from avalanche_plugins.core.checks import check_int, check_positive
from avalanche_plugins.transport.keys import TransportKey
from avalanche_plugins.transport.stitch import StitchedModel, stage_activations

__all__ = ["gauss_newton_key", "optimize_key", "refine_key"]


def _logit_targets(stitched: StitchedModel, anchors: torch.Tensor, task_labels):
    """The label-free refinement targets: the checkpoint's own logits on the anchors, and the
    updated model's stage activations the key maps (both in eval mode, no graph)."""
    with torch.no_grad(), eval_mode(stitched.late_model), eval_mode(stitched.early_model):
        return (model_forward(stitched.late_model, anchors, task_labels),
                stage_activations(stitched.early_model, stitched.stage, anchors, task_labels))



def refine_key(key: TransportKey, stitched: StitchedModel, anchors: torch.Tensor, task_labels=None, *,
               steps: int = 50, lr: float = 1e-2) -> TransportKey:
    """Refine ``key`` in place without labels: Adam on ``‖z_stitched(x) − z_late(x)‖²`` over the
    anchors, where ``z_late`` are the checkpoint's (``stitched.late_model``'s) own logits.

    The closed form matches activations at the stage; this matches what the frozen late layers
    make of them, so errors the head is sensitive to weigh more. The models are not modified
    (only ``torch.autograd.grad`` w.r.t. the key is taken; no ``.grad`` is written).

    Reproducibility: deterministic for a fixed number of torch threads. Adam's normalised steps
    amplify the float rounding of multi-threaded reductions, so the refined key differs across
    thread counts (measured: 1.3e-3 relative between 1 and 2 threads); pin
    ``torch.set_num_threads`` when comparing runs (the benchmarks run with one thread per worker).
    """
    check_int("steps", steps, minimum=0)
    check_positive("lr", lr)
    if key.family == "identity" or steps == 0:
        return key
    target, u = _logit_targets(stitched, anchors, task_labels)
    with eval_mode(stitched.late_model):
        return optimize_key(
            key, lambda: ((stitched.forward_from_stage(key(u), anchors, task_labels) - target) ** 2).mean(),
            steps=steps, lr=lr)



def gauss_newton_key(key: TransportKey, stitched: StitchedModel, anchors: torch.Tensor, task_labels=None, *,
                     iterations: int = 2, damping: float = 0.1, max_tries: int = 6) -> TransportKey:
    """Refine ``key`` in place without labels by Levenberg–Marquardt on the objective of
    :func:`refine_key`, ``Σ_i ‖z_late(x_i) − z_stitched(x_i)‖²`` over the anchors.

    Each iteration linearises the stitched logits in the key's parameters θ,
    ``z(θ + δ) ≈ z(θ) + J δ`` with ``J`` the ``(N·K) × P`` Jacobian (K logits, P key numbers),
    and takes the damped Gauss–Newton step

        ``δ = (JᵀJ + λI)⁻¹ Jᵀ r = Jᵀ (JJᵀ + λI)⁻¹ r``,   ``r = z_late − z(θ)``,

    solving whichever Gram matrix is smaller in float64, with ``λ = damping · tr(G)/dim(G)``
    (``G`` that Gram matrix). A step that does not lower the objective is retried with 10× the
    damping (up to ``max_tries``); an accepted one divides it by 3. Cost per iteration: one
    forward and ``K`` vectorised backward passes of the late layers on the anchors (``vmap``
    of one ``vjp``), plus the per-(anchor, logit) key gradients (``vmap`` of ``grad``): about
    ``K + 1`` Adam steps of :func:`refine_key`, for what takes it tens of steps.

    Example:
        >>> torch.manual_seed(0) is not None
        True
        >>> from torch import nn
        >>> from avalanche_plugins.transport import fit_transport_key, stitch
        >>> a = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
        >>> b = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
        >>> x = torch.randn(32, 4)
        >>> key = fit_transport_key(stage_activations(b, "1", x), stage_activations(a, "1", x), "cross_channel")
        >>> stitched = stitch(b, a, "1", key)
        >>> before = ((stitched(x) - a(x)) ** 2).sum().item()
        >>> _ = gauss_newton_key(key, stitched, x)
        >>> ((stitched(x) - a(x)) ** 2).sum().item() < before
        True
    """
    check_int("iterations", iterations, minimum=0)
    check_positive("damping", damping)
    check_int("max_tries", max_tries)
    if key.family == "identity" or iterations == 0:
        return key
    target, u = _logit_targets(stitched, anchors, task_labels)
    names = [name for name, _ in key.named_parameters()]

    def key_at(params, inputs):
        return torch.func.functional_call(key, dict(zip(names, params)), (inputs,))

    def logits_of(params):
        return stitched.forward_from_stage(key_at(params, u), anchors, task_labels)

    def row_gradient(params, u_i, g_ik):  # ∇_θ ⟨g_ik, key_θ(u_i)⟩: one row of J
        return torch.func.grad(lambda p: (key_at(p, u_i[None]) * g_ik).sum())(params)

    params = tuple(p.detach() for p in key.parameters())
    lam_scale = damping
    with torch.no_grad(), eval_mode(stitched.late_model):
        loss = float(((target - logits_of(params)) ** 2).sum())
    with eval_mode(stitched.late_model):
        for _ in range(iterations):
            z, pullback = torch.func.vjp(lambda h: stitched.forward_from_stage(h, anchors, task_labels),
                                         key_at(params, u))
            n_logits = z.shape[-1]
            cotangents = torch.eye(n_logits, dtype=z.dtype, device=z.device)[:, None, :].expand(n_logits, *z.shape)
            (dz_dh,) = torch.func.vmap(pullback)(cotangents)            # (K, N, *h.shape[1:])
            rows = torch.func.vmap(torch.func.vmap(row_gradient, in_dims=(None, None, 0)),
                                   in_dims=(None, 0, 1))(params, u, dz_dh)
            jac = torch.cat([r.detach().flatten(2) for r in rows], 2).flatten(0, 1).double()
            res = (target - z.detach()).flatten().double()
            dual = jac.shape[0] < jac.shape[1]
            gram = jac @ jac.T if dual else jac.T @ jac
            eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
            base = float(gram.diagonal().mean())
            if base == 0:
                break  # the logits do not depend on the key here: nothing to fit
            sizes = [p.numel() for p in params]
            for _ in range(max_tries):
                lam = lam_scale * base
                if dual:
                    step = jac.T @ torch.linalg.solve(gram + lam * eye, res)
                else:
                    step = torch.linalg.solve(gram + lam * eye, jac.T @ res)
                trial = tuple(p + d.view_as(p).to(p.dtype) for p, d in zip(params, step.split(sizes)))
                with torch.no_grad():
                    trial_loss = float(((target - logits_of(trial)) ** 2).sum())
                if trial_loss < loss:
                    params, loss, lam_scale = trial, trial_loss, lam_scale / 3
                    break
                lam_scale *= 10
            else:
                break  # no damping lowered the objective: keep the current key
    with torch.no_grad():
        for p, value in zip(key.parameters(), params):
            p.copy_(value)
    return key



def optimize_key(key: TransportKey, loss_of_key, *, steps: int, lr: float) -> TransportKey:
    """Adam on ``key``'s parameters only, in place: ``steps`` times ``loss_of_key()`` (a closure that
    calls the key). Gradients come from ``torch.autograd.grad`` w.r.t. the key, so the models the
    loss runs through never get ``.grad`` written; the key is left frozen again."""
    params = list(key.parameters())
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.Adam(params, lr=lr)
    try:
        for _ in range(steps):
            for p, g in zip(params, torch.autograd.grad(loss_of_key(), params)):
                p.grad = g
            optimizer.step()
    finally:
        for p in params:
            p.grad = None
            p.requires_grad_(False)
    return key
