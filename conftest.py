"""Hermetic tests: the suite's outcome depends on the code, never on the machine it runs on.

Loaded by pytest before any test module (and before torch is imported by one), it removes what a
developer's or a cluster's shell may carry and the tests must not see — a running Ray cluster's
``RAY_ADDRESS``, Weights & Biases settings (``WANDB_*``), thread counts (``OMP_NUM_THREADS``,
``MKL_NUM_THREADS``) — and runs from the repository root whatever directory pytest was started in.

The few knobs the suite does take are explicit:

- ``AVALANCHE_PLUGINS_TEST_THREADS=N``: torch threads for the whole run (``make test`` runs the
  numerical tests once more with 1 thread and ATen's ``default`` kernels: see the Makefile);
- ``ATEN_CPU_CAPABILITY`` (ATen's own: ``default``, ``avx2``, ``avx512``) picks the vector kernels.

``make test`` runs the suite in ``pytest-xdist`` worker processes (``-n auto --dist loadgroup``):
each worker then takes its share of the cores as torch threads (so two workers on two cores do
not oversubscribe them), and the tests that start Ray (``RAY_MODULES``) share one worker, one at
a time, so no two Ray instances of the suite are ever up at once.

Tests marked ``numerical`` (every test in the modules of ``NUMERICAL_MODULES`` and the library's
doctests) compare floating-point results; their tolerances follow from the dtype and the
computation, so they pass under every kernel set and thread count.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent

for _name in [n for n in os.environ if n.startswith("WANDB_")] + ["RAY_ADDRESS", "OMP_NUM_THREADS",
                                                                   "MKL_NUM_THREADS"]:
    os.environ.pop(_name, None)
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # offline machines: no usage reports from a test's Ray
os.chdir(ROOT)

# modules whose tests compare floating-point results against an independent computation
NUMERICAL_MODULES = frozenset({
    "test_ads", "test_fisher", "test_fisher_blocks", "test_hessian", "test_layers", "test_outputs",
    "test_schedules", "test_transport", "test_unit_masks", "test_layer_adaptive_ewc", "test_plasticity",
    "test_properties", "test_structural_plasticity", "test_input_checks", "test_fallbacks",
    "test_curvature_peers", "test_plasticity_diagnostics", "test_plasticity_variants", "test_lr_plugin_groups",
    "test_mask_state", "test_efficientnet", "test_fashion_mnist", "test_loss_reductions", "test_stream_refusals",
    "test_diagnostics_overhead", "test_diagnostics_reference", "test_distributed",
})


# modules whose tests start or join a Ray instance (and, elsewhere, tests named ``..._ray_...``):
# one xdist group, run by a single worker
RAY_MODULES = frozenset({"test_ray_executor", "test_ray_running_instance", "test_ray_cluster"})


def _worker_threads() -> str | None:
    """Torch threads of one xdist worker: the machine's cores shared out among the workers."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers:
        return None
    return str(max(1, (os.cpu_count() or 1) // int(workers)))


def pytest_configure(config):
    threads = os.environ.get("AVALANCHE_PLUGINS_TEST_THREADS") or _worker_threads()
    if threads:
        import torch

        torch.set_num_threads(int(threads))
    config.addinivalue_line("markers", "numerical: compares floating-point results (run again under a second "
                                       "ATen kernel set and one thread by `make test`)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        library_doctest = isinstance(item, pytest.DoctestItem) and "avalanche_plugins" in path.parts \
            and "study" not in path.parts
        if path.stem in NUMERICAL_MODULES or library_doctest:
            item.add_marker(pytest.mark.numerical)
        if path.stem in RAY_MODULES or "_ray_" in f"_{item.name}_":
            item.add_marker(pytest.mark.xdist_group("ray"))
