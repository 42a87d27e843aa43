"""Stitching: the updated network's early layers, a key, the checkpoint's late layers and head.

    ŷ = head_A( f^A_{>ℓ}( T_ℓ( f^{AB}_{≤ℓ}(x) ) ) )

:func:`stage_activations` reads the activations a key is fitted on; :func:`stitch` builds the
stitched model; :func:`stitched_accuracy` scores it.
"""

from __future__ import annotations

import torch
from torch import nn

from avalanche_plugins.core.calls import eval_mode, is_multitask, model_forward
from avalanche_plugins.core.split import split_model

__all__ = ["StitchedModel", "stage_activations", "stage_layout", "stitch", "stitched_accuracy"]

# Modules whose output fixes how a 3-D activation (N, ·, ·) is laid out.
_CHANNELS_FIRST_1D = (nn.Conv1d, nn.ConvTranspose1d, nn.BatchNorm1d, nn.InstanceNorm1d, nn.MaxPool1d,
                      nn.AvgPool1d, nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d)
_TOKENS = (nn.Linear, nn.MultiheadAttention, nn.LayerNorm, nn.Embedding, nn.TransformerEncoderLayer,
           nn.TransformerDecoderLayer)


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



def stage_layout(model: nn.Module, stage: str, x: torch.Tensor, task_labels=None) -> str:
    """How ``stage``'s activations are laid out: ``"flat"`` (N, C), ``"channels_first"`` (N, C, H, W)
    or, for 3-D activations, ``"channels_first"`` (N, C, L) after a 1-d convolution / pooling /
    BatchNorm1d and ``"tokens"`` (N, T, C) after a Linear / attention / LayerNorm / embedding: the last
    such module the forward pass runs up to ``stage`` decides. ``ValueError`` when none does.

    Example:
        >>> net = nn.Sequential(nn.Conv1d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6, 3))
        >>> stage_layout(net, "1", torch.randn(2, 2, 8))
        'channels_first'
    """
    executed: list[nn.Module] = []
    captured: list = []
    target = _module(model, stage)

    def record(module, inputs, output):
        executed.append(module)
        if module is target:
            captured.append(output)
            raise _StopForward

    handles = [m.register_forward_hook(record) for m in model.modules() if m is not model]
    try:
        with eval_mode(model), torch.no_grad():
            model_forward(model, x[:2], None if task_labels is None else task_labels[:2])
    except _StopForward:
        pass
    finally:
        for h in handles:
            h.remove()
    if not captured:
        raise ValueError(f"stage={stage!r} was not run by the forward pass")
    out = captured[0]
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"stage={stage!r} outputs {type(out).__name__}, not a tensor")
    if out.dim() != 3:
        return {2: "flat", 4: "channels_first"}.get(out.dim(), "flat")
    for module in reversed(executed):
        if isinstance(module, _CHANNELS_FIRST_1D):
            return "channels_first"
        if isinstance(module, _TOKENS):
            return "tokens"
    raise ValueError(f"cannot tell whether stage {stage!r}'s activations {tuple(out.shape)} are tokens "
                     "(N, T, C) or channel maps (N, C, L): pass the layout explicitly "
                     "(layout='tokens' or 'channels_first')")


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
        >>> from avalanche_plugins.transport import fit_transport_key
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
