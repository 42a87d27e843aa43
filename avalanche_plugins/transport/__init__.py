"""Transport keys ("The Key Was Never Lost"): how much forgotten task accuracy is still readable
from the updated network's early layers through a small fitted key.

* :mod:`~avalanche_plugins.transport.keys` — anchors and closed-form keys (identity, channel,
  cross-channel, Procrustes);
* :mod:`~avalanche_plugins.transport.stitch` — stage activations and the stitched model;
* :mod:`~avalanche_plugins.transport.refine` — label-free Adam / Gauss–Newton refinement;
* :mod:`~avalanche_plugins.transport.controls` — controls and the recovery fraction;
* :mod:`~avalanche_plugins.transport.stages` — stitching stages chosen from a model
  (``TransportKeyMetric(stages="auto")``), probed on a detached copy;
* :mod:`~avalanche_plugins.transport.metric` — the Avalanche metric (imports ``avalanche``; not
  re-exported here).
"""

from avalanche_plugins.transport.controls import (
    CONTROLS,
    Recovery,
    channel_permutation,
    control_keys,
    correspondence_break,
    recovery,
)
from avalanche_plugins.transport.keys import (
    FAMILIES,
    LAYOUTS,
    TransportKey,
    class_balanced_anchors,
    fit_transport_key,
)
from avalanche_plugins.transport.refine import gauss_newton_key, optimize_key, refine_key
from avalanche_plugins.transport.stitch import (
    StitchedModel,
    stage_activations,
    stage_layout,
    stitch,
    stitched_accuracy,
)

__all__ = [
    "CONTROLS", "FAMILIES", "LAYOUTS", "Recovery", "StitchedModel", "TransportKey", "channel_permutation",
    "class_balanced_anchors", "control_keys", "correspondence_break", "fit_transport_key", "gauss_newton_key",
    "optimize_key", "recovery", "refine_key", "stage_activations", "stage_layout", "stitch", "stitched_accuracy",
]
