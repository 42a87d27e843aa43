"""How a loss reduces over the samples of a batch: one reading for every estimator taking ``loss_fn``.

Estimators call ``loss_fn`` on chunks of the data (a memory knob) or on one sample at a time
(per-sample gradients) and put the pieces back together, which needs to know how ``loss_fn``
reduces over the samples of a batch. With ``ℓ_i = loss_fn(sample i alone)`` (a batch of one; for
outputs with extra dimensions, e.g. ``(N, C, d)`` logits, the loss's own mean or sum over them):

* ``"mean"``: ``loss_fn(batch of n) = (1/n) Σ_i ℓ_i``, so a chunk of ``n_b`` of the ``N`` samples
  counts with its share ``n_b / N`` (:func:`chunk_weight`) and ``L = (1/N) Σ_i ℓ_i``;
* ``"sum"``: ``loss_fn(batch) = Σ_i ℓ_i``, so every chunk counts with weight 1 and ``L = Σ_i ℓ_i``.

:func:`loss_reduction` reads it, before any heavy computation: from the ``reduction`` attribute of
torch's loss modules (or of any callable that declares one), otherwise by probing the callable on
two samples (its loss of both against the mean and the sum of its two single-sample losses). It
refuses, with a ``ValueError`` naming the estimator and the fix, ``reduction="none"`` (no scalar to
differentiate), a callable that is neither a mean nor a sum of its per-sample losses, and a
class-index loss whose ``"mean"`` is not a mean over samples (class ``weight`` or ignored targets
make the denominator depend on the batch's labels).

Two conventions, one per family of estimators (each docstring says which it returns):

* **Curvature estimators** (``layer_adaptive``: the exact Hessian blocks, the Fisher blocks, the
  empirical and expected Fisher diagonals) return the curvature of the loss as ``loss_fn`` defines it
  on all ``N`` samples, ``L = loss_fn(f(X), Y)``: the mean-loss curvature for ``"mean"``, the
  sum-loss curvature (``N`` times the mean's for the same ``ℓ_i``) for ``"sum"`` — as curvlinops
  does — whatever the chunking.
* **Readiness and ADS** (``readiness``, ``ads``) are defined, and OR's bound is proved, for the
  per-sample mean loss ``L = (1/N) Σ_i ℓ_i`` and minibatch-mean gradients; they measure that
  whatever the reduction (:func:`mean_loss` divides a sum-reduced batch loss by its sample count),
  so a sum-reduced loss gives the mean-reduced numbers whenever the ``ℓ_i`` agree (outputs without
  extra dimensions), and nothing scales with the number of samples measured.
"""

from __future__ import annotations

import torch
from torch import nn

from avalanche_plugins.core.calls import chunk_weight, eval_mode, model_forward
from avalanche_plugins.core.checks import check_finite_loss

__all__ = ["REDUCTIONS", "loss_reduction", "check_reduced", "chunk_weight", "sample_scale", "mean_loss",
           "MeanOfSum"]

REDUCTIONS = ("mean", "sum")
PROBE_RTOL = 0.05  # the probe's pair loss must lie within 5 % (of the mean) of the mean or of the sum

_ALIASES = {"mean": "mean", "sum": "sum", "batchmean": "mean"}  # KLDivLoss's batchmean: sum / batch size
_CLASS_INDEX = (nn.CrossEntropyLoss, nn.NLLLoss)


def _name(loss_fn) -> str:
    return getattr(loss_fn, "__name__", None) or type(loss_fn).__name__


