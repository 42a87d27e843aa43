"""Transport keys: how much "forgotten" knowledge is still readable from the updated network.

After a model learns task A (weights θ_A) and then task B (θ_AB), its task-A accuracy drops. The
stitched model

    ŷ = head_A( f^A_{>ℓ}( T_ℓ( f^{AB}_{≤ℓ}(x) ) ) )

keeps the updated early layers, reuses the checkpoint's late layers and head (never retrained)
and joins them at stage ℓ by a small *key* T_ℓ fitted, without labels, on paired anchor
activations ``u_i = f^{AB}_{≤ℓ}(x_i)`` and ``v_i = f^A_{≤ℓ}(x_i)`` of a few task-A inputs.
If a key recovers task-A accuracy, the early layers still carry the information: it drifted
(``channel`` key: per-channel scale and shift) or moved to another basis (``cross_channel``
key: channel mixing), rather than being erased.

Closed forms (ridge least squares in float64, λ relative to the anchors' mean channel energy,
``λ = ridge · tr(ŨᵀŨ) / C`` with Ũ the centred activations):

* ``identity``: ``T(u) = u`` (the "no key" control);
* ``channel``: ``s_c = Cov(u_c, v_c) / (Var(u_c) + λ)``, ``b_c = μ_v − s_c μ_u``; a dead
  channel (zero variance, λ = 0) gets ``s_c = 0``, i.e. the anchor mean of ``v_c``;
* ``cross_channel``: ``M = ṼᵀŨ (ŨᵀŨ + λI)⁻¹``, ``b = μ_v − M μ_u`` (λ = 0: the
  pseudo-inverse fit of model-stitching work); a 1×1 convolution on conv maps;
* ``procrustes``: the orthogonal ``R`` closest to mapping Ũ onto Ṽ (SVD of ŨᵀṼ), plus a shift.

Conv maps ``(N, C, H, W)`` contribute every spatial position of every anchor as one sample,
token sequences ``(N, T, C)`` every token, flat features ``(N, C)`` every anchor. The relative fit
residual ``‖V − T(U)‖² / ‖V − μ_v‖²`` (fraction of unexplained variance) is stored on the key.

``refine_key`` optionally refines a closed-form key cheaply and still without labels, by
matching the checkpoint's own logits on the anchors through the frozen late layers.

Controls: ``channel_permutation`` (the fitted key applied to channel-permuted activations) and
``correspondence_break`` (a key fitted on mispaired anchors, globally or within class).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from avalanche_plugins.core.calls import eval_mode, is_multitask, model_forward
from avalanche_plugins.core.checks import check_choice, check_int, check_positive
from avalanche_plugins.core.split import split_model

__all__ = [
    "FAMILIES",
    "Recovery",
    "StitchedModel",
    "TransportKey",
    "channel_permutation",
    "class_balanced_anchors",
    "correspondence_break",
    "fit_transport_key",
    "gauss_newton_key",
    "recovery",
    "optimize_key",
    "refine_key",
    "stage_activations",
    "stitch",
    "stitched_accuracy",
]

FAMILIES = ("identity", "channel", "cross_channel", "procrustes")
LAYOUTS = ("flat", "channels_first", "tokens")


# ------------------------------------------------------------------------------------------------
# anchors


def _targets_of(data) -> torch.Tensor:
    if hasattr(data, "targets"):
        return torch.as_tensor([int(t) for t in data.targets])
    return torch.as_tensor([int(data[i][1]) for i in range(len(data))])


def class_balanced_anchors(data, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``⌊n / K⌋`` random samples of each of the ``K`` classes of ``data``, as ``(inputs, targets)``.

    ``data`` is an ``(inputs, targets)`` pair of tensors or a dataset whose items start with
    ``(x, y)`` (an Avalanche dataset, a ``TensorDataset``). The set has ``K·⌊n/K⌋`` anchors, class
    by class; the same ``seed`` picks the same anchors.

    Raises ``ValueError`` when ``n < K`` or a class has fewer than ``⌊n/K⌋`` samples.

    Example:
        >>> x, y = torch.randn(30, 4), torch.arange(30) % 3
        >>> xa, ya = class_balanced_anchors((x, y), 6, seed=0)
        >>> ya.tolist()
        [0, 0, 1, 1, 2, 2]
    """
    check_int("n", n)
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], torch.Tensor):
        inputs, targets = data
        targets = torch.as_tensor(targets)
        if inputs.shape[0] != targets.shape[0]:
            raise ValueError(f"inputs has {inputs.shape[0]} samples but targets has {targets.shape[0]}")
        dataset = None
    else:
        inputs, dataset = None, data
        targets = _targets_of(data)
    if targets.numel() == 0:
        raise ValueError("data is empty: anchors need at least one sample per class")
    classes = targets.unique()
    per_class = n // len(classes)
    if per_class == 0:
        raise ValueError(f"n={n} is smaller than the number of classes ({len(classes)})")
    g = torch.Generator().manual_seed(seed)
    picked = []
    for c in classes.tolist():
        idx = (targets == c).nonzero().flatten()
        if len(idx) < per_class:
            raise ValueError(f"class {c} has {len(idx)} samples, fewer than the {per_class} anchors "
                             f"per class that n={n} asks for")
        picked.append(idx[torch.randperm(len(idx), generator=g)[:per_class]].sort().values)
    index = torch.cat(picked)
    if dataset is None:
        return inputs[index], targets[index]
    xs = [torch.as_tensor(dataset[i][0]) for i in index.tolist()]
    return torch.stack(xs), targets[index]


