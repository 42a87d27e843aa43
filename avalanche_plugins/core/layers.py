"""The one shared map of a model's layers, in the order the forward pass runs them.

Every component of this package needs "the layers of a model, in depth order": the
layer-adaptive EWC assigns a strength per depth, the Hessian spectrum is per layer, ADS sums
over layers, transport keys cut a model at a stage and grow/prune masks a layer's units.
:func:`discover_layers` answers that question once, by tracing one example batch with
forward hooks (registration order is not execution order), and :func:`~avalanche_plugins.core.split.split_model` cuts a
model into "everything up to a layer" and "the rest".

Rules (documented once, used everywhere):

* A *layer* is an executed module that owns parameters directly (``recurse=False``), is not a
  normalisation layer, and has no executed descendant that owns parameters. The last clause
  makes ``nn.MultiheadAttention`` one layer (its ``out_proj`` is never called as a module; the
  parameters of never-called descendants of a layer belong to that layer).
* A normalisation layer (BatchNorm, LayerNorm, GroupNorm, InstanceNorm, LocalResponseNorm)
  is never a layer. It is reported as the ``norm`` of the layer whose output tensor it
  receives, directly (``Conv2d -> BatchNorm2d``) or through elementwise modules
  (``Linear -> ReLU -> BatchNorm1d``; activations called as functions inside ``forward`` are
  invisible to the trace); a pre-norm block's LayerNorm that reads a residual sum follows no layer.
* Parameters that belong to no layer (a ViT's class token and positional embedding, norm
  layers' affine parameters, heads not run by the example batch such as other tasks' heads of
  a ``MultiHeadClassifier``) are listed in :attr:`LayerMap.unassigned`, each with the reason.
* A layer executed more than once by one forward pass (weight sharing) raises ``ValueError``:
  depth is then ambiguous, and per-layer quantities would silently double count.
* Depth is 1-based (``depth = index + 1``), matching the papers' ``ℓ - 1`` exponents.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import nn

from avalanche_plugins.core.calls import eval_mode, first_tensor, is_multitask, model_forward
from avalanche_plugins.core.checks import check_model_inputs

__all__ = [
    "ELEMENTWISE",
    "NORM_TYPES",
    "LayerInfo",
    "LayerMap",
    "discover_layers",
    "example_input",
]

# Parameter-free modules that act on each unit separately: a norm reading a layer's output through
# them still normalises that layer's units one by one.
ELEMENTWISE: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish, nn.Tanh,
    nn.Sigmoid, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.Softplus, nn.Identity,
    nn.modules.dropout._DropoutNd,
)

NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
)


@dataclass(eq=False)
class LayerInfo:
    """One parametrised layer of a model.

    Attributes:
        name: module path (``"features.0"``); stable across runs and processes.
        index: 0-based position in execution order.
        module: the live module (not a copy).
        params: the layer's own parameters, keyed by their full name in ``model.named_parameters()``.
        in_units: input features (``Linear``), input channels (``Conv``) or embedding width.
        out_units: output neurons / channels; the units a mask would act on.
        norm: name of the normalisation layer that directly consumes this layer's output, if any.
        kind: ``"linear"``, ``"conv"``, ``"attention"``, ``"embedding"`` or ``"other"``.
    """

    name: str
    index: int
    module: nn.Module
    params: dict[str, nn.Parameter]
    in_units: int
    out_units: int
    norm: str | None = None
    kind: str = "other"

    @property
    def depth(self) -> int:
        """1-based depth ℓ."""
        return self.index + 1

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.params.values())


@dataclass(eq=False)
class LayerMap(Sequence):
    """Layers of a model in execution order; indexable by position or by name."""

    layers: list[LayerInfo]
    unassigned: dict[str, str] = field(default_factory=dict)
    norms: dict[str, nn.Module] = field(default_factory=dict)
    # layer name -> a BatchNorm that follows it through an untraced (functional) operation
    untraced_norms: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[LayerInfo]:
        return iter(self.layers)

    def __getitem__(self, key):
        if isinstance(key, str):
            for layer in self.layers:
                if layer.name == key:
                    return layer
            raise KeyError(f"no layer named {key!r}; layers are {self.names}")
        return self.layers[key]

    @property
    def names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    def param_to_layer(self) -> dict[str, int]:
        """Map every assigned parameter name to its layer index."""
        return {pname: layer.index for layer in self.layers for pname in layer.params}

    def attach_parameters(self) -> tuple[dict[str, int], list[str]]:
        """Assign *every* parameter a layer index for per-layer weighting, by documented rules:

        1. a layer's own parameters -> that layer;
        2. a normalisation layer's parameters -> the layer whose output it reads (``Conv -> BN``);
        3. parameters of modules the example batch did not run (other tasks' heads of a
           ``MultiHeadClassifier``) -> the layer sharing the longest module path with them (the
           executed sibling head), when they share at least one path component;
        4. anything else (class tokens, bare ``nn.Parameter``) -> no layer.

        Returns ``(index_of, leftovers)`` where ``leftovers`` lists the rule-4 parameter names.
        """
        index_of = self.param_to_layer()
        norm_owner = {layer.norm: layer.index for layer in self.layers if layer.norm is not None}
        leftovers = []
        for pname, reason in self.unassigned.items():
            module_path = pname.rsplit(".", 1)[0] if "." in pname else ""
            if reason == "normalisation layer" and module_path in norm_owner:
                index_of[pname] = norm_owner[module_path]
                continue
            if reason == "module not executed by the example input":
                parts = module_path.split(".")
                best, best_len = None, 0
                for layer in self.layers:
                    common = 0
                    for a, b in zip(parts, layer.name.split(".")):
                        if a != b:
                            break
                        common += 1
                    if common > best_len:
                        best, best_len = layer.index, common
                if best is not None:
                    index_of[pname] = best
                    continue
            leftovers.append(pname)
        return index_of, leftovers


def _run(model: nn.Module, example_input) -> torch.Tensor:
    """``model(*example_input)`` for a tuple, else :func:`model_forward` (task label 0 for
    multi-task models)."""
    if isinstance(example_input, (tuple, list)):
        return model(*example_input)
    return model_forward(model, example_input)


def _kind(module: nn.Module) -> str:
    if isinstance(module, nn.Linear):
        return "linear"
    if isinstance(module, nn.modules.conv._ConvNd):
        return "conv"
    if isinstance(module, nn.MultiheadAttention):
        return "attention"
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        return "embedding"
    return "other"


def _units(module: nn.Module, kind: str, inp: torch.Tensor | None, out: torch.Tensor | None):
    if kind == "linear":
        return module.in_features, module.out_features
    if kind == "conv":
        return module.in_channels, module.out_channels
    if kind == "attention":
        return module.embed_dim, module.embed_dim
    if kind == "embedding":
        return module.num_embeddings, module.embedding_dim
    # Unknown layer: channels are dim 1 of image-like tensors, features the last dim otherwise.
    def width(t):
        if t is None or t.dim() == 0:
            return 0
        return t.shape[1] if t.dim() >= 3 and any(p.dim() > 2 for p in module.parameters()) else t.shape[-1]

    return width(inp), width(out)


def _check_no_tied_parameters(model: nn.Module) -> None:
    """``ValueError`` when one ``Parameter`` object is registered in two modules (weight tying)."""
    holders: dict[int, dict[int, str]] = {}  # parameter -> {module object: first name}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for param_name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            holders.setdefault(id(param), {}).setdefault(id(module), full)
    # one module registered twice is a shared *layer* (reported by discover_layers as weight sharing)
    tied = [list(names.values()) for names in holders.values() if len(names) > 1]
    if tied:
        raise ValueError(f"model has tied weights (one Parameter held by several modules: {tied[:3]}); "
                         "per-layer curvature, EWC strengths and ADS groups would credit the shared weight "
                         "to one layer only, so tied weights are not supported: untie them or exclude the "
                         "model")


def discover_layers(model: nn.Module, example_input) -> LayerMap:
    """Trace ``model`` on one example batch and return its parametrised layers in execution order.

    Args:
        model: any ``nn.Module``. Multi-task Avalanche models (``MultiTaskModule``) receive task
            label 0 for every sample unless ``example_input`` is a tuple ``(x, task_labels)``.
        example_input: a tensor, or a tuple of positional arguments for ``model.forward``. A couple
            of samples suffice; the model's train/eval mode is restored afterwards.

    Returns:
        A :class:`LayerMap`; see the module docstring for the rules.

    Raises:
        ValueError: the model has no parametrised layer, a layer runs twice in one forward pass,
            or one ``Parameter`` is held by two modules (tied weights): per-layer quantities
            would be credited to one of them only.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
        >>> lm = discover_layers(net, torch.randn(2, 4))
        >>> [(layer.name, layer.in_units, layer.out_units, layer.norm) for layer in lm]
        [('0', 4, 8, '1'), ('3', 8, 3, None)]
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if isinstance(example_input, torch.Tensor):  # a tuple of arguments is the model's business
        check_model_inputs(model, example_input, "example_input")
    _check_no_tied_parameters(model)
    trace = _trace(model, example_input)
    layer_modules = _choose_layers(model, trace)
    norm_of = _attach_norms(trace, layer_modules)
    owner, unassigned = _assign_parameters(model, trace, layer_modules)
    layers = [_layer_info(model, trace, index, m, owner, norm_of) for index, m in enumerate(layer_modules)]
    norms = {trace.names[m]: m for m in trace.executed if _is_norm(m)}
    return LayerMap(layers=layers, unassigned=unassigned, norms=norms,
                    untraced_norms=_untraced_norms(trace, layer_modules, norm_of))


