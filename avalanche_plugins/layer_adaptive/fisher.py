"""Diagonal Fisher importance estimators for EWC-style penalties.

Three conventions exist in the literature and libraries, and their scales differ, so an EWC
``λ`` tuned with one does not transfer to another:

* ``batched`` — Avalanche 0.6 ``EWCPlugin``: squared gradients of the *minibatch-mean* loss,
  averaged over minibatches, ``F = (1/M) Σ_b (∇ L_b)²``. Depends on the batch size.
* ``empirical`` — per-sample squared gradients with the true labels,
  ``F = (1/N) Σ_i (∇ ℓ(x_i, y_i))²`` (Mammoth's oEWC without its p(y) weighting).
* ``expected`` — the true Fisher's diagonal: expectation over the model's own predictive
  distribution, ``F = (1/N) Σ_i Σ_c p(c|x_i) (∇ log p(c|x_i))²`` (van de Ven et al.;
  classification outputs only).

Per-sample gradients use ``torch.func.vmap(grad(...))`` in chunks. The model is evaluated in
eval mode and its mode restored; gradients are returned, never written to ``.grad``.

Reductions (:mod:`avalanche_plugins.core.reductions`): ``empirical`` and ``expected`` (through
:func:`fisher_diagonal`) are of the loss as ``loss_fn`` reduces it over the ``N`` samples,
``L = c Σ_i ℓ_i`` with ``c = 1/N`` for a mean-reduced loss (the formulas above) and ``c = 1`` for a
sum-reduced one (``N`` times larger), whatever the chunking; ``batched`` squares the gradient of
each minibatch's loss as ``loss_fn`` gives it (Avalanche's convention: a sum-reduced loss's
importances grow with the square of the batch size).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import grad, vmap

from avalanche_plugins.core.calls import (
    eval_mode,
    iterate_batches,
    model_forward,
    sample_loss,
    stateless_forward,
    task_batches,
)
from avalanche_plugins.core.checks import (
    check_choice,
    check_estimator_inputs,
    check_finite_loss,
    check_inputs,
    check_int,
    check_no_recurrent,
)
from avalanche_plugins.core.reductions import check_reduced, loss_reduction, sample_scale

__all__ = ["FISHER_KINDS", "batched_fisher", "empirical_fisher", "expected_fisher", "fisher_diagonal"]

FISHER_KINDS = ("batched", "empirical", "expected")


def batched_fisher(model: nn.Module, loss_fn, batches) -> dict[str, torch.Tensor]:
    """Avalanche 0.6 ``EWCPlugin`` importances: mean over minibatches of squared batch-mean gradients.

    .. math:: F = \\frac{1}{M} \\sum_{b=1}^{M} \\big(\\nabla_θ L_b(θ)\\big)^2

    Args:
        model: the model (evaluated in eval mode, as Avalanche does).
        loss_fn: the minibatch loss, any scalar (a sum-reduced one gives its own, larger,
            importances; ``reduction="none"`` is refused).
        batches: iterable of ``(x, y)`` or ``(x, y, ..., task_labels)`` minibatches; the last
            element is used as task labels for multi-task models, as in Avalanche.

    Returns:
        ``{name: tensor}`` for every parameter (zeros for frozen parameters and for those that get
        no gradient).

    Example:
        >>> net = nn.Linear(2, 2)
        >>> x, y = torch.randn(8, 2), torch.randint(0, 2, (8,))
        >>> imp = batched_fisher(net, nn.CrossEntropyLoss(), [(x[:4], y[:4]), (x[4:], y[4:])])
        >>> sorted(imp), imp["weight"].shape
        (['bias', 'weight'], torch.Size([2, 2]))
    """
    importances = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    # frozen parameters (requires_grad=False) get no gradient: zero importance, as in EWCPlugin
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"model {type(model).__name__} has no trainable parameters (requires_grad=True)")
    check_reduced(loss_fn, "batched_fisher")
    count = 0
    with eval_mode(model):
        for batch in batches:
            x, y = batch[0], batch[1]
            if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == 0:
                raise ValueError(f"batches holds an empty minibatch (batch {count}): every minibatch "
                                 "needs at least one sample")
            # labels in range and of an integer dtype, inputs matching the model's dtype and device
            check_estimator_inputs(model, x, y, loss_fn=loss_fn, task_labels=batch[-1] if len(batch) > 2 else None,
                                   name="inputs", targets_name="targets")
            loss = loss_fn(model_forward(model, x, batch[-1] if len(batch) > 2 else None), y)
            check_reduced(loss_fn, "batched_fisher", loss, x.shape[0])
            check_finite_loss(loss, "while estimating the Fisher")
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            for n, g in zip(names, grads):
                if g is not None:
                    importances[n] += g.detach().pow(2)
            count += 1
    if count == 0:
        raise ValueError("batches is empty: at least one minibatch is needed")
    return {n: imp / float(count) for n, imp in importances.items()}


def _per_sample_setup(model):
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    return params, buffers


def empirical_fisher(model: nn.Module, loss_fn, inputs: torch.Tensor, targets: torch.Tensor, *,
                     task_labels: torch.Tensor | None = None, chunk_size: int = 16) -> dict[str, torch.Tensor]:
    """Empirical Fisher: per-sample squared gradients with the true labels, of the loss as reduced.

    .. math:: F = c \\sum_{i=1}^{N} \\big(\\nabla_θ \\ell(f(x_i), y_i)\\big)^2, \\qquad
              c = \\tfrac1N \\ (\\text{mean-reduced } \\texttt{loss\\_fn}), \\ 1 \\ (\\text{sum-reduced})

    ``ℓ(f(x_i), y_i)`` is ``loss_fn`` applied to sample ``i`` alone (a batch of one), and ``c`` makes
    ``F`` the empirical Fisher of ``L = c Σ_i ℓ_i = loss_fn(f(X), Y)``, the loss of all samples as
    ``loss_fn`` reduces them (:mod:`avalanche_plugins.core.reductions`; a plain callable is probed
    on two samples, ``reduction="none"`` refused). ``chunk_size`` samples' gradients are held at
    once (memory ``chunk_size × P`` floats for ``P`` parameters, whatever the number of samples;
    the result does not depend on it).

    Example:
        >>> net = nn.Linear(3, 2)
        >>> x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
        >>> imp = empirical_fisher(net, nn.CrossEntropyLoss(), x, y)
        >>> bool((imp["weight"] >= 0).all())
        True
    """
    check_estimator_inputs(model, inputs, targets, loss_fn=loss_fn, task_labels=task_labels)
    check_no_recurrent(model, "empirical_fisher")
    check_inputs(inputs, targets)
    check_int("chunk_size", chunk_size)
    c = sample_scale(loss_reduction(loss_fn, "empirical_fisher", model=model, inputs=inputs, targets=targets,
                                    task_labels=task_labels), inputs.shape[0])
    params, buffers = _per_sample_setup(model)

    total = {k: torch.zeros_like(v) for k, v in params.items()}
    with eval_mode(model):
        # one int task label per vmapped call (multi-head models: Avalanche's single-task fast path)
        for label, xs, ys, _ in task_batches(model, inputs, targets, task_labels, chunk_size):
            grads = vmap(grad(sample_loss(model, loss_fn, buffers, label)), in_dims=(None, 0, 0))(params, xs, ys)
            for k, g in grads.items():
                check_finite_loss(g.sum(), "(gradient) while estimating the Fisher")
                total[k] += g.pow(2).sum(0)
    return {k: v * c for k, v in total.items()}


def expected_fisher(model: nn.Module, inputs: torch.Tensor, *, task_labels: torch.Tensor | None = None,
                    chunk_size: int = 16) -> dict[str, torch.Tensor]:
    """Diagonal of the true Fisher of a classifier: expectation over the predicted labels.

    .. math:: F = \\frac{1}{N} \\sum_{i} \\sum_{c} p_θ(c \\mid x_i) \\big(\\nabla_θ \\log p_θ(c \\mid x_i)\\big)^2

    The Fisher of the per-sample mean log-likelihood (no loss is involved);
    :func:`fisher_diagonal` scales it to the reduction of a given ``loss_fn`` (times ``N`` for a
    sum-reduced one: the Gauss–Newton diagonal of the summed cross-entropy).

    Computed exactly (no label sampling): per-sample, per-class gradients with a nested ``vmap``
    (the forward pass of a sample is shared by its classes). ``chunk_size`` bounds the
    (sample, class) gradients held at once: ``max(1, chunk_size // C)`` samples with all ``C``
    classes per pass, or one sample with ``chunk_size`` classes when ``C > chunk_size``; memory
    ``chunk_size × P`` floats whatever the number of samples and classes (the result does not
    depend on it).

    Example:
        >>> net = nn.Linear(3, 2)
        >>> imp = expected_fisher(net, torch.randn(5, 3))
        >>> imp["bias"].shape
        torch.Size([2])
    """
    check_estimator_inputs(model, inputs)
    check_no_recurrent(model, "expected_fisher")
    check_inputs(inputs)
    check_int("chunk_size", chunk_size)
    params, buffers = _per_sample_setup(model)

    total = {k: torch.zeros_like(v) for k, v in params.items()}
    n = inputs.shape[0]
    with eval_mode(model):
        for label, xs, _, _ in task_batches(model, inputs, task_labels=task_labels):

            def log_probs(p, x, label=label):
                return torch.log_softmax(stateless_forward(model, {**buffers, **p}, x.unsqueeze(0), label), dim=-1)[0]

            def class_log_prob(p, x, one_hot, log_probs=log_probs):
                return (log_probs(p, x) * one_hot).sum()  # indexing by a vmapped class is not supported

            with torch.no_grad():  # heads of different tasks may differ in width
                n_classes = model_forward(model, xs[:1], label).shape[-1]
            classes = torch.eye(n_classes, dtype=inputs.dtype, device=inputs.device)
            per_class = vmap(grad(class_log_prob), in_dims=(None, None, 0))
            per_pair = vmap(per_class, in_dims=(None, 0, None))
            for s in iterate_batches(xs.shape[0], max(1, chunk_size // n_classes)):
                x = xs[s]
                probs = vmap(log_probs, in_dims=(None, 0))(params, x).exp().detach()  # (B, C)
                for c in iterate_batches(n_classes, min(n_classes, chunk_size)):
                    grads = per_pair(params, x, classes[c])  # (B, |c|, *shape)
                    weights = probs[:, c]
                    for k, g in grads.items():
                        total[k] += (weights.view(*weights.shape, *[1] * (g.dim() - 2)) * g.pow(2)).sum((0, 1))
    return {k: v / n for k, v in total.items()}


def fisher_diagonal(kind: str, model: nn.Module, loss_fn, inputs: torch.Tensor, targets: torch.Tensor, *,
                    batch_size: int = 32, task_labels: torch.Tensor | None = None,
                    chunk_size: int = 16) -> dict[str, torch.Tensor]:
    """Dispatch to one of :data:`FISHER_KINDS` on tensors (``batched`` uses contiguous minibatches;
    ``chunk_size`` is the per-sample estimators' memory knob, see :func:`empirical_fisher` and
    :func:`expected_fisher`).

    ``empirical`` and ``expected`` are of the loss as ``loss_fn`` reduces it over the samples
    (module docstring): ``expected`` is :func:`expected_fisher` (the mean) times ``N`` for a
    sum-reduced ``loss_fn``, so for cross-entropy both are the diagonals of the curvature of the
    same loss; ``batched`` is Avalanche's per-minibatch convention."""
    check_estimator_inputs(model, inputs, targets, loss_fn=loss_fn, task_labels=task_labels)
    check_choice("fisher", kind, FISHER_KINDS)
    check_inputs(inputs, targets)
    if kind == "batched":
        check_int("batch_size", batch_size)
        batches = [
            (inputs[s], targets[s]) if task_labels is None else (inputs[s], targets[s], task_labels[s])
            for s in iterate_batches(inputs.shape[0], batch_size)
        ]
        return batched_fisher(model, loss_fn, batches)
    if kind == "empirical":
        return empirical_fisher(model, loss_fn, inputs, targets, task_labels=task_labels, chunk_size=chunk_size)
    # the model's likelihood: loss_fn sets only the scale (class weights do not enter)
    n = inputs.shape[0]
    scale = n * sample_scale(loss_reduction(loss_fn, "fisher_diagonal", model=model, inputs=inputs, targets=targets,
                                            task_labels=task_labels, decomposable=False), n)
    return {k: v * scale for k, v in expected_fisher(model, inputs, task_labels=task_labels,
                                                      chunk_size=chunk_size).items()}
