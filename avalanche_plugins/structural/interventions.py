"""What happens to a unit when Grow recruits it.

Recruitment interventions (:meth:`UnitMasks.grow`), each with the public code that uses it:

* ``optimizer_state``: ``keep`` (whatever the optimizer holds), ``zero`` (the newborn entries of
  every per-parameter state tensor — momentum, Adam moments — are set to 0, as RigL and NeurOps
  do), ``fresh`` (zeroed moments *and* an Adam bias correction with the unit's own step count, as
  if a fresh optimizer had been created for it, as Firefly / open_lth restart optimizers).
  ``torch.optim.Adam`` keeps one ``step`` per parameter tensor, so zeroed moments alone are
  bias-corrected with the tensor's large step count and start tiny. ``fresh`` therefore redoes
  the newborn entries' update after each step: Adam's moment updates do not depend on the step
  count, only the update ``lr·m̂/(√v̂+ε)`` does, so ``p = p_before - lr·(m/(1-β₁ᵏ))/(√(v/(1-β₂ᵏ))+ε)``
  (AdamW also ``- lr·wd·p_before``) with ``k`` the unit's age in steps is exact. For SGD,
  ``fresh`` equals ``zero`` (a fresh momentum buffer starts at the first gradient, which is what a
  zeroed buffer gives with ``dampening=0``).
* ``incoming``: ``as_is`` (the frozen values) or ``reinit`` (PyTorch's default init of the row:
  ``U(-1/√fan_in, 1/√fan_in)`` for weight and bias; BN affine 1/0, running stats 0/1).
* ``outgoing``: ``as_is`` or ``zero`` (function-preserving, as in Continual Backprop and NeurOps:
  the network's output is unchanged on every input). Only the *outgoing* weights are zeroed: a
  unit whose incoming weights and bias are zero has ``z_u = 0`` and, with ReLU,
  ``relu'(0) = 0``, so it would be dead, not just starved.
* ``newborn_lr`` / ``newborn_lr_halflife``: a learning-rate multiplier
  ``1 + (newborn_lr - 1)·2^(-age/halflife)`` on the newborn entries, applied exactly for any
  optimizer by scaling the step they took (``p = p_before + mult·(p_after - p_before)``).

"Newborn entries" are a recruited unit's incoming row, bias, BN affine parameters and outgoing
columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from avalanche_plugins.core.checks import check_choice, check_positive
from avalanche_plugins.core.optim import adam_update
from avalanche_plugins.structural.slots import MaskedLayer, Slot

__all__ = ["INCOMING", "OPTIMIZER_STATES", "OUTGOING", "Interventions", "check_fresh_optimizer", "fresh_adam_update",
           "reinit_rows", "zero_optimizer_entries"]


OPTIMIZER_STATES = ("keep", "zero", "fresh")



INCOMING = ("as_is", "reinit")



OUTGOING = ("as_is", "zero")



@dataclass(frozen=True)
class Interventions:
    """How recruited units enter training (module docstring; defaults change nothing).

    Example:
        >>> Interventions(outgoing="zero", newborn_lr=3.0).lr_multiplier(age=100)  # halflife 100
        2.0
    """

    optimizer_state: str = "keep"
    incoming: str = "as_is"
    outgoing: str = "as_is"
    newborn_lr: float = 1.0
    newborn_lr_halflife: float = 100.0

    def __post_init__(self):
        check_choice("optimizer_state", self.optimizer_state, OPTIMIZER_STATES)
        check_choice("incoming", self.incoming, INCOMING)
        check_choice("outgoing", self.outgoing, OUTGOING)
        check_positive("newborn_lr", self.newborn_lr)
        check_positive("newborn_lr_halflife", self.newborn_lr_halflife)

    def lr_multiplier(self, age):
        """``1 + (newborn_lr - 1)·2^(-age/halflife)`` (a float or a tensor of ages)."""
        return 1.0 + (self.newborn_lr - 1.0) * 0.5 ** (age / self.newborn_lr_halflife)



def reinit_rows(layer: MaskedLayer, units: torch.Tensor) -> None:
    """PyTorch's default init, ``U(±1/√fan_in)``, for the rows of ``units``; BN to 1/0, 0/1."""
    weight = layer.module.weight
    fan_in = weight[0].numel()
    bound = 1.0 / math.sqrt(fan_in)
    rows = torch.empty((units.numel(), *weight.shape[1:]), device=weight.device, dtype=weight.dtype)
    weight.data[units] = rows.uniform_(-bound, bound)
    if getattr(layer.module, "bias", None) is not None:
        layer.module.bias.data[units] = torch.empty(units.numel(), device=weight.device).uniform_(-bound, bound)
    if layer.norm is not None:
        for attr, value in (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.0), ("running_var", 1.0)):
            tensor = getattr(layer.norm, attr, None)
            if tensor is not None:
                tensor.data[units] = value