@dataclass
class _Trace:
    """One traced forward pass: every submodule call in completion order, with its first input
    and output tensors."""
    names: dict  # module -> its name in the model
    calls: list  # (module, first input tensor or None, first output tensor or None)
    call_count: dict  # module -> calls in the pass

    @cached_property  # read once the pass has run
    def executed(self) -> set:
        return set(self.call_count)

    @cached_property
    def io(self) -> dict:
        return {m: (inp, out) for m, inp, out in self.calls}


def _owns_params(m: nn.Module) -> bool:
    return next(m.parameters(recurse=False), None) is not None


def _is_norm(m: nn.Module) -> bool:
    return isinstance(m, NORM_TYPES)


def _trace(model: nn.Module, example_input) -> _Trace:
    """Run ``model`` once on ``example_input`` (eval mode, no graph) with a forward hook on every
    submodule."""
    trace = _Trace(names={module: name for name, module in model.named_modules()}, calls=[], call_count={})

    def hook(module, inputs, output):
        trace.call_count[module] = trace.call_count.get(module, 0) + 1
        trace.calls.append((module, first_tensor(inputs), first_tensor(output)))

    handles = [m.register_forward_hook(hook) for m in trace.names if m is not model]
    try:
        with eval_mode(model), torch.no_grad():
            _run(model, example_input)
    finally:
        for h in handles:
            h.remove()
    return trace


