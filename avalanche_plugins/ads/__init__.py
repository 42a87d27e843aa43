"""Architecture-Driven Shift ("Architecture Matters in Continual Learning"): predict, from topology
and a small calibration set, how far old-task logits move when the model learns the next task.

* :mod:`~avalanche_plugins.ads.shift` — the predictor (:func:`architecture_driven_shift`);
* :mod:`~avalanche_plugins.ads.ground_truth` — the realised shift (:func:`logit_shift`);
* :mod:`~avalanche_plugins.ads.metric` — the Avalanche metric (imports ``avalanche``; not
  re-exported here).

Derivation: ``docs/ads.md``.
"""

from avalanche_plugins.ads.ground_truth import logit_shift, model_outputs, output_shift
from avalanche_plugins.ads.layer_terms import (
    UNASSIGNED,
    LayerGroup,
    layer_groups,
    layer_logit_changes,
)
from avalanche_plugins.ads.shift import (
    ADS_OPTIMIZERS,
    ADS_PATHS,
    ADSResult,
    architecture_driven_shift,
    distance_path,
    topology_only_shift,
    update_direction,
)

__all__ = ["ADS_OPTIMIZERS", "ADS_PATHS", "UNASSIGNED", "ADSResult", "LayerGroup", "architecture_driven_shift", "distance_path",
           "layer_groups", "layer_logit_changes", "logit_shift", "model_outputs", "output_shift", "topology_only_shift",
           "update_direction"]