def zero_optimizer_entries(optimizer, slots: list[Slot], units: torch.Tensor) -> None:
    """Zero the entries of ``units`` in every per-parameter state tensor shaped like its parameter
    (momentum buffers, Adam moments); step counts and the parameter groups are left alone."""
    for slot in slots:
        param = slot.tensor
        state = optimizer.state.get(param, {})
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.shape == param.shape:
                value.index_fill_(slot.dim, slot.indices(units), 0.0)



def check_fresh_optimizer(optimizer) -> None:
    """Refuse an optimizer ``optimizer_state="fresh"`` cannot make fresh for newborn entries: one
    other than SGD / Adam / AdamW, or an SGD parameter group with momentum and ``dampening > 0`` (a
    fresh momentum buffer starts at the gradient, a zeroed one at ``(1 - dampening)·gradient``).

    Example:
        >>> w = torch.nn.Parameter(torch.zeros(2))
        >>> check_fresh_optimizer(torch.optim.SGD([w], lr=0.1, momentum=0.9))
        >>> check_fresh_optimizer(torch.optim.SGD([w], lr=0.1, momentum=0.9, dampening=0.1))
        Traceback (most recent call last):
        ...
        ValueError: optimizer_state='fresh' with SGD momentum=0.9 and dampening=0.1 (parameter group 0): a fresh momentum buffer starts at the gradient, a zeroed one at (1 - dampening)·gradient, so the newborn entries would not see a fresh optimizer; use dampening=0, or optimizer_state='zero'
    """
    if not isinstance(optimizer, (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)):
        raise ValueError("optimizer_state='fresh' supports SGD, Adam and AdamW, got "
                         f"{type(optimizer).__name__}: use optimizer_state='zero' or 'keep'")
    if isinstance(optimizer, torch.optim.SGD):
        for i, group in enumerate(optimizer.param_groups):
            if group.get("momentum", 0) and group.get("dampening", 0):
                raise ValueError(
                    f"optimizer_state='fresh' with SGD momentum={group['momentum']} and dampening="
                    f"{group['dampening']} (parameter group {i}): a fresh momentum buffer starts at the "
                    "gradient, a zeroed one at (1 - dampening)·gradient, so the newborn entries would not "
                    "see a fresh optimizer; use dampening=0, or optimizer_state='zero'")


def fresh_adam_update(optimizer, param, dim, idx, before, age):
    """Adam/AdamW update of the entries ``idx`` with per-entry step counts ``age`` (None for
    SGD, which needs no correction), with the settings (``lr``, ``betas``, ``eps``,
    ``weight_decay``, ``amsgrad``, ``maximize``) of the parameter group holding ``param``; the
    groups are only read."""
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return None
    state = optimizer.state.get(param)
    if not state or "exp_avg" not in state:
        return None
    group = next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))
    beta1, beta2 = group["betas"]
    lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
    m = state["exp_avg"].index_select(dim, idx)
    v = state["max_exp_avg_sq" if group.get("amsgrad") else "exp_avg_sq"].index_select(dim, idx)
    update = -adam_update(m, v, age, lr, (beta1, beta2), eps)
    if group.get("maximize"):
        update = -update
    decoupled = isinstance(optimizer, torch.optim.AdamW) or group.get("decoupled_weight_decay", False)
    if decoupled and wd:
        update = update - lr * wd * before
    return update
