"""Work-arounds for known Avalanche 0.6 defects that affect comparisons with this package.

``fix_synaptic_intelligence_on_cpu``: Avalanche 0.6's ``SynapticIntelligencePlugin`` stores
parameter snapshots with ``param.detach().cpu().flatten()``. On CPU that is a *view* of the live
parameter, so every "old" snapshot moves with the weights: importances and the penalty stay
exactly 0 for any ``si_lambda`` (SI silently degenerates to Naive). Its helpers are called as
``SynapticIntelligencePlugin.extract_weights(...)``, so a subclass cannot override them; the fix
replaces the static method on the class with one that stores copies.

``fix_checkpoint_pickling``: Avalanche's ``save_checkpoint`` pickles the whole strategy with
``dill``. torch 2.14 removes the submodule attributes of ``torch.optim`` (``torch.optim.sgd`` is in
``sys.modules`` but not an attribute), so dill cannot find ``torch.optim.sgd.SGD`` by reference,
falls back to pickling the class by value and fails (``Can't pickle sentinel``). Re-exposing the
loaded submodules as attributes restores pickling by reference; nothing else changes.
"""

from __future__ import annotations

import sys

import torch

__all__ = ["fix_synaptic_intelligence_on_cpu", "fix_checkpoint_pickling"]


@torch.no_grad()
def _extract_weights_copy(model, target, excluded_parameters):
    from avalanche.training.plugins import SynapticIntelligencePlugin

    for name, param in SynapticIntelligencePlugin.allowed_parameters(model, excluded_parameters):
        target[name].data = param.detach().cpu().flatten().clone()


def fix_synaptic_intelligence_on_cpu() -> None:
    """Make ``SynapticIntelligencePlugin`` store weight copies (idempotent, process-wide).

    Call once before building SI strategies. Harmless on CUDA (``.cpu()`` already copies there).
    """
    from avalanche.training.plugins import SynapticIntelligencePlugin

    SynapticIntelligencePlugin.extract_weights = staticmethod(_extract_weights_copy)


def fix_checkpoint_pickling() -> None:
    """Let ``dill`` (Avalanche's checkpoint pickler) find torch optimizers by reference (idempotent)."""
    import torch.optim

    for name, module in list(sys.modules.items()):
        parts = name.split(".")
        if len(parts) == 3 and name.startswith("torch.optim.") and not hasattr(torch.optim, parts[2]):
            setattr(torch.optim, parts[2], module)
