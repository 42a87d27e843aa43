"""How a unit mask lives on a model: a ``unit_mask`` buffer, a forward hook, two ``load_state_dict`` hooks.

Each masked layer (a hidden ``Linear`` / ``Conv`` of :class:`~avalanche_plugins.structural.masks.UnitMasks`)
carries its mask as a **registered buffer** ``unit_mask`` (bool, one entry per unit, ``True`` =
active) on the layer module itself, so the mask is part of the model's state:

* ``model.state_dict()`` holds ``"<layer>.unit_mask"`` next to ``"<layer>.weight"``, and
  ``model.load_state_dict(saved)`` restores the mask *with* the weights it was saved with (Avalanche's
  ``EarlyStoppingPlugin`` returning to its best epoch, a best-model reload, a checkpoint);
  ``model.to(device)``, ``copy.deepcopy`` and pickling carry it like any buffer.
* After a load, :class:`_Reloaded` (a ``load_state_dict`` post-hook on every module whose tensors hold
  unit-indexed entries) re-snapshots the masked entries from the loaded values, so
  :meth:`UnitMasks.restore` keeps the loaded weights of the units masked in the loaded state, and units
  that were live in it are live (and train) again.
* A state dict *without* the entry (saved from a plain model, or before the masks existed) loads with
  ``strict=True`` too: :class:`_KeepMask` (a pre-hook) keeps the current mask and warns.
* A plain model (no buffer) refuses a masked model's state dict with torch's "Unexpected key(s) ...
  unit_mask"; :meth:`UnitMasks.export` gives the state dict a plain model loads and computes the masked
  model's function with.

The forward hook :class:`_MaskHook` reads the buffer at every call (``out * unit_mask`` along the unit
dimension), so a loaded, moved or edited mask applies at once. All hooks are plain objects, so models
pickle with pickle/dill; the post-hook refers to its ``UnitMasks`` weakly and a copied model's one is
inert until a ``UnitMasks`` attaches to it (:meth:`UnitMasks.attach`, run again after unpickling).
"""

from __future__ import annotations

import warnings
import weakref

import torch
from torch import nn

__all__ = ["MASK_BUFFER", "remove_mask_hooks"]

MASK_BUFFER = "unit_mask"


class _MaskHook:
    """Forward hook ``out * unit_mask`` along the unit dimension, the mask read from the ``unit_mask``
    buffer of ``owner`` (the masked layer); optionally records the pre-mask output (for scores).

    ``stash`` holds the mask while the buffer is not registered (:func:`remove_mask_hooks`,
    :meth:`UnitMasks.detach`), so the object still answers :attr:`mask`."""

    def __init__(self, owner: nn.Module | None, unit_dim: int, stash: torch.Tensor | None = None):
        self.owner = owner
        self.unit_dim = unit_dim
        self.stash = stash
        self.capture: list | None = None

    @property
    def mask(self) -> torch.Tensor:
        """The bool mask (the live buffer: edit it in place)."""
        buffer = self.owner._buffers.get(MASK_BUFFER) if self.owner is not None else None
        return buffer if buffer is not None else self.stash

    # the name of the float multiplier this mask replaced (kept for code written against it)
    multiplier = mask

    def register(self) -> None:
        """Register the stash as the owner's buffer (replacing one a copied model brought along);
        no-op when nothing is stashed."""
        if self.owner is not None and self.stash is not None:
            self.owner.register_buffer(MASK_BUFFER, self.stash)
            self.stash = None

    def unregister(self) -> None:
        """Remove the buffer from the owner, keeping its value in the stash."""
        if self.owner is not None and MASK_BUFFER in self.owner._buffers:
            self.stash = self.owner._buffers.pop(MASK_BUFFER)

    def shape_for(self, out: torch.Tensor) -> list[int]:
        shape = [1] * out.dim()
        shape[self.unit_dim if self.unit_dim >= 0 else out.dim() + self.unit_dim] = -1
        return shape

    def __call__(self, module, inputs, out):
        if self.capture is not None:
            self.capture.append(out.detach())
        mask = self.mask
        if mask.device != out.device:
            mask = mask.to(out.device)
        return out * mask.view(self.shape_for(out))

    def __getstate__(self):
        return {"owner": self.owner, "unit_dim": self.unit_dim, "stash": self.stash}

    def __setstate__(self, state):
        if "multiplier" in state:  # pickled before the mask became a buffer: UnitMasks.__setstate__ binds it
            self.__init__(None, state["unit_dim"], state["multiplier"] > 0)
        else:
            self.__init__(state["owner"], state["unit_dim"], state.get("stash"))


