"""Stitching: the updated network's early layers, a key, the checkpoint's late layers and head.

    ŷ = head_A( f^A_{>ℓ}( T_ℓ( f^{AB}_{≤ℓ}(x) ) ) )

:func:`stage_activations` reads the activations a key is fitted on; :func:`stitch` builds the
stitched model; :func:`stitched_accuracy` scores it.

A stage whose module returns more than a tensor (an LSTM's ``(output, (h, c))``) takes ``select``:
the index (tuple) or key (dict) of the element holding the activations, or a function from the
stage's output to that element (e.g. ``lambda out: out[0]``); the stitched model puts the keyed
activations back in that element's place, the rest of the output unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from avalanche_plugins.core.calls import eval_mode, is_multitask, model_forward
from avalanche_plugins.core.split import split_model

__all__ = ["stitch_many", "StitchedModel", "replace_selected", "select_activations", "stage_activations", "stages_activations", "stage_layout", "stage_output",
           "stitch", "stitched_accuracy"]

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



def select_activations(output, select=None, stage: str = "stage"):
    """The activations tensor in a stage's ``output``: ``output`` itself (``select`` None),
    ``output[select]`` (an int or str: a tuple's index, a dict's key) or ``select(output)``.

    Example:
        >>> lstm = nn.LSTM(3, 4, batch_first=True)
        >>> select_activations(lstm(torch.randn(2, 5, 3)), 0).shape
        torch.Size([2, 5, 4])
    """
    value = output
    if select is not None:
        value = select(output) if callable(select) else output[select]
    if not isinstance(value, torch.Tensor):
        if select is None:
            raise ValueError(f"stage={stage!r} outputs {type(output).__name__}, not a tensor: select the element "
                             "holding its activations (its index or key, e.g. 0 for an LSTM's (output, (h, c)))")
        raise ValueError(f"select={select!r} takes {type(value).__name__} from stage={stage!r}'s output "
                         f"({type(output).__name__}), not a tensor")
    return value


def replace_selected(output, select, h: torch.Tensor):
    """``output`` with its selected element (:func:`select_activations`) replaced by ``h``: ``h``
    itself when ``select`` is None; a function ``select`` must return one element of a tuple, list
    or dict ``output`` (found by identity), so that its place is known.

    Example:
        >>> out = (torch.zeros(2), (torch.ones(1), torch.ones(1)))
        >>> replace_selected(out, lambda o: o[0], torch.full((2,), 5.0))[0].tolist()
        [5.0, 5.0]
    """
    if select is None:
        return h
    place = select
    if callable(select):
        chosen = select(output)
        if isinstance(output, dict):
            items = output.items()
        else:
            items = enumerate(output) if isinstance(output, (tuple, list)) else ()
        place = next((k for k, v in items if v is chosen), None)
        if place is None:
            raise ValueError("the stage's select function must return one element of its tuple / dict output, so the "
                             "stitched model can put the keyed activations in its place; give that element's index "
                             "or key instead")
    if isinstance(output, dict):
        return {**output, place: h}
    items = list(output)
    items[place] = h
    if hasattr(output, "_fields"):  # a named tuple
        return type(output)(*items)
    return items if isinstance(output, list) else tuple(items)


def _stage_outputs(model: nn.Module, stages, x: torch.Tensor, task_labels=None) -> dict:
    """``{stage: what submodule stage returns}`` (its first call) for every stage of ``stages``,
    from one forward pass of ``model`` on ``x`` stopped once the last of them has run."""
    stages, captured = list(dict.fromkeys(stages)), {}

    def hook_for(stage):
        def hook(module, inputs, output):
            captured.setdefault(stage, output)
            if len(captured) == len(stages):
                raise _StopForward
        return hook

    handles = [_module(model, stage).register_forward_hook(hook_for(stage)) for stage in stages]
    try:
        model_forward(model, x, task_labels)
    except _StopForward:
        pass
    finally:
        for handle in handles:
            handle.remove()
    missing = [stage for stage in stages if stage not in captured]
    if missing:
        raise ValueError(f"stage={missing[0]!r} was not run by the forward pass")
    return captured


def stage_output(model: nn.Module, stage: str, x: torch.Tensor, task_labels=None):
    """What submodule ``stage`` returns when ``model`` runs on ``x`` (a tensor, or a tuple / dict
    for a module such as an LSTM); the rest of the forward pass is skipped."""
    return _stage_outputs(model, [stage], x, task_labels)[stage]


def stages_activations(model: nn.Module, stages, x: torch.Tensor, task_labels=None, selects=None) -> dict:
    """``{stage: f_{≤stage}(x)}`` for every stage of ``stages`` from one forward pass, stopped once
    the last of them has run (each stage's first output, as :func:`stage_activations` gives it,
    through ``selects[stage]``): the layers below a deep stage run once, not once per stage.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> x = torch.randn(5, 4)
        >>> both = stages_activations(net, ["0", "1"], x)
        >>> torch.equal(both["1"], stage_activations(net, "1", x)), both["0"].shape
        (True, torch.Size([5, 8]))
    """
    selects = selects or {}
    outputs = _stage_outputs(model, stages, x, task_labels)
    return {stage: select_activations(outputs[stage], selects.get(stage), stage) for stage in outputs}


def stage_activations(model: nn.Module, stage: str, x: torch.Tensor, task_labels=None, select=None) -> torch.Tensor:
    """``f_{≤stage}(x)``: the output of submodule ``stage`` when ``model`` runs on ``x`` (the rest of
    the forward pass is skipped), through ``select`` (:func:`select_activations`) for a stage that
    returns a tuple or dict. Runs in the model's current train/eval mode.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> stage_activations(net, "1", torch.randn(5, 4)).shape
        torch.Size([5, 8])
    """
    return select_activations(stage_output(model, stage, x, task_labels), select, stage)



def stage_layout(model: nn.Module, stage: str, x: torch.Tensor, task_labels=None, select=None) -> str:
    """How ``stage``'s activations (through ``select``) are laid out: ``"flat"`` (N, C),
    ``"channels_first"`` (N, C, H, W) or, for 3-D activations, ``"channels_first"`` (N, C, L) after a
    1-d convolution / pooling / BatchNorm1d and ``"tokens"`` (N, T, C) after a Linear / attention /
    LayerNorm / embedding / batch-first recurrent layer: the last such module the forward pass runs
    up to ``stage`` decides. ``ValueError`` when none does, or a recurrent layer is not batch-first.

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
    out = select_activations(captured[0], select, stage)
    if out.dim() != 3:
        return {2: "flat", 4: "channels_first"}.get(out.dim(), "flat")
    for module in reversed(executed):
        if isinstance(module, nn.RNNBase):
            if not module.batch_first:
                raise ValueError(f"stage {stage!r}'s activations {tuple(out.shape)} come from a recurrent layer "
                                 "with batch_first=False (time first): keys need the samples first; build it "
                                 "with batch_first=True")
            return "tokens"
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

    Cost: when the late model's forward is a chain (:func:`~avalanche_plugins.core.split.split_model`
    can cut it at ``stage``), only its part after ``stage`` runs, so a stitched forward costs one
    forward pass. Otherwise (multi-task models, non-chain forwards) the late model runs whole
    with its ``stage`` output replaced by a hook, and its modules before ``stage`` run for
    nothing: at most two forward passes. Wrap a multi-head model's trunk and one head in an
    ``nn.Sequential`` to get the fast path.
    """

    def __init__(self, early_model: nn.Module, late_model: nn.Module, stage: str, key: nn.Module, select=None):
        super().__init__()
        _module(early_model, stage)
        _module(late_model, stage)
        self.early_model, self.late_model, self.stage, self.key = early_model, late_model, stage, key
        self.select = select  # the element of a tuple / dict stage output the key reads and replaces
        # the late model after `stage` when it is a chain (traced at the first forward), shared by
        # the models of one stitch_many: {"checked": bool, "part": nn.Module | None}
        self._cut = {"checked": select is not None, "part": None}  # a tuple / dict stage: the hook

    @property
    def _late_part(self) -> nn.Module | None:
        """The late model after ``stage`` (None before the first forward, or not a chain there)."""
        return self._cut["part"]

    @property
    def _chain_checked(self) -> bool:
        return self._cut["checked"]

    @_chain_checked.setter
    def _chain_checked(self, value: bool) -> None:
        self._cut = {**self._cut, "checked": bool(value)}  # this model only

    def forward(self, x: torch.Tensor, task_labels=None) -> torch.Tensor:
        u = stage_activations(self.early_model, self.stage, x, task_labels, self.select)
        return self.forward_from_stage(self.key(u), x, task_labels)

    def forward_from_stage(self, h: torch.Tensor, x: torch.Tensor, task_labels=None) -> torch.Tensor:
        """The late model's output with its ``stage`` output (its selected element) replaced by ``h``."""
        cut = self._cut
        if not cut["checked"] and not is_multitask(self.late_model):
            cut["checked"] = True
            try:
                cut["part"] = split_model(self.late_model, self.stage, x[:2])[1]
            except (ValueError, TypeError):
                cut["part"] = None  # not a chain at this stage: use the hook below
        if cut["part"] is not None:
            return cut["part"](h)

        def replace(module, inputs, output):
            selected = select_activations(output, self.select, self.stage)
            if selected.shape != h.shape:
                raise ValueError(f"the key outputs shape {tuple(h.shape)} but the late model's "
                                 f"stage {self.stage!r} outputs {tuple(selected.shape)}")
            return replace_selected(output, self.select, h)

        handle = _module(self.late_model, self.stage).register_forward_hook(replace)
        try:
            return model_forward(self.late_model, x, task_labels)
        finally:
            handle.remove()