# ------------------------------------------------------------------------------------------------
# activations as samples


def _infer_layout(a: torch.Tensor) -> str:
    layouts = {2: "flat", 3: "tokens", 4: "channels_first"}
    if a.dim() not in layouts:
        raise ValueError(f"activations must be (N, C), (N, T, C) tokens or (N, C, H, W) maps, "
                         f"got shape {tuple(a.shape)}")
    return layouts[a.dim()]


def _channel_dim(layout: str) -> int:
    return 1 if layout == "channels_first" else -1


def _as_samples(a: torch.Tensor, layout: str) -> torch.Tensor:
    """``(samples, C)``: every position of a conv map and every token is one sample."""
    if layout == "channels_first":
        a = a.movedim(1, -1)
    return a.reshape(-1, a.shape[-1])


# ------------------------------------------------------------------------------------------------
# the key


class TransportKey(nn.Module):
    """A fitted key ``T``: ``T(u) = s ⊙ u + b`` (``channel``), ``M u + b`` (``cross_channel`` and
    ``procrustes``) or ``u`` (``identity``), applied along the channel dimension of ``layout``.

    Built by :func:`fit_transport_key`; construct directly only to load a saved ``state_dict``
    (or use :meth:`from_state_dict`, which reads the family and sizes from it).

    Attributes:
        residual: relative fit residual ``‖V − T(U)‖² / ‖V − μ_v‖²`` on the anchors (NaN if unknown).
    """

    def __init__(self, family: str, in_channels: int, out_channels: int | None = None,
                 layout: str = "flat"):
        super().__init__()
        check_choice("family", family, FAMILIES)
        check_choice("layout", layout, LAYOUTS)
        check_int("in_channels", in_channels)
        out_channels = in_channels if out_channels is None else out_channels
        check_int("out_channels", out_channels)
        if family != "cross_channel" and out_channels != in_channels:
            raise ValueError(f"family={family!r} maps C channels to C channels, got in_channels="
                             f"{in_channels} and out_channels={out_channels}")
        self.family, self.layout = family, layout
        self.in_channels, self.out_channels = in_channels, out_channels
        self.residual = math.nan
        if family == "channel":
            self.scale = nn.Parameter(torch.ones(in_channels), requires_grad=False)
        elif family in ("cross_channel", "procrustes"):
            self.weight = nn.Parameter(torch.eye(out_channels, in_channels), requires_grad=False)
        if family != "identity":
            self.bias = nn.Parameter(torch.zeros(out_channels), requires_grad=False)

    @property
    def num_parameters(self) -> int:
        """Stored numbers of the key (``2C`` channel, ``C_out·C_in + C_out`` matrix keys)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        if self.family == "identity":
            return u
        dim = _channel_dim(self.layout)
        if u.shape[dim] != self.in_channels:
            raise ValueError(f"the key expects {self.in_channels} channels in dim {dim}, got shape "
                             f"{tuple(u.shape)}")
        h = u.movedim(1, -1) if self.layout == "channels_first" else u
        h = h * self.scale + self.bias if self.family == "channel" else h @ self.weight.T + self.bias
        return h.movedim(-1, 1) if self.layout == "channels_first" else h

    def get_extra_state(self):
        return {"family": self.family, "layout": self.layout, "in_channels": self.in_channels,
                "out_channels": self.out_channels, "residual": self.residual}

    def set_extra_state(self, state):
        for key in ("family", "layout", "in_channels", "out_channels"):
            if state[key] != getattr(self, key):
                raise ValueError(f"state_dict is for {key}={state[key]!r}, this key has "
                                 f"{getattr(self, key)!r}")
        self.residual = state["residual"]

    @classmethod
    def from_state_dict(cls, state_dict) -> TransportKey:
        """Rebuild a key saved with ``torch.save(key.state_dict(), path)``."""
        extra = state_dict["_extra_state"]
        key = cls(extra["family"], extra["in_channels"], extra["out_channels"], extra["layout"])
        key.load_state_dict(state_dict)
        return key

    def extra_repr(self) -> str:
        return (f"family={self.family}, in_channels={self.in_channels}, "
                f"out_channels={self.out_channels}, layout={self.layout}, residual={self.residual:.3g}")


def fit_transport_key(u: torch.Tensor, v: torch.Tensor, family: str = "channel", *,
                      ridge: float = 1e-4, layout: str | None = None) -> TransportKey:
    """Fit ``T`` with ``T(u_i) ≈ v_i`` in closed form (module docstring for the formulas).

    Args:
        u: updated model's activations at the stage, ``(N, C)``, ``(N, T, C)`` or ``(N, C, H, W)``.
        v: the checkpoint's activations for the same anchors, same shape except the channel count
            (which may differ only for ``cross_channel``).
        family: ``"identity"``, ``"channel"``, ``"cross_channel"`` or ``"procrustes"``.
        ridge: relative ridge ``λ / (tr(ŨᵀŨ)/C)``, ≥ 0. With ``ridge=0`` the matrix fit is the
            pseudo-inverse one and needs more samples than channels.
        layout: ``"flat"``, ``"tokens"`` or ``"channels_first"``; inferred from ``u.dim()`` (2, 3, 4)
            when None.

    Returns:
        a :class:`TransportKey` (same dtype and device as ``u``) with ``residual`` set.

    Example:
        >>> v = torch.randn(20, 3, 4, 4)
        >>> u = 2.0 * v + 1.0                      # per-channel drift
        >>> key = fit_transport_key(u, v, "channel", ridge=0.0)
        >>> torch.allclose(key(u), v, atol=1e-5), key.num_parameters
        (True, 6)
    """
    check_choice("family", family, FAMILIES)
    check_positive("ridge", ridge, allow_zero=True)
    for name, a in (("u", u), ("v", v)):
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(a).__name__}")
        if a.dim() == 0 or a.shape[0] == 0:
            raise ValueError(f"{name} is empty: at least one anchor is needed")
    layout = _infer_layout(u) if layout is None else layout
    check_choice("layout", layout, LAYOUTS)
    dim = _channel_dim(layout)
    other_u = [s for i, s in enumerate(u.shape) if i != dim % u.dim()]
    other_v = [s for i, s in enumerate(v.shape) if i != dim % v.dim()]
    if u.dim() != v.dim() or other_u != other_v:
        raise ValueError(f"u {tuple(u.shape)} and v {tuple(v.shape)} must pair the same anchors "
                         f"(and positions/tokens); only the channel dim {dim} may differ")
    c_in, c_out = u.shape[dim], v.shape[dim]
    if family != "cross_channel" and c_in != c_out:
        raise ValueError(f"family={family!r} needs as many channels in u as in v, got {c_in} and "
                         f"{c_out}; use family='cross_channel'")
    key = TransportKey(family, c_in, c_out, layout).to(device=u.device, dtype=u.dtype)
    U = _as_samples(u.detach(), layout).double()
    V = _as_samples(v.detach(), layout).double()
    m = U.shape[0]
    if family in ("channel", "cross_channel", "procrustes") and ridge == 0 and m <= c_in:
        raise ValueError(f"{m} samples for {c_in} channels: a ridge-free fit needs more samples than "
                         "channels; pass ridge > 0 or more anchors")
    mu_u, mu_v = U.mean(0), V.mean(0)
    Uc, Vc = U - mu_u, V - mu_v
    lam = ridge * float((Uc * Uc).sum()) / c_in
    with torch.no_grad():
        if family == "channel":
            denom = (Uc * Uc).sum(0) + lam
            scale = torch.where(denom > 0, (Uc * Vc).sum(0) / denom.clamp_min(1e-300),
                                torch.zeros_like(denom))
            key.scale.copy_(scale)
            key.bias.copy_(mu_v - scale * mu_u)
        elif family == "cross_channel":
            gram = Uc.T @ Uc
            if lam > 0:
                gram = gram + lam * torch.eye(c_in, dtype=gram.dtype)
                weight = torch.linalg.solve(gram, Uc.T @ Vc).T
            else:
                weight = (torch.linalg.pinv(gram) @ (Uc.T @ Vc)).T
            key.weight.copy_(weight)
            key.bias.copy_(mu_v - weight @ mu_u)
        elif family == "procrustes":
            left, _, right_t = torch.linalg.svd(Uc.T @ Vc)
            weight = (left @ right_t).T
            key.weight.copy_(weight)
            key.bias.copy_(mu_v - weight @ mu_u)
        fitted = _as_samples(key.double()(_from_samples(U, u, layout)), layout)
        key.to(u.dtype)
        total = float((Vc * Vc).sum())
        err = float(((V - fitted) ** 2).sum())
        key.residual = err / total if total > 0 else (0.0 if err == 0 else math.inf)
    return key


def _from_samples(samples: torch.Tensor, like: torch.Tensor, layout: str) -> torch.Tensor:
    """Inverse of :func:`_as_samples` for a tensor shaped like ``like``."""
    if layout == "channels_first":
        shape = (like.shape[0], *like.shape[2:], samples.shape[-1])
        return samples.reshape(shape).movedim(-1, 1)
    return samples.reshape(*like.shape[:-1], samples.shape[-1])


# ------------------------------------------------------------------------------------------------
# stitching


class _StopForward(Exception):
    pass


def _module(model: nn.Module, stage: str) -> nn.Module:
    modules = dict(model.named_modules())
    if stage == "" or stage not in modules:
        names = [n for n in modules if n][:25]
        raise ValueError(f"stage={stage!r} names no submodule of {type(model).__name__}; "
                         f"submodules are {names}{' ...' if len(modules) > 26 else ''}")
    return modules[stage]


def stage_activations(model: nn.Module, stage: str, x: torch.Tensor, task_labels=None) -> torch.Tensor:
    """``f_{≤stage}(x)``: the output of submodule ``stage`` when ``model`` runs on ``x`` (the rest of
    the forward pass is skipped). Runs in the model's current train/eval mode.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> stage_activations(net, "1", torch.randn(5, 4)).shape
        torch.Size([5, 8])
    """
    captured = []

    def hook(module, inputs, output):
        captured.append(output)
        raise _StopForward

    handle = _module(model, stage).register_forward_hook(hook)
    try:
        model_forward(model, x, task_labels)
    except _StopForward:
        pass
    finally:
        handle.remove()
    if not captured:
        raise ValueError(f"stage={stage!r} was not run by the forward pass")
    if not isinstance(captured[0], torch.Tensor):
        raise ValueError(f"stage={stage!r} outputs {type(captured[0]).__name__}, not a tensor")
    return captured[0]


class StitchedModel(nn.Module):
    """``late(key(early_{≤stage}(x)))``: the forward pass of ``late_model`` with the output of its
    submodule ``stage`` replaced by ``key`` applied to ``early_model``'s output at ``stage``.

    Works for any architecture where ``stage`` is a submodule whose output is the only thing
    the rest of the forward pass reads (a chain cut point: a ``nn.Sequential`` item, a ResNet
    stage, a Transformer block). Multi-task (multi-head) models take ``task_labels`` and use the
    *late* model's head.

    Cost: when the late model's forward is a chain (:func:`~avalanche_plugins.core.layers.split_model`
    can cut it at ``stage``), only its part after ``stage`` runs, so a stitched forward costs one
    forward pass. Otherwise (multi-task models, non-chain forwards) the late model runs whole
    with its ``stage`` output replaced by a hook, and its modules before ``stage`` run for
    nothing: at most two forward passes. Wrap a multi-head model's trunk and one head in an
    ``nn.Sequential`` to get the fast path.
    """

    def __init__(self, early_model: nn.Module, late_model: nn.Module, stage: str, key: nn.Module):
        super().__init__()
        _module(early_model, stage)
        _module(late_model, stage)
        self.early_model, self.late_model, self.stage, self.key = early_model, late_model, stage, key
        self._late_part: nn.Module | None = None  # the late model after `stage`, when it is a chain
        self._chain_checked = False

    def forward(self, x: torch.Tensor, task_labels=None) -> torch.Tensor:
        u = stage_activations(self.early_model, self.stage, x, task_labels)
        return self.forward_from_stage(self.key(u), x, task_labels)

    def forward_from_stage(self, h: torch.Tensor, x: torch.Tensor, task_labels=None) -> torch.Tensor:
        """The late model's output with its ``stage`` output replaced by ``h``."""
        if not self._chain_checked and not is_multitask(self.late_model):
            self._chain_checked = True
            try:
                self._late_part = split_model(self.late_model, self.stage, x[:2])[1]
            except (ValueError, TypeError):
                self._late_part = None  # not a chain at this stage: use the hook below
        if self._late_part is not None:
            return self._late_part(h)

        def replace(module, inputs, output):
            if output.shape != h.shape:
                raise ValueError(f"the key outputs shape {tuple(h.shape)} but the late model's "
                                 f"stage {self.stage!r} outputs {tuple(output.shape)}")
            return h

        handle = _module(self.late_model, self.stage).register_forward_hook(replace)
        try:
            return model_forward(self.late_model, x, task_labels)
        finally:
            handle.remove()