class _KeepMask:
    """``load_state_dict`` pre-hook of a masked layer: a state dict without ``<prefix>unit_mask`` keeps
    the current mask (with a warning); one whose entry is not 0/1 is refused."""

    def __call__(self, module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                 error_msgs):
        current = module._buffers.get(MASK_BUFFER)
        if current is None:
            return
        key = prefix + MASK_BUFFER
        if key not in state_dict:
            state_dict[key] = current.detach().clone()
            warnings.warn(
                f"UnitMasks: the state_dict loaded into layer {prefix[:-1] or '(root)'!r} has no {key!r} entry "
                "(saved from a model without unit masks, or before they were created): its current mask is "
                f"kept ({int(current.sum())} of {current.numel()} units active). A masked model's own "
                "state_dict carries its masks; UnitMasks.export() gives the state_dict of a plain model",
                stacklevel=2)
            return
        value = torch.as_tensor(state_dict[key])
        if value.dtype != torch.bool and value.numel() and not bool(((value == 0) | (value == 1)).all()):
            error_msgs.append(f"UnitMasks: {key!r} must be boolean or hold only 0/1 (a unit mask), got values "
                              f"{torch.unique(value[(value != 0) & (value != 1)]).tolist()[:5]}")


class _Reloaded:
    """``load_state_dict`` post-hook: the owning :class:`UnitMasks` re-snapshots its masked entries from
    the loaded values. Refers to the masks weakly; a copy (deepcopy, pickle) is inert until
    :meth:`UnitMasks.attach` replaces it."""

    def __init__(self, masks=None):
        self._ref = weakref.ref(masks) if masks is not None else None

    @property
    def masks(self):
        return self._ref() if self._ref is not None else None

    def __call__(self, module, incompatible_keys):
        masks = self.masks
        if masks is not None:
            masks._refreeze()

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self._ref = None

    def __deepcopy__(self, memo):
        return _Reloaded()


def _hooks_of(registry, kind):
    """``[(key, hook)]`` of the hooks of type ``kind`` in a module's hook dict (pre-hooks come wrapped)."""
    return [(key, hook) for key, hook in registry.items() if isinstance(getattr(hook, "hook", hook), kind)]


def install_load_hooks(owner: nn.Module, modules: list[nn.Module], masks) -> None:
    """The pre-hook on the buffer's ``owner``, a post-hook bound to ``masks`` on each of ``modules`` (the
    modules holding the layer's unit-indexed tensors), replacing earlier ones (copies) of either kind."""
    if not _hooks_of(owner._load_state_dict_pre_hooks, _KeepMask):
        owner.register_load_state_dict_pre_hook(_KeepMask())
    for module in modules:
        present = _hooks_of(module._load_state_dict_post_hooks, _Reloaded)
        if any(hook.masks is masks for _, hook in present):
            continue
        for key, _ in present:
            del module._load_state_dict_post_hooks[key]
        module.register_load_state_dict_post_hook(_Reloaded(masks))


def remove_load_hooks(module: nn.Module, masks=None) -> None:
    """Remove the mask load hooks from ``module`` (the post-hooks of ``masks`` only, when given)."""
    if masks is None:
        for key, _ in _hooks_of(module._load_state_dict_pre_hooks, _KeepMask):
            del module._load_state_dict_pre_hooks[key]
    for key, hook in _hooks_of(module._load_state_dict_post_hooks, _Reloaded):
        if masks is None or hook.masks is masks:
            del module._load_state_dict_post_hooks[key]


def remove_mask_hooks(model: nn.Module) -> int:
    """Make ``model`` plain again (e.g. a ``deepcopy`` meant to be dense): remove every unit-mask
    forward hook, its ``unit_mask`` buffer and the load hooks; parameters are untouched (masked units
    compute again). Returns the number of mask hooks removed.

    Example:
        >>> from avalanche_plugins.structural import UnitMasks
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> masks = UnitMasks(net, torch.randn(2, 3))
        >>> sorted(net.state_dict())
        ['0.bias', '0.unit_mask', '0.weight', '2.bias', '2.weight']
        >>> remove_mask_hooks(net), sorted(net.state_dict())
        (1, ['0.bias', '0.weight', '2.bias', '2.weight'])
    """
    removed = 0
    for module in model.modules():
        for key, hook in list(module._forward_hooks.items()):
            if isinstance(hook, _MaskHook):
                hook.unregister()
                del module._forward_hooks[key]
                removed += 1
        remove_load_hooks(module)
    return removed
