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

# test modules (paths under tests/, no suffix) that compare floating-point results against an
# independent computation
NUMERICAL_MODULES = frozenset({
    "_avalanche/test_distributed", "_avalanche/test_preflight_streams", "ads/test_shift", "core/test_calls",
    "core/test_checks", "core/test_layers", "core/test_outputs", "core/test_reductions",
    "integration/test_diagnostics_overhead", "integration/test_diagnostics_reference", "integration/test_fallbacks",
    "integration/test_properties", "layer_adaptive/test_curvature_peers", "layer_adaptive/test_ewc_plugin",
    "layer_adaptive/test_fisher", "layer_adaptive/test_fisher_blocks", "layer_adaptive/test_hessian",
    "layer_adaptive/test_lr_plugin_groups", "layer_adaptive/test_quadratic", "layer_adaptive/test_schedules",
    "readiness/test_baselines", "readiness/test_gain", "readiness/test_lookahead", "readiness/test_readiness",
    "structural/test_masks", "structural/test_masks_state", "structural/test_plugins",
    "study/catalog/test_datasets_fashion_mnist", "study/catalog/test_efficientnet", "transport/test_keys",
    "transport/test_refine",
})


# test modules that start or join a Ray instance (and, elsewhere, tests named ``..._ray_...``):
# one xdist group, run by a single worker
RAY_MODULES = frozenset({"integration/test_ray_cluster", "study/jobs/test_executors_ray",
                         "study/jobs/test_executors_ray_running_instance"})
TESTS = ROOT / "tests"


def _test_module(path: Path) -> str | None:
    """``path`` as a key of the sets above (``"ads/test_shift"``), None outside tests/."""
    return path.relative_to(TESTS).with_suffix("").as_posix() if TESTS in path.parents else None


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
        module = _test_module(path)
        if module in NUMERICAL_MODULES or library_doctest:
            item.add_marker(pytest.mark.numerical)
        if module in RAY_MODULES or "_ray_" in f"_{item.name}_":
            item.add_marker(pytest.mark.xdist_group("ray"))