def stitch(early_model: nn.Module, late_model: nn.Module, stage: str, key: nn.Module) -> StitchedModel:
    """``late_model``'s layers after ``stage`` (and its head) fed by ``key(early_model_{≤stage}(x))``.

    Example:
        >>> torch.manual_seed(0) is not None
        True
        >>> a = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> b = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> x = torch.randn(5, 4)
        >>> key = fit_transport_key(stage_activations(b, "1", x), stage_activations(a, "1", x), "identity")
        >>> torch.allclose(stitch(b, a, "1", key)(x), a[2](b[1](b[0](x))))
        True
    """
    return StitchedModel(early_model, late_model, stage, key)


@torch.no_grad()
def stitched_accuracy(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, task_labels=None,
                      batch_size: int = 512) -> float:
    """Top-1 accuracy of ``model`` (plain, multi-task or :class:`StitchedModel`) in eval mode."""
    if inputs.shape[0] == 0:
        raise ValueError("inputs is empty")
    correct = 0
    with eval_mode(model):
        for start in range(0, inputs.shape[0], batch_size):
            sl = slice(start, start + batch_size)
            t = task_labels[sl] if isinstance(task_labels, torch.Tensor) else task_labels
            out = model(inputs[sl], t) if isinstance(model, StitchedModel) else model_forward(model, inputs[sl], t)
            correct += int((out.argmax(-1) == targets[sl]).sum())
    return correct / inputs.shape[0]


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
            cotangents = torch.eye(n_logits, dtype=z.dtype)[:, None, :].expand(n_logits, *z.shape)
            (dz_dh,) = torch.func.vmap(pullback)(cotangents)            # (K, N, *h.shape[1:])
            rows = torch.func.vmap(torch.func.vmap(row_gradient, in_dims=(None, None, 0)),
                                   in_dims=(None, 0, 1))(params, u, dz_dh)
            jac = torch.cat([r.detach().flatten(2) for r in rows], 2).flatten(0, 1).double()
            res = (target - z.detach()).flatten().double()
            dual = jac.shape[0] < jac.shape[1]
            gram = jac @ jac.T if dual else jac.T @ jac
            eye = torch.eye(gram.shape[0], dtype=gram.dtype)
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