def loss_reduction(loss_fn, component: str, *, model: nn.Module | None = None, inputs: torch.Tensor | None = None,
                   targets: torch.Tensor | None = None, task_labels=None, decomposable: bool = True) -> str:
    """``"mean"`` or ``"sum"``: how ``loss_fn`` reduces over the samples of a batch (module docstring).

    Rules, in order:

    1. a ``reduction`` attribute (torch's loss modules; any callable may declare one) is taken as
       it is: ``"mean"`` (and ``KLDivLoss``'s ``"batchmean"``, a mean over samples) or ``"sum"``;
       ``"none"`` and other values are refused. ``CrossEntropyLoss``/``NLLLoss`` with
       ``"mean"`` are refused when they have class weights or ``targets`` holds their
       ``ignore_index`` (the mean's denominator is then the batch's summed weights), unless
       ``decomposable=False`` (a caller that never recombines loss values, only scales by ``c``).
    2. otherwise ``loss_fn`` is probed on the first two samples (three forward passes of ``model``
       in eval mode, no gradients): with ``a``, ``b`` its losses of each sample alone and ``s`` of
       both, ``s ≈ (a + b)/2`` reads ``"mean"`` and ``s ≈ a + b`` ``"sum"`` (within
       :data:`PROBE_RTOL` of ``|a + b|/2``); a non-scalar ``s``, neither, or ``a + b = 0`` (nothing
       to tell them apart, e.g. a model fitting the probe samples) is refused. With one sample the
       two coincide: ``"mean"``.

    Args:
        loss_fn: the estimator's loss. component: the estimator's name, for the error.
        model, inputs, targets, task_labels: the estimator's data, for the probe (and the ignored
            targets of rule 1).
        decomposable: whether the caller needs the batch loss to be the mean or sum of its
            per-sample losses (rule 1's class weights and ignored targets).

    Raises:
        ValueError: naming ``component``, the reason and the fix.

    Example:
        >>> loss_reduction(nn.MSELoss(reduction="sum"), "doc")
        'sum'
        >>> net = nn.Linear(2, 3)
        >>> loss_reduction(torch.nn.functional.cross_entropy, "doc", model=net, inputs=torch.randn(4, 2),
        ...                targets=torch.tensor([0, 1, 2, 0]))
        'mean'
        >>> loss_reduction(nn.CrossEntropyLoss(reduction="none"), "doc")
        Traceback (most recent call last):
        ...
        ValueError: doc: loss_fn CrossEntropyLoss has reduction='none' (one loss per sample), but doc needs one scalar loss per batch: use CrossEntropyLoss(reduction='mean') or reduction='sum'
    """
    declared = getattr(loss_fn, "reduction", None)
    if declared is not None:
        return _declared(loss_fn, declared, component, targets if decomposable else None,
                         weights=decomposable)
    if model is None or inputs is None or targets is None:
        raise ValueError(f"{component}: loss_fn {_name(loss_fn)} has no reduction attribute and there are no samples "
                         "to probe it on; give it one (loss_fn.reduction = 'mean' or 'sum')")
    return _probe(loss_fn, component, model, inputs, targets, task_labels)


def _unreduced(loss_fn, component: str) -> ValueError:
    return ValueError(f"{component}: loss_fn {_name(loss_fn)} has reduction='none' (one loss per sample), but "
                      f"{component} needs one scalar loss per batch: use {_name(loss_fn)}(reduction='mean') or "
                      "reduction='sum'")


def _not_scalar(loss_fn, component: str, value, n: int) -> ValueError:
    shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
    return ValueError(f"{component}: loss_fn {_name(loss_fn)} returns {shape} on {n} samples, not one scalar "
                      "(per-sample losses, as reduction='none'); reduce them to their mean or sum, e.g. "
                      "reduction='mean'")


def check_reduced(loss_fn, component: str, value=None, n: int | None = None) -> None:
    """``ValueError`` when ``loss_fn`` declares ``reduction='none'`` or its ``value`` on ``n``
    samples is not one scalar: for estimators that take any scalar batch loss as it is (the
    batched Fisher, Avalanche's convention), and need no reading of its reduction.

    >>> check_reduced(nn.MSELoss(reduction="none"), "doc")
    Traceback (most recent call last):
    ...
    ValueError: doc: loss_fn MSELoss has reduction='none' (one loss per sample), but doc needs one scalar loss per batch: use MSELoss(reduction='mean') or reduction='sum'
    """
    if getattr(loss_fn, "reduction", None) == "none":
        raise _unreduced(loss_fn, component)
    if value is not None and (not isinstance(value, torch.Tensor) or value.numel() != 1):
        raise _not_scalar(loss_fn, component, value, n)