def stitch(early_model: nn.Module, late_model: nn.Module, stage: str, key: nn.Module, select=None) -> StitchedModel:
    """``late_model``'s layers after ``stage`` (and its head) fed by ``key(early_model_{≤stage}(x))``
    (``select``: the element of a tuple / dict stage output, :func:`select_activations`).

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
    return StitchedModel(early_model, late_model, stage, key, select)


def stitch_many(early_model: nn.Module, late_model: nn.Module, stage: str, keys: dict, select=None) -> dict:
    """``{name: stitch(early_model, late_model, stage, key, select)}`` for every ``name: key`` of
    ``keys``, sharing one cut of ``late_model`` at ``stage`` (traced once, at the first forward of
    any of them, instead of once per key: the trace costs about as much as a small model's
    stitched evaluation). The models are those :func:`stitch` builds, outputs equal.

    Example:
        >>> from avalanche_plugins.transport import fit_transport_key
        >>> a = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> x = torch.randn(5, 4)
        >>> u = stage_activations(a, "1", x)
        >>> many = stitch_many(a, a, "1", {f: fit_transport_key(u, u, f) for f in ("identity", "channel")})
        >>> all(torch.allclose(m(x), stitch(a, a, "1", m.key)(x)) for m in many.values())
        True
    """
    models = {name: StitchedModel(early_model, late_model, stage, key, select) for name, key in keys.items()}
    shared = {"checked": select is not None, "part": None}
    for model in models.values():
        model._cut = shared
    return models



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