# ------------------------------------------------------------------------------------------------
# controls and recovery


class _PermutedChannels(nn.Module):
    def __init__(self, key: TransportKey, permutation: torch.Tensor):
        super().__init__()
        self.key = key
        self.register_buffer("permutation", permutation)

    def forward(self, u):
        return self.key(u.index_select(_channel_dim(self.key.layout) % u.dim(), self.permutation))


def channel_permutation(key: TransportKey, seed: int = 0) -> nn.Module:
    """Control: ``key`` applied to activations whose channels are randomly permuted (seeded).
    If channel identity matters, this should lose what the key recovered.

    Example:
        >>> key = TransportKey("channel", 4)
        >>> channel_permutation(key, seed=0)(torch.arange(4.0).reshape(1, 4)).sort().values
        tensor([[0., 1., 2., 3.]])
    """
    if key.in_channels < 2:
        raise ValueError("channel_permutation needs at least 2 channels")
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(key.in_channels, generator=g)
    while bool((perm == torch.arange(key.in_channels)).all()):
        perm = torch.randperm(key.in_channels, generator=g)
    device = next(key.parameters()).device if key.num_parameters else None
    return _PermutedChannels(key, perm.to(device))


def correspondence_break(u: torch.Tensor, v: torch.Tensor, family: str = "channel", *,
                         mode: str = "global", labels: torch.Tensor | None = None, seed: int = 0,
                         ridge: float = 1e-4) -> TransportKey:
    """Control: a key fitted on mispaired anchors (``u_i`` with ``v_π(i)``).

    ``mode="global"`` shuffles across all anchors; ``"within_class"`` only among anchors of the
    same class (``labels`` needed), which keeps class-level statistics but breaks instance pairing.

    Example:
        >>> v = torch.randn(40, 3)
        >>> key = correspondence_break(v, v, "cross_channel", seed=0)
        >>> key.residual > 0.5
        True
    """
    check_choice("mode", mode, ("global", "within_class"))
    n = u.shape[0]
    g = torch.Generator().manual_seed(seed)
    if mode == "global":
        perm = torch.randperm(n, generator=g)
    else:
        if labels is None or labels.shape[0] != n:
            raise ValueError("mode='within_class' needs labels with one entry per anchor")
        perm = torch.arange(n)
        for c in labels.unique():
            idx = (labels == c).nonzero().flatten()
            perm[idx] = idx[torch.randperm(len(idx), generator=g)]
    return fit_transport_key(u, v[perm.to(v.device)], family, ridge=ridge)


