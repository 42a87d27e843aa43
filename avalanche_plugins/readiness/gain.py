"""The ground truth of plasticity: the relative k-step loss decrease ``G^(k)``, measured by many
vectorised SGD / Adam runs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import grad, vmap

from avalanche_plugins.core.calls import (
    batch_loss,
    check_task_labels,
    eval_mode,
    iterate_batches,
    split_params,
)
from avalanche_plugins.core.checks import (
    check_choice,
    check_finite_loss,
    check_inputs,
    check_int,
    check_no_recurrent,
    check_positive,
)
from avalanche_plugins.core.optim import OPTIMIZERS, AdamState, functional_step
from avalanche_plugins.core.reductions import mean_loss
from avalanche_plugins.readiness._common import (
    _draw_batches,
)

__all__ = ["OPTIMIZERS", "GainResult", "k_step_gain"]





@dataclass(frozen=True)
class GainResult:
    """Output of :func:`k_step_gain`.

    Attributes:
        gain: ``G^(k)``, the mean over runs of ``(L(θ) − L(θ_k)) / L(θ)``.
        stderr: standard error of ``gain`` (std over runs / √n_runs; NaN when ``n_runs = 1``).
        loss_before: ``L(θ)`` on the validation set.
        loss_after_mean: mean over runs of ``L(θ_k)``.
        k: number of optimizer steps per run.
        n_runs: number of independent runs.
        losses_after: ``(n_runs,)`` float64 tensor of ``L(θ_k)`` per run.
        indices: ``(n_runs, k, batch_size)`` training-sample indices used by every step of every run.
    """

    gain: float
    stderr: float
    loss_before: float
    loss_after_mean: float
    k: int
    n_runs: int
    losses_after: torch.Tensor = field(default=None, repr=False, compare=False)
    indices: torch.Tensor = field(default=None, repr=False, compare=False)


def k_step_gain(model: nn.Module, loss_fn, train_inputs: torch.Tensor, train_targets: torch.Tensor,
                val_inputs: torch.Tensor, val_targets: torch.Tensor, *, k: int, lr: float,
                optimizer: str = "sgd", batch_size: int, n_runs: int = 128, seed: int = 0,
                betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                indices: torch.Tensor | None = None, task_labels: torch.Tensor | None = None,
                chunk_size: int = 1024, adam_state: dict | None = None) -> GainResult:
    """Ground-truth plasticity: the expected relative validation-loss decrease after ``k`` steps.

    .. math::

        G^{(k)} = \\frac{L(θ) - \\mathbb{E}\\, L(θ_k)}{L(θ)}, \\qquad
        \\mathrm{s.e.} = \\frac{\\operatorname{std}_r G_r}{\\sqrt{n_\\text{runs}}}

    ``L`` is the mean loss on ``(val_inputs, val_targets)``; ``θ_k`` results from ``k`` steps of
    minibatch SGD (``θ ← θ − η ĝ``, ``ĝ`` the gradient of the minibatch's mean loss; with a
    sum-reduced ``loss_fn`` both are of the per-sample mean, see :func:`optimization_readiness`) or Adam (fresh state, bias-corrected, like ``torch.optim.Adam``
    with ``betas``/``eps`` and no weight decay) on minibatches of ``batch_size`` distinct training
    samples drawn uniformly (seeded ``torch.Generator``; a fresh draw for every step and run). The
    ``n_runs`` runs are vectorised: the parameters are stacked ``n_runs`` times and one ``vmap``-ed
    ``grad`` of the ``functional_call`` loss updates all of them per step; the model is not changed.
    The train and validation tensors are explicit (not a sampler), so runs are reproducible and
    ``indices`` (shape ``(n_runs, k, batch_size)``) can replay the exact minibatches of a reference.
    Training steps use eval mode too (no dropout, BatchNorm on running statistics), so the steps
    are deterministic given the indices. A diverging run (too large ``lr``) gives a non-finite
    ``L(θ_k)`` and hence a non-finite gain; no error is raised for it.

    Args:
        model, loss_fn: as in :func:`optimization_readiness`.
        train_inputs, train_targets: the samples the optimizer steps on.
        val_inputs, val_targets: the samples ``L`` is measured on (may be the same tensors).
        k: steps per run. lr: step size ``η``. optimizer: ``"sgd"`` or ``"adam"``.
        batch_size: minibatch size (1 to the number of training samples).
        n_runs: independent runs. seed: seed of the index generator.
        indices: optional precomputed minibatch indices (overrides ``seed``).
        task_labels: for multi-task models, the task labels of the training samples (one entry per
            sample, all equal: the runs train one task head; the validation samples share it).
            None: task 0.
        chunk_size: validation samples per vectorised evaluation.
        adam_state: Adam *continuing* from a checkpoint: a ``torch.optim.Adam`` ``state_dict``
            (entries in the order of the trainable ``model.parameters()``); every run starts from
            its moments and step ``t₀``, so step ``t`` uses bias corrections ``1 − β^(t₀+t)``.
            ``betas``/``eps`` are then read from it; parameter groups that differ in them, or
            entries at different steps, are refused (one Adam setting serves every run).

    Example:
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> net = nn.Linear(3, 1)
        >>> x, y = torch.randn(32, 3), torch.randn(32, 1)
        >>> res = k_step_gain(net, nn.MSELoss(), x, y, x, y, k=5, lr=0.05, batch_size=4, n_runs=16)
        >>> res.gain > 0, res.indices.shape
        (True, torch.Size([16, 5, 4]))
    """
    task_label = _check_gain_arguments(model, train_inputs, train_targets, val_inputs, val_targets,
                                       k=k, lr=lr, optimizer=optimizer, batch_size=batch_size,
                                       n_runs=n_runs, seed=seed, chunk_size=chunk_size,
                                       task_labels=task_labels, adam_state=adam_state)
    loss_fn = mean_loss(loss_fn, "k_step_gain", model=model, inputs=train_inputs, targets=train_targets,
                        task_labels=task_labels)
    n_train = train_inputs.shape[0]
    indices = _run_indices(indices, n_train, n_runs=n_runs, k=k, batch_size=batch_size, seed=seed)
    params, consts = split_params(model)
    run_loss = batch_loss(model, loss_fn, consts, task_label)
    with eval_mode(model), torch.no_grad():
        loss_before = _loss_before(run_loss, params, val_inputs, val_targets, chunk_size)
        stacked = _stack_runs(params, n_runs)
        state = _run_optimizer_state(stacked, list(params), optimizer, betas, eps, adam_state)
        _simulate_steps(run_loss, stacked, state, train_inputs, train_targets, indices, lr=lr,
                        optimizer=optimizer)
        losses_after = _validation_loss(run_loss, stacked, val_inputs, val_targets, chunk_size,
                                        batched=True).cpu()
    return _gain_result(loss_before, losses_after, k=k, n_runs=n_runs, indices=indices)


def _check_gain_arguments(model, train_inputs, train_targets, val_inputs, val_targets, *, k, lr,
                          optimizer, batch_size, n_runs, seed, chunk_size, task_labels,
                          adam_state) -> int | None:
    """The entry checks of :func:`k_step_gain` (``ValueError`` / ``TypeError`` naming the argument);
    returns the one task label of ``task_labels`` (None: task 0)."""
    check_no_recurrent(model, "k_step_gain")
    check_inputs(train_inputs, train_targets, name="train_inputs")
    check_inputs(val_inputs, val_targets, name="val_inputs")
    check_int("k", k)
    check_positive("lr", lr)
    check_choice("optimizer", optimizer, OPTIMIZERS)
    check_int("batch_size", batch_size)
    n_train = train_inputs.shape[0]
    if batch_size > n_train:
        raise ValueError(f"batch_size={batch_size} is larger than the number of training samples ({n_train})")
    check_int("n_runs", n_runs)
    check_int("seed", seed, minimum=0)
    check_int("chunk_size", chunk_size)
    task_label = _single_task(task_labels, n_train)
    if adam_state is not None and optimizer != "adam":
        raise ValueError("adam_state is only used with optimizer='adam'")
    return task_label


def _run_indices(indices, n_train: int, *, n_runs: int, k: int, batch_size: int, seed: int
                 ) -> torch.Tensor:
    """The ``(n_runs, k, batch_size)`` minibatch indices of every step of every run: drawn from a
    ``torch.Generator`` seeded with ``seed`` (uniform subsets, fresh per step and run), or the given
    ``indices`` checked (shape, integer dtype, range) and cast to ``long``."""
    if indices is None:
        generator = torch.Generator().manual_seed(seed)
        return _draw_batches(n_train, batch_size, n_runs * k, generator).reshape(n_runs, k, batch_size)
    if not isinstance(indices, torch.Tensor) or tuple(indices.shape) != (n_runs, k, batch_size):
        raise ValueError(f"indices must be a tensor of shape (n_runs, k, batch_size) = "
                         f"{(n_runs, k, batch_size)}, got {getattr(indices, 'shape', indices)}")
    if indices.dtype not in (torch.int32, torch.int64) or bool((indices < 0).any()) \
            or bool((indices >= n_train).any()):
        raise ValueError(f"indices must be integer indices in [0, {n_train})")
    return indices.long()


def _validation_loss(run_loss, params: dict, inputs: torch.Tensor, targets: torch.Tensor,
                     chunk_size: int, *, batched: bool) -> torch.Tensor:
    """``L``: the mean loss (float64) over ``inputs`` in chunks of ``chunk_size`` samples, of one
    parameter dict (a scalar) or, ``batched``, of every run of a stacked one (shape ``(n_runs,)``,
    one ``vmap`` over the runs)."""
    loss_of = vmap(run_loss, in_dims=(0, None, None)) if batched else run_loss
    n = inputs.shape[0]
    total = 0.0
    for s in iterate_batches(n, chunk_size):
        total = total + loss_of(params, inputs[s], targets[s]).double() * (s.stop - s.start)
    return total / n


def _loss_before(run_loss, params: dict, inputs: torch.Tensor, targets: torch.Tensor,
                 chunk_size: int) -> float:
    """``L(θ)``, checked finite and positive (the relative gain divides by it)."""
    loss_before = float(_validation_loss(run_loss, params, inputs, targets, chunk_size, batched=False))
    check_finite_loss(torch.tensor(loss_before), "on the validation set before training")
    if not loss_before > 0:
        raise ValueError(f"loss is {loss_before:g} on the validation set: the relative gain "
                         "(L(θ) − L(θ_k)) / L(θ) is undefined at a zero loss")
    return loss_before


def _stack_runs(params: dict, n_runs: int) -> dict:
    """The parameters repeated along a new leading run dimension: ``{name: (n_runs, *shape)}``."""
    return {name: p.unsqueeze(0).repeat(n_runs, *[1] * p.dim()) for name, p in params.items()}


def _run_optimizer_state(stacked: dict, names: list[str], optimizer: str, betas, eps: float,
                         adam_state: dict | None) -> AdamState | None:
    """The runs' shared optimizer state: None for SGD; for Adam fresh moments, or those (and step,
    betas, eps) of ``adam_state`` broadcast to every run."""
    if optimizer != "adam":
        return None
    state = AdamState(stacked, betas=betas, eps=eps)
    if adam_state is not None:
        _load_adam_state(adam_state, names, state)
    return state


def _simulate_steps(run_loss, stacked: dict, state: AdamState | None, train_inputs: torch.Tensor,
                    train_targets: torch.Tensor, indices: torch.Tensor, *, lr: float,
                    optimizer: str) -> None:
    """The ``k`` optimizer steps of every run, in place on ``stacked``: step ``t`` takes run ``r``'s
    minibatch ``indices[r, t]``, one ``vmap``-ed ``grad`` gives every run's gradient at once and
    one :func:`functional_step` moves all of them (the loop is over steps, never over runs)."""
    step_grads = vmap(grad(run_loss), in_dims=(0, 0, 0))
    device_indices = indices.to(train_inputs.device)
    for t in range(indices.shape[1]):
        index = device_indices[:, t]
        grads = step_grads(stacked, train_inputs[index], train_targets[index])
        functional_step(stacked, grads, lr, optimizer=optimizer, state=state)


def _gain_result(loss_before: float, losses_after: torch.Tensor, *, k: int, n_runs: int,
                 indices: torch.Tensor) -> GainResult:
    """``G^(k)`` and its standard error from ``L(θ)`` and the runs' ``L(θ_k)``."""
    relative = (loss_before - losses_after) / loss_before
    stderr = float(relative.std() / math.sqrt(n_runs)) if n_runs > 1 else float("nan")
    return GainResult(
        gain=float(relative.mean()),
        stderr=stderr,
        loss_before=loss_before,
        loss_after_mean=float(losses_after.mean()),
        k=k,
        n_runs=n_runs,
        losses_after=losses_after,
        indices=indices,
    )

