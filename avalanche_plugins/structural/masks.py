"""Unit masks: switch hidden neurons / conv channels off and on without changing any shape.

Grow and Prune ("On the Stability of Growth in Structural Plasticity", arXiv 2605.15435) edit a
network at the level of *units*: the neurons of a hidden ``Linear`` and the output channels of a
hidden ``Conv2d``; the output head is never masked. :class:`UnitMasks` keeps one boolean mask per
maskable hidden layer of the layer map (:func:`avalanche_plugins.core.layers.discover_layers`) and
applies it without touching parameter shapes or the set of ``Parameter`` objects, so Avalanche's
optimizer bookkeeping, EWC/SI/Replay and checkpoints keep working.

How a mask is applied (all exact, all cheap):

* **State.** Each layer's mask is a bool buffer ``unit_mask`` on the layer module, so it is part of
  the model's ``state_dict``: ``load_state_dict`` (Avalanche's ``EarlyStoppingPlugin``, a best-model
  reload, a checkpoint) restores the mask a state was saved with, and the masked entries are
  re-snapshotted from the loaded values (:mod:`~avalanche_plugins.structural.hooks`).
  :meth:`UnitMasks.export` gives the plain ``state_dict`` of the compact model.
* **Output.** A forward hook multiplies the unit's output by its 0/1 mask, so a masked unit
  outputs exactly 0 (its post-activation is ``φ(0)``, i.e. 0 for ReLU, leaky ReLU, tanh, GELU,
  CReLU; a sigmoid unit would still emit the constant ``σ(0)``).
* **BatchNorm.** If the layer is followed by a BatchNorm (``layer.norm`` in the layer map), the hook
  sits on the BatchNorm's output instead of the layer's: BN normalises each channel on its own, so
  masking after it zeroes the unit exactly, while masking before it would let BN's shift ``β`` and
  running mean leak through. Layers followed by a norm that mixes units (LayerNorm, GroupNorm) are
  not maskable and are skipped.
* **Parameters.** Zeroing gradients is not enough (weight decay and momentum / Adam moments still
  move the weights), so after every optimizer step :meth:`UnitMasks.restore` copies the masked
  entries back from a snapshot taken when the mask last changed (``index_copy_`` on the masked
  rows only). A masked unit's frozen entries are its incoming weight row and bias, the following
  BatchNorm's ``weight``/``bias`` and running statistics, and its outgoing weights (the columns
  of the layer that consumes it), so "as is" at recruitment means the values it was frozen with.
  The optimizer's own state for masked entries is left to the optimizer (see ``optimizer_state``
  in :meth:`UnitMasks.grow`).

Outgoing weights: the consumer of a layer is the first later layer of the layer map whose input
changes when one of the layer's units is perturbed, measured once at construction (and by
:meth:`UnitMasks.sync`) by :func:`avalanche_plugins.core.consumers.find_consumer`: one forward
pass in eval mode per layer, ``1 + 4⌈log₂ n⌉`` perturbed copies (units perturbed in groups by the
bits of their index), stopped at the consumer. It maps each unit to the consumer's input columns
it feeds, so ``Flatten`` after a conv (one block of ``H·W`` columns per channel), pooling and CReLU
(two columns per unit) are all handled; the columns are recorded when the consumer is a dense
``Linear`` / ``Conv`` and every unit feeds the same number of columns of its own. Only that one
consumer is recorded (sequential models; in a residual block the skip path is not).

Scores are in :mod:`~avalanche_plugins.structural.scores`, recruitment interventions in
:mod:`~avalanche_plugins.structural.interventions`. This module is over 400 lines for one reason: it
holds one class, :class:`UnitMasks`, whose hooks, snapshots and edits maintain one invariant
(masked units output 0 and keep their parameters) and are only correct together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from avalanche_plugins.core.calls import model_forward
from avalanche_plugins.core.checks import check_model_inputs
from avalanche_plugins.core.consumers import find_consumer
from avalanche_plugins.core.layers import LayerMap, discover_layers
from avalanche_plugins.structural.hooks import (  # _MaskHook here too: masks pickled before it moved load
    MASK_BUFFER,
    _MaskHook,
    install_load_hooks,
    remove_load_hooks,
    remove_mask_hooks,
)
from avalanche_plugins.structural.interventions import (
    Interventions,
    check_fresh_optimizer,
    fresh_adam_update,
    reinit_rows,
    zero_optimizer_entries,
)
from avalanche_plugins.structural.selection import highest_masked, lowest_active
from avalanche_plugins.structural.slots import MaskedLayer, Slot

__all__ = ["UnitMasks", "remove_mask_hooks"]


# the slot types under their former names, so that UnitMasks pickled before they became public load
_Slot, _Layer = Slot, MaskedLayer


def _example_tensor(example_input):
    x = example_input[0] if isinstance(example_input, (tuple, list)) else example_input
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"example_input must be a tensor (or a (tensor, task_labels) pair): UnitMasks "
                        f"probes units by batching copies of one input tensor, got {type(x).__name__} "
                        "(models taking dicts or several inputs are not supported)")
    return x


def _forward(model, example_input, x=None):
    """Model output on ``x`` (default: the example), with the example's task labels if any."""
    if isinstance(example_input, (tuple, list)):
        xs, t = example_input[0], torch.as_tensor(example_input[1])
        x = xs if x is None else x
        t = t.reshape(-1)[:1].expand(x.shape[0]) if t.dim() else t
        return model_forward(model, x, t)
    return model_forward(model, example_input if x is None else x)