@dataclass(frozen=True)
class Recovery:
    """``(acc_key − acc_AB) / (acc_A − acc_AB)``; NaN with ``reason`` when it is undefined."""

    value: float
    reason: str | None = None

    def __float__(self) -> float:
        return self.value


def recovery(acc_key: float, acc_updated: float, acc_checkpoint: float, *,
             min_forgetting: float = 1e-6) -> Recovery:
    """Fraction of the forgotten accuracy that the key brings back:
    ``(acc_key − acc_AB) / (acc_A − acc_AB)`` (1 = all of it, 0 = none, < 0 = worse than θ_AB).

    Undefined (``value`` NaN, ``reason`` set) when ``acc_A − acc_AB < min_forgetting``.

    Example:
        >>> round(recovery(0.8, 0.5, 0.9).value, 6)
        0.75
        >>> recovery(0.8, 0.9, 0.9).reason
        'nothing was forgotten: acc_checkpoint - acc_updated = 0 < 1e-06'
    """
    for name, a in (("acc_key", acc_key), ("acc_updated", acc_updated), ("acc_checkpoint", acc_checkpoint)):
        if not isinstance(a, (int, float)) or not math.isfinite(a):
            raise ValueError(f"{name} must be a finite number, got {a!r}")
    forgotten = acc_checkpoint - acc_updated
    if forgotten < min_forgetting:
        return Recovery(math.nan, f"nothing was forgotten: acc_checkpoint - acc_updated = "
                                  f"{forgotten:.3g} < {min_forgetting:g}")
    return Recovery((acc_key - acc_updated) / forgotten)