def _choose_layers(model: nn.Module, trace: _Trace) -> list[nn.Module]:
    """Rule 1: the executed modules that own parameters, are no norm and have no executed
    descendant that owns parameters, in execution order; none, or one run twice, is an error."""
    executed = trace.executed

    def has_executed_param_descendant(m):
        return any(sub is not m and sub in executed and _owns_params(sub) and not _is_norm(sub)
                   for sub in m.modules())

    layer_modules = [m for m in executed
                     if _owns_params(m) and not _is_norm(m) and not has_executed_param_descendant(m)]
    if not layer_modules:
        raise ValueError(
            f"model {type(model).__name__} has no parametrised layer executed by the example input "
            "(expected at least one Linear/Conv/attention or other module owning parameters)"
        )
    shared = [trace.names[m] for m in layer_modules if trace.call_count[m] > 1]
    if shared:
        raise ValueError(
            f"layers {shared} run more than once per forward pass (weight sharing); "
            "depth is ambiguous, so discover_layers does not support shared layers"
        )
    # Order: completion order of hooks, which equals start order for leaf layers.
    order = {m: i for i, (m, _, _) in enumerate(trace.calls)}
    layer_modules.sort(key=lambda m: order[m])
    return layer_modules


def _attach_norms(trace: _Trace, layer_modules: list[nn.Module]) -> dict[nn.Module, str]:
    """Rule 2: ``{layer: name of its norm}``, the norm layer that receives the layer's output,
    directly or through elementwise modules (the first such norm wins)."""
    calls = trace.calls
    norm_of: dict[nn.Module, str] = {}
    for k, (m, inp, _) in enumerate(calls):
        if not _is_norm(m) or inp is None:
            continue
        # the latest earlier call that produced `inp`; walk back through elementwise modules
        # (Linear -> ReLU -> BatchNorm1d is common; an in-place ReLU returns its input object)
        tensor, j = inp, k
        while True:
            j = next((i for i in range(j - 1, -1, -1) if calls[i][2] is tensor), None)
            if j is None:
                break
            source, source_in, _ = calls[j]
            if source not in layer_modules and next(source.children(), None) is not None:
                continue  # a container passes on a child's output: find that child
            if isinstance(source, ELEMENTWISE) and source_in is not None:
                tensor = source_in
                continue
            if source in layer_modules and source not in norm_of:
                norm_of[source] = trace.names[m]
            break
    return norm_of