def _single_task(task_labels, n: int) -> int | None:
    """The one task label of ``task_labels`` (None stays None); ``ValueError`` for mixed labels."""
    check_task_labels(task_labels, n)
    if task_labels is None:
        return None
    labels = torch.unique(task_labels)
    if labels.numel() != 1:
        raise ValueError(f"task_labels must hold a single task (the runs train one head), got labels "
                         f"{labels.tolist()}")
    return int(labels[0])


def _load_adam_state(adam_state: dict, names: list[str], state: AdamState) -> None:
    """Copy a ``torch.optim.Adam`` state_dict's moments, step, betas and eps into the stacked
    run state (in place)."""
    entries, group = adam_state["state"], adam_state["param_groups"][0]
    if len(entries) != len(names):
        raise ValueError(f"adam_state has {len(entries)} entries for {len(names)} trainable parameters")
    entries = [entries[i] for i in sorted(entries)]
    settings = {(tuple(g["betas"]), float(g["eps"])) for g in adam_state["param_groups"]}
    steps = {int(float(entry["step"])) for entry in entries}
    if len(settings) > 1 or len(steps) > 1:
        raise ValueError(f"adam_state: the runs continue one Adam, but its parameter groups use (betas, eps) "
                         f"{sorted(settings)} and its entries are at steps {sorted(steps)}; give a state whose "
                         "groups share betas and eps and whose parameters were all stepped together")
    for name, entry in zip(names, entries):
        state.first[name].copy_(entry["exp_avg"].expand_as(state.first[name]))
        state.second[name].copy_(entry["exp_avg_sq"].expand_as(state.second[name]))
    state.step = int(float(entries[0]["step"]))
    state.betas, state.eps = tuple(group["betas"]), float(group["eps"])
