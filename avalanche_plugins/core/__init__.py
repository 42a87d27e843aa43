"""Building blocks shared by every component; PyTorch only, never ``avalanche``.

* :mod:`~avalanche_plugins.core.layers` — the one layer map (:func:`discover_layers`).
* :mod:`~avalanche_plugins.core.split` — cutting a model at a layer (:func:`split_model`).
* :mod:`~avalanche_plugins.core.calls` — stateless model and loss calls for ``torch.func``.
* :mod:`~avalanche_plugins.core.reductions` — how a loss reduces over samples (mean / sum), read
  once per estimator, and the chunk weights that follow.
* :mod:`~avalanche_plugins.core.consumers` — which downstream layer consumes a layer's units
  (:func:`find_consumer`, for unit masks).
* :mod:`~avalanche_plugins.core.outputs` — logits from tuple / dict outputs (``output_transform``).
* :mod:`~avalanche_plugins.core.checks` — argument checks, one error style for every estimator.
* :mod:`~avalanche_plugins.core.optim` — one functional SGD / Adam step.
* :mod:`~avalanche_plugins.core.stats` — rank agreement and calibration statistics.
"""