def _assign_parameters(model: nn.Module, trace: _Trace, layer_modules: list[nn.Module]):
    """Rule 3: ``(owner, unassigned)``: every parameter's layer (the nearest layer at or above its
    module, covering never-called children such as ``MHA.out_proj``), or the reason it has none."""
    layer_set = set(layer_modules)
    owner: dict[str, nn.Module] = {}
    unassigned: dict[str, str] = {}
    for pname, _ in model.named_parameters():
        mod_path = pname.rsplit(".", 1)[0] if "." in pname else ""
        module = model.get_submodule(mod_path)
        path = mod_path
        while module not in layer_set and path:
            path = path.rsplit(".", 1)[0] if "." in path else ""
            module = model.get_submodule(path)
        if module in layer_set:
            owner[pname] = module
            continue
        direct = model.get_submodule(mod_path)
        if _is_norm(direct):
            unassigned[pname] = "normalisation layer"
        elif direct not in trace.executed and direct is not model:
            unassigned[pname] = "module not executed by the example input"
        else:
            unassigned[pname] = "parameter of a container, not of a layer"
    return owner, unassigned


def _layer_info(model: nn.Module, trace: _Trace, index: int, m: nn.Module, owner: dict, norm_of: dict) -> LayerInfo:
    """The :class:`LayerInfo` of layer ``m`` at position ``index``."""
    kind = _kind(m)
    in_units, out_units = _units(m, kind, *trace.io[m])
    params = dict(model.named_parameters())
    return LayerInfo(name=trace.names[m], index=index, module=m,
                     params={p: params[p] for p, mod in owner.items() if mod is m},
                     in_units=int(in_units), out_units=int(out_units), norm=norm_of.get(m), kind=kind)


def _untraced_norms(trace: _Trace, layer_modules: list[nn.Module], norm_of: dict) -> dict[str, str]:
    """A BatchNorm that no layer claims but that runs right after a layer of matching width reads
    that layer's output through an operation the hooks cannot see (an activation called as a
    function): ``{layer name: norm name}``."""
    attached = set(norm_of.values())
    io = trace.io
    untraced_norm: dict[str, str] = {}
    for k, (m, _input, _) in enumerate(trace.calls):
        if not isinstance(m, nn.modules.batchnorm._BatchNorm) or trace.names[m] in attached:
            continue
        before = [c for c, _, _ in trace.calls[:k] if c in layer_modules]
        if before and before[-1] not in norm_of and io[before[-1]][1] is not None \
                and io[before[-1]][1].dim() >= 2 and io[before[-1]][1].shape[1] == m.num_features:
            untraced_norm.setdefault(trace.names[before[-1]], trace.names[m])
    return untraced_norm


def example_input(model: nn.Module, inputs: torch.Tensor, task_labels=None, n: int = 2):
    """The example batch :func:`discover_layers` traces: the first ``n`` samples, paired with their
    task labels for Avalanche multi-task models (up to ``n`` samples of the first sample's task).

    Example:
        >>> example_input(nn.Linear(3, 2), torch.zeros(5, 3)).shape
        torch.Size([2, 3])
    """
    if task_labels is None or not is_multitask(model):
        return inputs[:n]
    # samples of the first sample's task only: one int label, Avalanche's single-task path (its
    # mixed-task path needs ``max_class_label`` set, which user modules often lack)
    labels = torch.as_tensor(task_labels).reshape(-1).to(inputs.device)
    index = (labels == labels[0]).nonzero().reshape(-1)[:n]
    return inputs[index], int(labels[0])