class UnitMasks:
    """One boolean unit mask per maskable hidden layer of ``model`` (see the module docstring).

    A layer is maskable if it is a ``Linear`` (units = output features) or ``Conv`` (units =
    output channels) of the layer map, is not the last layer (the head), and is followed by no
    norm or by a BatchNorm. All masks start full (every unit active); hooks are attached at once.

    The masks are the layers' ``unit_mask`` buffers (``model.state_dict()["<layer>.unit_mask"]``):
    a state dict saved from the masked model restores its masks on ``load_state_dict``, with the
    masked units frozen at the loaded values; one without the entries (a plain model's) keeps the
    current masks and warns. :meth:`export` gives the state dict of the compact model for a plain
    copy of the architecture.

    Keep parameters exact by calling :meth:`step` instead of ``optimizer.step()`` (or
    :meth:`before_step` / ``optimizer.step()`` / :meth:`after_step`, which the plugins do from
    ``before_update`` / ``after_update``).

    Args:
        model: the network (any layout :func:`~avalanche_plugins.core.layers.discover_layers`
            handles; outgoing weights are found for sequential models).
        example_input: one example batch (tensor, or ``(x, task_labels)``), two samples suffice.
        activation: ``φ`` used by the activation score and the activation diagnostics
            (default ReLU; pass e.g. ``functools.partial(F.leaky_relu, negative_slope=0.01)``).

    Raises:
        ValueError: ``model`` has no maskable hidden layer.

    Example:
        >>> torch.manual_seed(0) is not None
        True
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> masks = UnitMasks(net, torch.randn(2, 3))
        >>> masks.set_masks({"0": torch.tensor([True, False, True, False])})
        >>> masks.active_counts(), masks.compactness()
        ({'0': 2}, 0.5)
        >>> hidden = net[:2](torch.randn(5, 3))
        >>> bool((hidden[:, [1, 3]] == 0).all())
        True
    """

    def __init__(self, model: nn.Module, example_input, *, activation: Callable = torch.relu,
                 layer_map: LayerMap | None = None):
        check_model_inputs(model, example_input[0] if isinstance(example_input, (tuple, list)) else example_input, "example_input")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        self.model = model
        self.activation = activation
        layer_map = layer_map if layer_map is not None else discover_layers(model, example_input)
        self.layers: dict[str, MaskedLayer] = {}
        skipped = {}
        for info in list(layer_map)[:-1]:  # the last layer is the head: never masked
            if info.kind not in ("linear", "conv"):
                skipped[info.name] = f"{info.kind} layer"
                continue
            if info.name in layer_map.untraced_norms:
                raise ValueError(
                    f"layer {info.name!r} feeds BatchNorm {layer_map.untraced_norms[info.name]!r} through an "
                    "operation the trace cannot see (an activation called as a function in forward): a "
                    "mask before that norm would not zero the unit after it. Use an activation module "
                    "(nn.ReLU(), ...) between them, or put the BatchNorm right after the layer")
            norm = layer_map.norms.get(info.norm) if info.norm is not None else None
            if norm is not None and not isinstance(norm, nn.modules.batchnorm._BatchNorm):
                skipped[info.name] = f"followed by {type(norm).__name__}, which mixes units"
                continue
            self.layers[info.name] = self._build_layer(info, norm)
        if not self.layers:
            raise ValueError(
                f"model {type(model).__name__} has no maskable hidden layer (a Linear or Conv "
                f"layer before the head, followed by no norm or a BatchNorm); layers: "
                f"{layer_map.names}" + (f", skipped: {skipped}" if skipped else ""))
        self.skipped = skipped
        for name, slot in self._find_consumers(layer_map, example_input).items():
            self.layers[name].outgoing, self.layers[name].consumer = slot, slot.path
        self.steps = 0  # optimizer steps seen by after_step (unit ages are counted in these)
        self.interventions = Interventions()  # the default of grow(); never changed by grow()
        self._grown_with: Interventions | None = None  # those of the last grow(), for its newborns
        self.born: dict[str, torch.Tensor] = {
            name: torch.full((layer.size,), -1, dtype=torch.long, device=layer.hook.mask.device)
            for name, layer in self.layers.items()}  # step at recruitment, -1: never recruited
        self.last_grow_step: int | None = None
        self._frozen: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._before: dict[int, torch.Tensor] = {}
        self.attach()
        self._refreeze()

    # --------------------------------------------------------------------------------- setup

    def _build_layer(self, info, norm) -> MaskedLayer:
        module = info.module
        device = next(module.parameters()).device
        point = norm if norm is not None else module
        for key, hook in list(point._forward_hooks.items()):
            if isinstance(hook, _MaskHook):  # a copied masked model's hook: this object's replaces it
                del point._forward_hooks[key]
        if hasattr(module, MASK_BUFFER) and MASK_BUFFER not in module._buffers:
            raise ValueError(f"layer {info.name!r} ({type(module).__name__}) has an attribute {MASK_BUFFER!r} "
                             "that is not a unit-mask buffer, and UnitMasks keeps each layer's mask in a buffer "
                             "of that name: rename the attribute")
        # the mask waits in the hook's stash; attach() registers it as the buffer once construction succeeded
        stash = torch.ones(info.out_units, dtype=torch.bool, device=device)
        hook = _MaskHook(module, unit_dim=-1 if info.kind == "linear" else 1, stash=stash)
        incoming = [Slot(module, n, 0) for n in ("weight", "bias") if getattr(module, n, None) is not None]
        buffers = []
        if norm is not None:
            incoming += [Slot(norm, n, 0) for n in ("weight", "bias") if getattr(norm, n, None) is not None]
            buffers = [Slot(norm, n, 0) for n in ("running_mean", "running_var")
                       if getattr(norm, n, None) is not None]
        return MaskedLayer(info.name, module, info.kind, norm, hook, incoming, buffers, None, None)

    @torch.no_grad()
    def _find_consumers(self, layer_map: LayerMap, example_input) -> dict[str, Slot]:
        """The outgoing slot (consumer weight columns) of each layer whose consumer
        (:func:`~avalanche_plugins.core.consumers.find_consumer`) is a dense ``Linear`` or ``Conv``
        that each unit feeds through the same number of its own input columns."""
        found: dict[str, Slot] = {}
        order = layer_map.names
        x = _example_tensor(example_input)[:1]
        for name, layer in self.layers.items():
            consumer = find_consumer(
                self.model, layer.norm if layer.norm is not None else layer.module, n_units=layer.size,
                unit_dim=layer.hook.unit_dim, later=[layer_map[n] for n in order[order.index(name) + 1:]],
                run=lambda batch: _forward(self.model, example_input, batch), x=x)
            if consumer is None:
                continue
            info, columns = consumer.layer, consumer.columns()
            if info.kind in ("linear", "conv") and getattr(info.module, "groups", 1) == 1 and columns is not None:
                found[name] = Slot(info.module, "weight", 1, columns, root=self.model, path=info.name)
        return found

    # ------------------------------------------------------------------------------- hooks

    def attach(self) -> None:
        """(Re-)register each layer's ``unit_mask`` buffer, forward hook and load hooks
        (:mod:`~avalanche_plugins.structural.hooks`); idempotent."""
        for layer in self.layers.values():
            layer.hook.register()
            point = layer.norm if layer.norm is not None else layer.module
            if not any(h is layer.hook for h in point._forward_hooks.values()):
                point.register_forward_hook(layer.hook)
            install_load_hooks(layer.module, self._tensor_modules(layer), self)

    def detach(self) -> None:
        """Remove this object's hooks and mask buffers: the model becomes a plain model again (dense,
        its ``state_dict`` without ``unit_mask`` entries; parameters untouched). :meth:`attach` puts
        them back with the masks they had."""
        for layer in self.layers.values():
            point = layer.norm if layer.norm is not None else layer.module
            for key, hook in list(point._forward_hooks.items()):
                if hook is layer.hook:
                    del point._forward_hooks[key]
            layer.hook.unregister()
            for module in self._tensor_modules(layer):
                remove_load_hooks(module, self)

    @staticmethod
    def _tensor_modules(layer: MaskedLayer) -> list[nn.Module]:
        """The distinct modules holding the layer's unit-indexed tensors (layer, norm, consumers)."""
        found: dict[int, nn.Module] = {}
        for slot in layer.param_slots + layer.norm_buffers:
            module = slot.module
            found.setdefault(id(module), module)
        found.setdefault(id(layer.module), layer.module)
        return list(found.values())

    def _keys(self) -> dict[int, str]:
        """``{id(tensor): state_dict key}`` of the model's parameters and buffers."""
        return {id(t): k for k, t in self.model.state_dict(keep_vars=True).items()}

    def mask_keys(self) -> list[str]:
        """The ``state_dict`` keys of the masks (``"<layer>.unit_mask"``), in layer order."""
        keys = self._keys()
        return [keys[id(layer.hook.mask)] for layer in self.layers.values() if id(layer.hook.mask) in keys]

    # ------------------------------------------------------------------------------ queries

    @property
    def names(self) -> list[str]:
        """Maskable layer names, in execution order."""
        return list(self.layers)

    @property
    def masks(self) -> dict[str, torch.Tensor]:
        """``{layer name: bool tensor (units,)}`` (copies)."""
        return {name: layer.hook.mask.clone() for name, layer in self.layers.items()}

    def sizes(self) -> dict[str, int]:
        return {name: layer.size for name, layer in self.layers.items()}

    def active_counts(self) -> dict[str, int]:
        return {name: int(layer.hook.mask.sum()) for name, layer in self.layers.items()}

    def compactness(self) -> float:
        """Fraction of hidden units active, ``Σ_ℓ active_ℓ / Σ_ℓ units_ℓ``."""
        return sum(self.active_counts().values()) / sum(self.sizes().values())

    def newborn(self) -> dict[str, torch.Tensor]:
        """Units recruited by the last :meth:`grow` and active (all False before any growth; a unit
        masked again since, by a ``load_state_dict`` of an earlier state, is not newborn)."""
        step = self.last_grow_step
        return {name: (born == step) & self.layers[name].hook.mask if step is not None
                else torch.zeros_like(born, dtype=torch.bool) for name, born in self.born.items()}

    # ----------------------------------------------------------------------- freezing / steps

    @torch.no_grad()
    def _refreeze(self) -> None:
        """Snapshot the masked entries (call after every mask or parameter edit)."""
        self._frozen = {}
        for name, layer in self.layers.items():
            off = (~layer.hook.mask).nonzero().reshape(-1)
            if off.numel() == 0:
                continue
            for i, slot in enumerate(layer.param_slots + layer.norm_buffers):
                idx = slot.indices(off)
                self._frozen[(name, i)] = (idx, slot.tensor.detach().index_select(slot.dim, idx).clone())

    @torch.no_grad()
    def sync(self, example_input=None) -> None:
        """Follow tensors that grew since the snapshot (Avalanche's ``IncrementalClassifier`` replaces its
        ``Linear`` by a larger one, old rows copied): masked entries keep their frozen values, the new
        rows' entries are frozen at their current (initial) values. With ``example_input`` (a batch of
        the task about to be trained) it also finds the consumer of each layer for that task: a task
        head that ``MultiHeadClassifier`` added is frozen and edited like the first one, and becomes
        the head the gradient score reads. Call it after model adaptation, before the first
        optimizer step (the plugins do, in ``before_training_exp``)."""
        self._follow_grown_tensors()
        self.attach()  # load hooks on a consumer the model adaptation replaced
        if example_input is None:
            return
        changed = False
        for name, slot in self._find_consumers(discover_layers(self.model, example_input), example_input).items():
            layer = self.layers[name]
            if slot.path == layer.consumer:
                continue
            by_path = {known.path: known for known in layer.outgoing_slots}
            current = by_path.pop(slot.path, slot)  # a head seen before keeps its slot
            layer.outgoing, layer.consumer, layer.other_outgoing = current, current.path, list(by_path.values())
            changed = True
        if changed:
            # masked entries of known heads equal their frozen values here (restored after every
            # step); a new head's columns are frozen at their initial values
            self._refreeze()
            self.attach()

    def _follow_grown_tensors(self) -> None:
        """Extend frozen snapshots whose tensor grew (checked on shapes alone: this runs every step)."""
        for key, (idx, values) in list(self._frozen.items()):
            name, i = key
            layer = self.layers[name]
            slot = (layer.param_slots + layer.norm_buffers)[i]
            shape = list(slot.tensor.shape)
            shape[slot.dim] = idx.numel()
            if tuple(shape) == tuple(values.shape):
                continue
            if len(shape) != values.dim() or any(n < o for n, o in zip(shape, values.shape)):
                raise ValueError(f"the tensor behind masked entries of layer {name!r} shrank or changed rank: "
                                 f"{tuple(values.shape)} -> {tuple(shape)}")
            grown = slot.tensor.detach().index_select(slot.dim, idx).clone()
            grown[tuple(slice(0, n) for n in values.shape)] = values
            slot.tensor.data.index_copy_(slot.dim, idx, grown)
            self._frozen[key] = (idx, grown)

    @torch.no_grad()
    def restore(self) -> None:
        """Copy the masked entries back to their frozen values (exact)."""
        self._follow_grown_tensors()
        for (name, i), (idx, values) in self._frozen.items():
            layer = self.layers[name]
            slot = (layer.param_slots + layer.norm_buffers)[i]
            slot.tensor.data.index_copy_(slot.dim, idx, values)

    def _newborn_slots(self):
        """``[(tensor, dim, entry indices, unit birth steps)]`` of units still being corrected."""
        if self.last_grow_step is None:
            return []
        iv = self.newborn_interventions
        window = 0
        if iv.newborn_lr != 1.0:
            window = max(window, int(40 * iv.newborn_lr_halflife))
        if iv.optimizer_state == "fresh":
            window = max(window, 20000)  # 0.999^20000 ≈ 2e-9: Adam's bias corrections agree
        out = []
        for name, layer in self.layers.items():
            born = self.born[name]
            units = ((born >= 0) & (self.steps - born < window) & layer.hook.mask)
            units = units.nonzero().reshape(-1)
            if units.numel() == 0:
                continue
            for slot in layer.param_slots:
                idx = slot.indices(units)
                k = 1 if slot.columns is None else slot.columns.shape[1]
                out.append((slot.tensor, slot.dim, idx, born[units].repeat_interleave(k)))
        return out

    @torch.no_grad()
    def before_step(self) -> None:
        """Save the newborn entries' values if an intervention rewrites their update."""
        self._before = {}
        self._pending = self._newborn_slots()
        for j, (tensor, dim, idx, _) in enumerate(self._pending):
            self._before[j] = tensor.detach().index_select(dim, idx).clone()

    @torch.no_grad()
    def after_step(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Rewrite newborn updates (fresh Adam, LR multiplier), restore masked entries, count
        the step."""
        pending = getattr(self, "_pending", [])
        # read every "after" first: a newborn's outgoing columns can overlap the next layer's
        # newborn rows, and each entry must be rewritten once from its own before/after
        afters = [tensor.detach().index_select(dim, idx) for tensor, dim, idx, _ in pending]
        for j, (tensor, dim, idx, born) in enumerate(pending):
            before = self._before.get(j)
            if before is None:
                continue
            age = (self.steps + 1 - born).to(tensor.dtype)
            shape = [1] * tensor.dim()
            shape[dim] = -1
            age = age.view(shape)
            update = afters[j] - before
            if self.newborn_interventions.optimizer_state == "fresh" and optimizer is not None:
                fresh = fresh_adam_update(optimizer, tensor, dim, idx, before, age)
                if fresh is not None:
                    update = fresh
            if self.newborn_interventions.newborn_lr != 1.0:
                update = update * self.newborn_interventions.lr_multiplier(age)
            tensor.data.index_copy_(dim, idx, before + update)
        self._pending, self._before = [], {}
        self.restore()
        self.steps += 1

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()`` keeping masked entries exact and applying the interventions."""
        self.before_step()
        optimizer.step()
        self.after_step(optimizer)

    # ---------------------------------------------------------------------------- editing

    @torch.no_grad()
    def set_masks(self, masks: Mapping[str, torch.Tensor]) -> None:
        """Set masks directly (no intervention); layers not named keep theirs.

        Raises ``ValueError`` for an unknown layer name, a wrong mask size or values other than 0/1."""
        for name, mask in masks.items():
            if name not in self.layers:
                raise ValueError(f"masks: no maskable layer named {name!r}; layers are {self.names}")
            raw = torch.as_tensor(mask)
            if raw.dtype != torch.bool and not bool(((raw == 0) | (raw == 1)).all()):
                raise ValueError(f"masks[{name!r}] must be boolean or hold only 0/1, got values "
                                 f"{torch.unique(raw[(raw != 0) & (raw != 1)]).tolist()[:5]}")
            mask = raw.to(torch.bool)
            layer = self.layers[name]
            if mask.shape != (layer.size,):
                raise ValueError(f"masks[{name!r}] must have shape ({layer.size},), got {tuple(mask.shape)}")
            layer.hook.mask.copy_(mask.to(layer.hook.mask.device))
        self._refreeze()

    @torch.no_grad()
    def prune(self, scores: Mapping[str, torch.Tensor], counts: Mapping[str, int]) -> dict[str, torch.Tensor]:
        """Keep the ``counts[name]`` highest-scoring active units of each named layer, mask the
        rest (:func:`lowest_active`). Returns ``{name: removed unit indices}``."""
        removed = {}
        for name, keep in counts.items():
            mask = self.layers[name].hook.mask.clone()
            n_remove = int(mask.sum()) - int(keep)
            if n_remove < 0:
                raise ValueError(f"counts[{name!r}]={keep} exceeds the {int(mask.sum())} active units")
            removed[name] = lowest_active(scores[name], mask, n_remove)
            self.layers[name].hook.mask[removed[name]] = False
        self._refreeze()
        return removed

    @torch.no_grad()
    def rewind(self, state_dict: Mapping[str, torch.Tensor], *, buffers: bool = True) -> None:
        """Load ``state_dict`` into the model bit for bit (LTH rewinding) and refreeze; the masks are
        kept (a ``unit_mask`` entry of ``state_dict`` is ignored: use ``model.load_state_dict`` to
        return to a saved mask too).

        Parameters that grew since the snapshot (an ``IncrementalClassifier`` head) get the
        saved values in their leading slice; the new entries keep their values."""
        current = dict(self.model.named_parameters())
        if buffers:
            current.update(dict(self.model.named_buffers()))
        for key in self.mask_keys():  # rewinding restores weights, never the masks
            current.pop(key, None)
        for key, saved in state_dict.items():
            tensor = current.get(key)
            if tensor is None:
                continue
            if tensor.shape == saved.shape:
                tensor.data.copy_(saved)
            elif tensor.dim() == saved.dim() and all(a >= b for a, b in zip(tensor.shape, saved.shape)):
                tensor.data[tuple(slice(0, s) for s in saved.shape)] = saved
        self._refreeze()

    @torch.no_grad()
    def grow(self, scores: Mapping[str, torch.Tensor], counts: Mapping[str, int], *,
             interventions: Interventions | None = None,
             optimizer: torch.optim.Optimizer | None = None) -> dict[str, torch.Tensor]:
        """Activate the highest-scoring masked units until layer ``name`` has ``counts[name]``
        active units (:func:`highest_masked`), then apply ``interventions`` to the recruits.

        ``optimizer`` is needed for ``optimizer_state`` ``zero`` / ``fresh`` (its state tensors
        shaped like a parameter get the newborn entries zeroed). Returns
        ``{name: recruited unit indices}``.
        """
        iv = interventions if interventions is not None else self.interventions
        self._grown_with = iv  # the newborns' treatment in after_step; the default stays as it is
        if iv.optimizer_state != "keep" and optimizer is None:
            raise ValueError(f"optimizer_state={iv.optimizer_state!r} needs the optimizer")
        if iv.optimizer_state == "fresh":
            check_fresh_optimizer(optimizer)
        recruited = {}
        for name, target in counts.items():
            layer = self.layers[name]
            mask = layer.hook.mask.clone()
            n_add = int(target) - int(mask.sum())
            if n_add < 0:
                raise ValueError(f"counts[{name!r}]={target} is below the {int(mask.sum())} active units")
            if n_add > 0 and layer.outgoing is None and iv.outgoing == "zero":
                raise ValueError(f"outgoing='zero' needs the consumer of layer {name!r}, which "
                                 "was not found (non-sequential model)")
            units = highest_masked(scores[name], mask, n_add)
            recruited[name] = units
            if units.numel() == 0:
                continue
            if iv.incoming == "reinit":
                reinit_rows(layer, units)
            layer.hook.mask[units] = True
            if iv.outgoing == "zero":
                for slot in layer.outgoing_slots:  # every task head reading this layer
                    slot.tensor.data.index_fill_(1, slot.indices(units), 0.0)
            if iv.optimizer_state != "keep":
                zero_optimizer_entries(optimizer, layer.param_slots, units)
            self.born[name][units] = self.steps
        self.last_grow_step = self.steps
        self._refreeze()
        return recruited

    # ------------------------------------------------------------------------------ export

    @torch.no_grad()
    def export(self, *, zero_outgoing: bool = False) -> dict[str, torch.Tensor]:
        """The compact model as a plain ``state_dict``: a copy of the architecture without masks (no
        hooks, no ``unit_mask`` buffers) loads it with ``strict=True`` and computes the masked model's
        function, in training and evaluation mode.

        The ``unit_mask`` entries are left out and, for every masked unit, the entries that make its
        output are zeroed: its incoming weight row and bias and, when a BatchNorm follows, the norm's
        ``weight``, ``bias`` and ``running_mean``. The unit's pre-activation is then exactly 0 in a
        plain model, as under the mask (the activation's ``φ(0)`` follows in both). Its outgoing
        weights are kept (they multiply ``φ(0)``, which is 0 for ReLU, tanh, GELU and σ(0) for a
        sigmoid); with ``zero_outgoing=True`` they are zeroed too (the consumer's columns of every
        known head), which needs ``activation(0) == 0``. The model itself is not changed.

        Raises ``ValueError`` for ``zero_outgoing=True`` with ``activation(0) != 0`` or a layer with
        masked units whose consumer was not found.

        Example:
            >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
            >>> masks = UnitMasks(net, torch.randn(2, 3))
            >>> masks.set_masks({"0": torch.tensor([True, False, True, False])})
            >>> plain = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
            >>> plain.load_state_dict(masks.export())
            <All keys matched successfully>
            >>> x = torch.randn(5, 3)
            >>> torch.equal(plain(x), net(x)), plain[0].weight[1].abs().sum().item()
            (True, 0.0)
        """
        if zero_outgoing and float(self.activation(torch.zeros(1))) != 0.0:
            raise ValueError("export(zero_outgoing=True) needs activation(0) == 0 (the masked units then send "
                             f"nothing), but activation(0) = {float(self.activation(torch.zeros(1)))}: "
                             "export without zero_outgoing")
        keys = self._keys()
        skip = set(self.mask_keys())
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items() if k not in skip}
        for name, layer in self.layers.items():
            off = (~layer.hook.mask).nonzero().reshape(-1)
            if off.numel() == 0:
                continue
            slots = layer.incoming + [s for s in layer.norm_buffers if s.attr == "running_mean"]
            if zero_outgoing:
                if not layer.outgoing_slots:
                    raise ValueError(f"export(zero_outgoing=True): the consumer of layer {name!r} was not found "
                                     "(non-sequential model), so its outgoing weights are unknown")
                slots = slots + layer.outgoing_slots
            for slot in slots:
                state[keys[id(slot.tensor)]].index_fill_(slot.dim, slot.indices(off).to(slot.tensor.device), 0)
        return state

    # -------------------------------------------------------------------------- diagnostics

    @torch.no_grad()
    def unit_grad_norms(self) -> dict[str, torch.Tensor]:
        """Per-unit ``‖∂L/∂(incoming row, bias, BN affine)‖`` from the parameters' ``.grad``."""
        out = {}
        for name, layer in self.layers.items():
            total = torch.zeros(layer.size, device=layer.hook.mask.device)
            for slot in layer.incoming:
                grad = slot.tensor.grad
                if grad is not None:
                    total += grad.detach().pow(2).reshape(layer.size, -1).sum(1)
            out[name] = total.sqrt()
        return out

    def record_outputs(self, enabled: bool = True) -> None:
        """Start (or stop) capturing each masked layer's pre-mask output on every forward."""
        for layer in self.layers.values():
            layer.hook.capture = [] if enabled else None

    def pop_outputs(self) -> dict[str, list[torch.Tensor]]:
        """The captured pre-mask outputs since the last call (cleared)."""
        out = {}
        for name, layer in self.layers.items():
            out[name] = layer.hook.capture or []
            if layer.hook.capture is not None:
                layer.hook.capture = []
        return out

    def unit_activation_means(self, outputs: Mapping[str, list[torch.Tensor]], *,
                              masked: bool = True) -> dict[str, torch.Tensor]:
        """Per-unit mean of ``φ(z)`` over captured outputs (samples × positions); with
        ``masked`` the unit's real output ``φ(m·z)``, else as if unmasked."""
        out = {}
        for name, tensors in outputs.items():
            layer = self.layers[name]
            if not tensors:
                continue
            dim = layer.hook.unit_dim
            values = []
            for z in tensors:
                if masked:
                    z = z * layer.hook.mask.view(layer.hook.shape_for(z))
                a = self.activation(z).movedim(dim, 0).reshape(layer.size, -1)
                values.append(a)
            out[name] = torch.cat(values, 1).mean(1)
        return out

    @property
    def newborn_interventions(self) -> Interventions:
        """The interventions that treat the units born at the last :meth:`grow` (its argument, or
        :attr:`interventions` when it had none or before any grow)."""
        grown_with = getattr(self, "_grown_with", None)  # absent from masks pickled before it existed
        return self.interventions if grown_with is None else grown_with

    # ------------------------------------------------------------------------------- pickle

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_before"], state["_pending"] = {}, []
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        for layer in self.layers.values():
            if layer.hook.owner is None:  # pickled while the mask was a float multiplier, not a buffer
                layer.hook.owner = layer.module
        # the forward hooks came with the model; the load post-hooks are bound to this object again
        self.attach()


# ---------------------------------------------------------------------------------- helpers


# ------------------------------------------------------------------------------------ scores