def _declared(loss_fn, declared, component: str, targets, *, weights: bool) -> str:
    """Rule 1 of :func:`loss_reduction`."""
    if declared == "none":
        raise _unreduced(loss_fn, component)
    if declared not in _ALIASES:
        raise ValueError(f"{component}: loss_fn {_name(loss_fn)} has reduction={declared!r}; {component} reads "
                         f"'mean' or 'sum' (how the batch loss combines its per-sample losses): use one of them")
    reduction = _ALIASES[declared]
    if reduction == "mean" and weights and isinstance(loss_fn, _CLASS_INDEX):
        ignore = getattr(loss_fn, "ignore_index", None)
        ignored = isinstance(targets, torch.Tensor) and not targets.is_floating_point() and ignore is not None \
            and bool((targets == ignore).any())
        if loss_fn.weight is not None or ignored:
            why = "class weights" if loss_fn.weight is not None else f"targets equal to ignore_index={ignore}"
            raise ValueError(f"{component}: loss_fn {_name(loss_fn)} with reduction='mean' and {why} divides by the "
                             "batch's summed weights, not its number of samples, so chunks and single samples "
                             f"cannot be recombined into it; use reduction='sum' (each sample's loss weighted, "
                             f"summed) or drop the {'weights' if loss_fn.weight is not None else 'ignored targets'}")
    return reduction


def _probe(loss_fn, component: str, model, inputs, targets, task_labels) -> str:
    """Rule 2 of :func:`loss_reduction`."""
    if inputs.shape[0] < 2:
        return "mean"  # one sample: mean and sum coincide
    labels = None if task_labels is None else torch.as_tensor(task_labels).reshape(-1)[:2]

    def loss(rows: slice) -> torch.Tensor:
        return loss_fn(model_forward(model, inputs[rows], None if labels is None else labels[rows]), targets[rows])

    with eval_mode(model), torch.no_grad():
        pair = loss(slice(0, 2))
        check_reduced(loss_fn, component, pair, 2)
        a, b = (float(loss(slice(i, i + 1)).double()) for i in (0, 1))
    check_finite_loss(pair, f"while {component} probes how loss_fn reduces over samples")
    s, mean = float(pair.double()), (a + b) / 2
    tolerance = PROBE_RTOL * abs(mean)
    is_mean, is_sum = abs(s - mean) <= tolerance, abs(s - 2 * mean) <= tolerance
    if is_mean != is_sum:
        return "mean" if is_mean else "sum"
    why = "both single-sample losses are 0 or cancel, so mean and sum agree" if mean == 0 else \
        f"on two samples it gives {s:.6g} against per-sample losses {a:.6g} and {b:.6g} (mean {mean:.6g}, sum {a + b:.6g})"
    raise ValueError(f"{component}: cannot tell how loss_fn {_name(loss_fn)} reduces over the samples of a batch: "
                     f"{why}; use a loss whose batch value is the mean or the sum of its per-sample values and "
                     "say which with a reduction attribute (loss_fn.reduction = 'mean' or 'sum'), or a torch loss module")


def sample_scale(reduction: str, n_total: int) -> float:
    """``c`` of ``L = c Σ_i ℓ_i`` over ``n_total`` samples: ``1/N`` for ``"mean"``, 1 for ``"sum"``.

    >>> sample_scale("mean", 4), sample_scale("sum", 4)
    (0.25, 1.0)
    """
    return 1.0 / n_total if reduction == "mean" else 1.0


class MeanOfSum:
    """A sum-reduced loss divided by the batch's sample count: the per-sample mean of the same
    per-sample losses (picklable; ``base_loss`` is the wrapped loss, for shape checks)."""

    reduction = "mean"

    def __init__(self, base_loss):
        self.base_loss = base_loss

    def __call__(self, outputs, targets):
        return self.base_loss(outputs, targets) / targets.shape[0]

    def __repr__(self) -> str:
        return f"MeanOfSum({self.base_loss!r})"


def mean_loss(loss_fn, component: str, **probe):
    """``loss_fn`` as a per-sample mean loss (the readiness/ADS convention): unchanged when it is
    mean-reduced, :class:`MeanOfSum` of it when sum-reduced (:func:`loss_reduction` reads which,
    with ``probe`` its ``model``/``inputs``/``targets``/``task_labels``, and refuses the rest).

    >>> x, y = torch.zeros(4, 1), torch.ones(4, 1)
    >>> float(mean_loss(nn.MSELoss(reduction="sum"), "doc")(x, y))
    1.0
    """
    if loss_reduction(loss_fn, component, **probe) == "mean":
        return loss_fn
    return MeanOfSum(loss_fn)
