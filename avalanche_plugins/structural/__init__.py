"""Structural plasticity ("On the Stability of Growth in Structural Plasticity"): unit-level masks
edited during training.

* :mod:`~avalanche_plugins.structural.masks` — :class:`UnitMasks` (masked units output exactly 0 and
  keep their parameters);
* :mod:`~avalanche_plugins.structural.hooks` — the masks as ``unit_mask`` buffers of the model's
  state (``state_dict`` / ``load_state_dict`` keep them; :meth:`UnitMasks.export` for plain models);
* :mod:`~avalanche_plugins.structural.scores` — unit scores and picking units by score;
* :mod:`~avalanche_plugins.structural.interventions` — what happens to a recruited unit;
* :mod:`~avalanche_plugins.structural.plugins` / :mod:`~avalanche_plugins.structural.metrics` —
  Grow / Prune / FixedMask plugins and cycle / newborn metrics (import ``avalanche``; not
  re-exported here).
"""

from avalanche_plugins.structural.interventions import (
    INCOMING,
    OPTIMIZER_STATES,
    OUTGOING,
    Interventions,
)
from avalanche_plugins.structural.masks import UnitMasks, remove_mask_hooks
from avalanche_plugins.structural.scores import (
    SCORES,
    check_compactness,
    highest_masked,
    layer_counts,
    lowest_active,
    unit_scores,
)

__all__ = ["INCOMING", "OPTIMIZER_STATES", "OUTGOING", "SCORES", "Interventions", "UnitMasks", "check_compactness",
           "highest_masked", "layer_counts", "lowest_active", "remove_mask_hooks", "unit_scores"]
