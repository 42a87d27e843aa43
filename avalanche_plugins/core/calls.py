"""Calling a model (plain or Avalanche multi-task) statelessly, for ``torch.func`` transforms."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.func import functional_call, grad_and_value

from avalanche_plugins.core.checks import check_output_targets

__all__ = ["is_multitask", "model_forward", "stateless_forward", "iterate_batches", "eval_mode",
           "split_params", "task_groups", "task_batches", "chunk_weight", "check_task_labels", "first_tensor",
           "batch_loss", "sample_loss", "grouped_loss_and_grad", "math_attention", "VMAP_FLOATS", "vmap_chunk",
           "sample_stride"]

#: floats (parameters' gradients plus activations, per sample) one vectorised gradient pass of
#: :func:`vmap_chunk` holds: 32 MiB in float32. On a 2-core CPU the demo's MLP computes OR 8×
#: faster in passes of 256 samples than of 16 (per-call overhead), the zoo CNN on 28×28 inputs
#: 1.7× faster in passes of about 64 (larger ones leave the cache) (issue 41)
VMAP_FLOATS = 1 << 23


def is_multitask(model: nn.Module) -> bool:
    """Avalanche ``MultiTaskModule`` protocol (duck-typed so this module does not import avalanche)."""
    return hasattr(model, "forward_single_task")


def _task_arg(task_labels):
    """Label 0 when none is given; a single int when the whole batch has one task (Avalanche's
    fast path, which also avoids in-place scatter under ``torch.func`` transforms)."""
    if task_labels is None:
        return 0
    if isinstance(task_labels, torch.Tensor):
        if task_labels.numel() == 0:
            return 0
        first = task_labels.reshape(-1)[0]
        if bool((task_labels == first).all()):
            return int(first)
    return task_labels


def model_forward(model: nn.Module, x: torch.Tensor, task_labels=None) -> torch.Tensor:
    """``model(x)``, or ``model(x, task_labels)`` for multi-task models (label 0 when none given)."""
    if is_multitask(model):
        return model(x, _task_arg(task_labels))
    return model(x)


def stateless_forward(model: nn.Module, params_and_buffers: dict, x: torch.Tensor, task_labels=None):
    """:func:`model_forward` with the given parameters/buffers (``torch.func.functional_call``)."""
    args = (x, _task_arg(task_labels)) if is_multitask(model) else (x,)
    return functional_call(model, params_and_buffers, args)


def first_tensor(obj):
    """The first tensor in ``obj`` (a tensor, or nested tuples/lists as hooks receive them), else None."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, (tuple, list)):
        for item in obj:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def sample_stride(n: int, samples: int | None) -> int:
    """Every how many of ``n`` samples to take so that about ``samples`` of them, spread evenly,
    remain: ``⌈n / samples⌉`` (1: all of them, when ``n ≤ samples`` or ``samples`` is None); the
    ``range(0, n, stride)`` so chosen holds ``⌈n / stride⌉ ≤ samples`` samples.

    >>> sample_stride(2000, 500), sample_stride(1500, 1000), sample_stride(300, 1000), sample_stride(9, None)
    (4, 2, 1, 1)
    """
    return 1 if samples is None or n <= samples else -(-n // samples)


def iterate_batches(n: int, batch_size: int | None):
    """Contiguous index slices covering ``range(n)``; one slice when ``batch_size`` is None."""
    step = n if batch_size is None else batch_size
    for start in range(0, n, step):
        yield slice(start, min(start + step, n))


def vmap_chunk(model: nn.Module, x: torch.Tensor, task_labels=None, *, floor: int = 16, cap: int = 256) -> int:
    """Samples per vectorised gradient pass: :data:`VMAP_FLOATS` over one sample's cost in floats
    (the trainable parameters, whose gradient each sample holds, plus every module's output for
    one sample, counted on one forward pass of ``x[:1]``), within ``[floor, cap]``. Large models
    get ``floor`` (16, the estimators' former default), small ones fewer, larger passes.

    Example:
        >>> vmap_chunk(nn.Linear(3, 2), torch.randn(4, 3)), vmap_chunk(nn.Linear(2000, 2000), torch.randn(4, 2000))
        (256, 16)
    """
    floats = sum(p.numel() for p in model.parameters() if p.requires_grad)
    outputs = []

    def count(module, inputs, output):
        if isinstance(output, torch.Tensor):
            outputs.append(output.numel())

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(count) for m in leaves]
    try:
        with eval_mode(model), torch.no_grad():
            model_forward(model, x[:1], None if task_labels is None else torch.as_tensor(task_labels).reshape(-1)[:1])
    finally:
        for handle in handles:
            handle.remove()
    return int(min(cap, max(floor, VMAP_FLOATS // max(1, floats + sum(outputs)))))


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    """Evaluate ``model`` in eval mode inside the block; restore every submodule's previous
    train/eval flag (``model.train(was_training)`` would overwrite the submodules' own flags,
    e.g. a frozen snapshot held in eval mode inside a wrapper)."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training


def split_params(model: nn.Module) -> tuple[dict, dict]:
    """``(trainable, constants)`` for ``functional_call``: detached trainable parameters, and frozen
    parameters + buffers. Raises ``ValueError`` when nothing is trainable."""
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    if not params:
        raise ValueError(f"model {type(model).__name__} has no trainable parameters (requires_grad=True)")
    consts = {k: v.detach() for k, v in model.named_parameters() if not v.requires_grad}
    consts.update({k: v.detach() for k, v in model.named_buffers()})
    return params, consts


def check_task_labels(task_labels, n: int) -> None:
    """``task_labels`` is None or a tensor with one entry per sample (``n``)."""
    if task_labels is None:
        return
    if not isinstance(task_labels, torch.Tensor):
        raise TypeError(f"task_labels must be a tensor, got {type(task_labels).__name__}")
    if task_labels.reshape(-1).shape[0] != n:
        raise ValueError(f"task_labels has {task_labels.reshape(-1).shape[0]} entries but inputs has {n}")


def task_groups(model: nn.Module, n: int, task_labels) -> list[tuple[int | None, torch.Tensor | None]]:
    """``[(label, index)]``: the ``n`` samples grouped by task label so that every forward pass has
    one ``int`` label (Avalanche's fast path, the only one ``torch.func`` transforms can trace);
    ``index`` is None for "all samples".

    Plain models (and multi-task models without labels) form one group with label ``None``, which
    :func:`stateless_forward` turns into task 0 for multi-task models.
    """
    check_task_labels(task_labels, n)
    if task_labels is None or not is_multitask(model):
        return [(None, None)]
    labels = task_labels.reshape(-1)
    unique = torch.unique(labels)
    if unique.numel() == 1:
        return [(int(unique[0]), None)]
    return [(int(u), (labels == u).nonzero().squeeze(1)) for u in unique]


def chunk_weight(reduction: str, n_chunk: int, n_total: int) -> float:
    """The weight of a chunk's loss in the loss of all ``n_total`` samples
    (:mod:`avalanche_plugins.core.reductions`): its share ``n_chunk / n_total`` for a
    ``"mean"``-reduced loss, 1 for a ``"sum"``-reduced one.

    >>> chunk_weight("mean", 2, 8), chunk_weight("sum", 2, 8)
    (0.25, 1.0)
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    return n_chunk / n_total if reduction == "mean" else 1.0


def task_batches(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor | None = None, task_labels=None,
                 chunk_size: int | None = None, *, groups=None, reduction: str = "mean"):
    """``(label, xs, ys, weight)`` for every chunk of every task group: the samples grouped by
    :func:`task_groups` (or the precomputed ``groups``), each group cut into contiguous chunks of
    ``chunk_size`` samples (one chunk per group when None); ``weight`` is the chunk's
    :func:`chunk_weight` for a loss of that ``reduction``: with ``"mean"`` (the default) its share of
    all samples, ``len(xs) / len(inputs)``, so a weighted sum of chunk means is the mean over all
    samples; with ``"sum"`` 1, so the plain sum of chunk sums is the sum over all samples.
    ``ys`` is None when ``targets`` is.

    Example:
        >>> net = nn.Linear(2, 1)
        >>> [(label, xs.shape[0], weight) for label, xs, _, weight in task_batches(net, torch.zeros(5, 2), chunk_size=2)]
        [(None, 2, 0.4), (None, 2, 0.4), (None, 1, 0.2)]
        >>> [weight for *_, weight in task_batches(net, torch.zeros(5, 2), chunk_size=2, reduction="sum")]
        [1.0, 1.0, 1.0]
    """
    n = inputs.shape[0]
    for label, index in task_groups(model, n, task_labels) if groups is None else groups:
        xs = inputs if index is None else inputs[index]
        ys = targets if targets is None or index is None else targets[index]
        for s in iterate_batches(xs.shape[0], chunk_size):
            yield label, xs[s], None if ys is None else ys[s], chunk_weight(reduction, s.stop - s.start, n)


def batch_loss(model: nn.Module, loss_fn, consts: dict, task_label=None):
    """``f(params, x, y, t=task_label) = loss_fn(model(x; params ∪ consts, t), y)``: the loss of
    a batch as a pure function of the trainable parameters, for ``torch.func`` transforms.
    With torch's elementwise losses the targets must have the outputs' shape (``ValueError``
    otherwise: ``(N,)`` against ``(N, 1)`` would broadcast silently)."""

    def f(params, x, y, t=task_label):
        out = stateless_forward(model, {**consts, **params}, x, t)
        check_output_targets(out, y, getattr(loss_fn, "base_loss", loss_fn))  # through reductions.MeanOfSum
        return loss_fn(out, y)

    return f


def sample_loss(model: nn.Module, loss_fn, consts: dict, task_label=None):
    """:func:`batch_loss` of one sample (a batch of one), for ``vmap`` over samples; ``t`` is the
    sample's task label (a 0-d tensor, an int or None)."""

    def f(params, x, y, t=task_label):
        if isinstance(t, torch.Tensor):
            t = t.unsqueeze(0)
        out = stateless_forward(model, {**consts, **params}, x.unsqueeze(0), t)
        check_output_targets(out, y.unsqueeze(0), getattr(loss_fn, "base_loss", loss_fn))
        return loss_fn(out, y.unsqueeze(0))

    return f


def grouped_loss_and_grad(model: nn.Module, loss_fn, consts: dict, x: torch.Tensor, y: torch.Tensor, groups,
                          chunk_size: int | None = None):
    """``f(params) -> (∇L, L)``: the mean loss of all of ``(x, y)`` and its gradient, from the
    batch losses of the task groups (``groups`` from :func:`task_groups`) split into chunks of
    ``chunk_size`` samples, each weighted by its share of the samples (for mean-reduced losses the
    value of one pass over everything; memory: one chunk's backward pass). ``loss_fn`` must be
    mean-reduced: callers with a sum-reduced loss pass
    :func:`avalanche_plugins.core.reductions.mean_loss` of it. Sums in float64
    (``L`` a 0-d tensor, ``∇L`` a dict of float64 tensors).

    Example:
        >>> net = nn.Linear(2, 1)
        >>> params, consts = split_params(net)
        >>> x, y = torch.randn(5, 2), torch.randn(5, 1)
        >>> f = grouped_loss_and_grad(net, nn.MSELoss(), consts, x, y, task_groups(net, 5, None), 2)
        >>> grads, loss = f(params)
        >>> bool(torch.isclose(loss, nn.MSELoss()(net(x), y).double()))
        True
    """
    def f(params):
        grads = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in params.items()}
        loss = torch.zeros((), dtype=torch.float64, device=x.device)
        for label, xs, ys, weight in task_batches(model, x, y, chunk_size=chunk_size, groups=groups):
            g, value = grad_and_value(batch_loss(model, loss_fn, consts, label))(params, xs, ys)
            loss += weight * value.detach().double()
            for k, v in g.items():
                grads[k] += weight * v.detach().double()
        return grads, loss

    return f


def math_attention():
    """Context running scaled-dot-product attention on its math backend (plain matmul/softmax),
    with ``nn.MultiheadAttention``'s fused fast path (``aten::_native_multi_head_attention``,
    taken in eval mode) switched off; both restored on exit.

    The fused CPU kernels have neither a forward-mode derivative (ADS's JVPs) nor a second
    derivative (the Hessian-vector products of the layer spectrum); the math backend has both.
    """
    stack = contextlib.ExitStack()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3: no fused-kernel selection to work around
        pass
    else:
        stack.enter_context(sdpa_kernel(SDPBackend.MATH))
    mha = getattr(torch.backends, "mha", None)
    if mha is not None and hasattr(mha, "set_fastpath_enabled"):
        previous = mha.get_fastpath_enabled()
        mha.set_fastpath_enabled(False)
        stack.callback(mha.set_fastpath_enabled, previous)
    return stack
