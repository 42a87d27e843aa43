"""The public slot types of unit masks: a :class:`Slot` is one tensor whose unit-indexed entries are
frozen or edited together; a :class:`MaskedLayer` is a masked layer with its incoming, outgoing and
normalisation slots. Shared by :mod:`~avalanche_plugins.structural.masks` (which builds them) and
:mod:`~avalanche_plugins.structural.interventions` (which edits them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["MaskedLayer", "Slot"]


@dataclass(eq=False)
class Slot:
    """One tensor of a layer whose unit-indexed entries are frozen / edited together."""

    owner: nn.Module
    attr: str  # parameter or buffer name on ``owner``
    dim: int  # unit dimension in the tensor
    columns: torch.Tensor | None = None  # (units, k) indices along ``dim``; None: index = unit
    # resolve the owner by path on every access: Avalanche replaces a growing head's Linear
    root: nn.Module | None = None
    path: str | None = None

    @property
    def module(self) -> nn.Module:
        """The module holding the tensor now."""
        return self.owner if self.root is None else self.root.get_submodule(self.path)

    @property
    def tensor(self) -> torch.Tensor:
        return getattr(self.module, self.attr)

    def indices(self, units: torch.Tensor) -> torch.Tensor:
        if self.columns is None:
            return units
        return self.columns[units].reshape(-1)


@dataclass(eq=False)
class MaskedLayer:
    """One masked layer: its unit mask hook and the tensors whose unit-indexed entries move with a unit."""

    name: str
    module: nn.Module
    kind: str  # "linear" or "conv"
    norm: nn.Module | None
    hook: Any  # hooks._MaskHook: the unit mask (``hook.mask``, the layer's ``unit_mask`` buffer)
    incoming: list[Slot]  # weight rows, bias, BN affine (parameters)
    norm_buffers: list[Slot]  # BN running statistics
    outgoing: Slot | None  # consumer weight columns (the consumer of the latest probed task)
    consumer: str | None
    other_outgoing: list[Slot] = field(default_factory=list)  # other task heads' columns

    @property
    def outgoing_slots(self) -> list[Slot]:
        return ([self.outgoing] if self.outgoing is not None else []) + self.other_outgoing

    @property
    def size(self) -> int:
        return self.hook.mask.numel()

    @property
    def param_slots(self) -> list[Slot]:
        return self.incoming + self.outgoing_slots
