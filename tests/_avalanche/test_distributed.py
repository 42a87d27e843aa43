"""The package under Avalanche's distributed training: 2 CPU processes on gloo (as Avalanche's own
distributed tests run), against the same runs in one process with the same global minibatch.

One process group (``torch.multiprocessing`` spawn, 127.0.0.1 and a free port) runs every check:
three training runs (Avalanche's ``DistributedHelper.wrap_model`` and plain ``DDP``) of 2
experiences of split digits, then the refusals. Each rank trains minibatches of ``B``; the
reference process trains minibatches of ``2B``. ``shuffle=False, drop_last=True`` makes the
union of the ranks' ``k``-th minibatches the reference's ``k``-th minibatch (a
``DistributedSampler`` gives rank ``r`` the samples ``r, r+2, ...``), so the runs differ only in
the order of floating-point sums (a rank's mean then DDP's all-reduce average, against one mean).

Tolerances: across ranks nothing may differ (bit-identical weights, state and logged values);
against one process, weights and float state agree to ``atol=2e-5, rtol=1e-4`` (float32 sums in
another order round differently, ~1e-7 relative per step, over 2 × 21 SGD steps), and every
discrete quantity (masks, edit iterations, cycle points, step counts, logged counts and
accuracies over the whole test experience) is equal.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
import warnings
from pathlib import Path

import pytest
import torch

B = 16  # a rank's minibatch; the reference trains 2 * B
WORLD = 2
TIMEOUT_S = 240

# --------------------------------------------------------------------------------------------
# the runs (the same code on each rank and in the reference process)


def _model():
    from tests.cases import build_model

    torch.manual_seed(0)
    return build_model("mlp", hidden=(32, 32))


def _strategy(model, batch, plugins, metrics):
    from avalanche.training.supervised import Naive

    from tests.fixtures import evaluator

    return Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5),
                 criterion=torch.nn.CrossEntropyLoss(), train_mb_size=batch, train_epochs=1, eval_mb_size=64,
                 device="cpu", plugins=plugins, evaluator=evaluator(*metrics))


def _logged(strategy):
    """Every value our metrics logged: ``{name: (steps, values)}`` (Avalanche's own accuracy,
    computed per rank on the rank's share, left out)."""
    return {k: v for k, v in strategy.evaluator.get_all_metrics().items() if not k.startswith("Top1_Acc")}


def _train(strategy, stream):
    from tests.fixtures import digits_stream

    for experience in stream.benchmark.train_stream:
        strategy.train(experience, shuffle=False, drop_last=True)
        strategy.eval(stream.benchmark.test_stream)
    # test experiences of 227 and 223 images (the other split's): the DistributedSampler repeats one
    # image on rank 1 to even out the shares, which the summed counts must leave out
    odd = digits_stream(2, seed=5).benchmark.test_stream
    assert len(odd[0].dataset) % WORLD == 1
    strategy.eval(odd)


def _plain(model):
    from avalanche_plugins.core.parallel import unwrap_model

    return {k: v.detach().clone() for k, v in unwrap_model(model).state_dict().items()}


def run_ewc_lr(stream, batch, wrap):
    """EWC (empirical Fisher, measured schedule) + per-layer LR + the measuring metrics."""
    from avalanche_plugins import (
        ArchitectureDrivenShiftMetric,
        LayerAdaptiveEWCPlugin,
        LayerAdaptiveLRPlugin,
        LayerSensitivityMetric,
        OptimizationReadinessMetric,
        TaskILAccuracyMetric,
    )

    ewc = LayerAdaptiveEWCPlugin(5.0, schedule="measured", fisher="empirical", fisher_samples=64,
                                 spectrum_samples=32)
    lr = LayerAdaptiveLRPlugin("geometric", alpha=0.5)
    metrics = [LayerSensitivityMetric(n_samples=32), OptimizationReadinessMetric(n_samples=32, n_batches=8),
               ArchitectureDrivenShiftMetric(32, path="budget"), TaskILAccuracyMetric()]
    strategy = _strategy(wrap(_model()), batch, [ewc, lr], metrics)
    _train(strategy, stream)
    return {"weights": _plain(strategy.model), "ewc_curvature": dict(ewc._curvature), "ewc_anchor": dict(ewc._anchor),
            "lambdas": ewc.lambdas, "ads_steps": [r["steps"] for r in metrics[2].history],
            "logged": _logged(strategy)}


def run_grow(stream, batch, wrap):
    """Batched-Fisher EWC + Grow on a sample clock + cycle accuracy, compactness, transport keys."""
    from avalanche_plugins import (
        CycleAccuracyMetric,
        GrowPlugin,
        LayerAdaptiveEWCPlugin,
        TransportKeyMetric,
    )
    from avalanche_plugins.structural.compactness_metric import CompactnessMetric

    ewc = LayerAdaptiveEWCPlugin(1.0, schedule="uniform", fisher="batched")
    grow = GrowPlugin(0.8, seed_compactness=0.4, grow_fraction_per_cycle=0.1, cycle_unit="samples",
                      cycle_length=160)
    metrics = [CycleAccuracyMetric(stream.benchmark.test_stream, cycle_unit="samples", cycle_length=160),
               CompactnessMetric(grow), TransportKeyMetric("auto", experiences=[0], n_anchors=20)]
    strategy = _strategy(wrap(_model()), batch, [ewc, grow], metrics)
    _train(strategy, stream)
    return {"weights": _plain(strategy.model), "ewc_curvature": dict(ewc._curvature),
            "masks": {k: v.clone() for k, v in grow.masks.masks.items()},
            "edits": [(h["iteration"], h["units"]) for h in grow.history],
            "cycles": [i for i, _ in metrics[0].history], "logged": _logged(strategy)}


def run_prune(stream, batch, wrap):
    """Prune on a sample clock, rewinding to iteration 3."""
    from avalanche_plugins import PrunePlugin

    prune = PrunePlugin(0.5, prune_fraction_per_cycle=0.2, rewind_to=3, cycle_unit="samples", cycle_length=320)
    strategy = _strategy(wrap(_model()), batch, [prune], [])
    _train(strategy, stream)
    return {"weights": _plain(strategy.model), "masks": {k: v.clone() for k, v in prune.masks.masks.items()},
            "edits": [(h["iteration"], h["units"]) for h in prune.history],
            "rewind": dict(prune.rewind_state)}


RUNS = {"ewc_lr": run_ewc_lr, "grow": run_grow, "prune": run_prune}


def _refusal(make):
    """The message of what ``make()`` raised (None when nothing did)."""
    try:
        make()
    except Exception as error:  # noqa: BLE001 - the test asserts the type and message
        return f"{type(error).__name__}: {error}"
    return None


def refusals(stream, batch, wrap):
    from avalanche.training.plugins import EvaluationPlugin

    from avalanche_plugins import (
        GrowPlugin,
        NewbornGradientMetric,
        PrunePlugin,
        TaskILAccuracyMetric,
        TidyCSVLogger,
    )

    first = stream.benchmark.train_stream[0]

    def train(plugins=(), metrics=(), model=None):
        strategy = _strategy(wrap(_model()) if model is None else model, batch, list(plugins), list(metrics))
        strategy.train(first, shuffle=False, drop_last=True)

    grow = GrowPlugin(0.8, seed_compactness=0.4, track_newborn=True)
    out = {
        "unwrapped": _refusal(lambda: train(metrics=[TaskILAccuracyMetric()], model=_model())),
        "track_newborn": _refusal(lambda: train(plugins=[grow])),
        "newborn_metric": _refusal(lambda: train(metrics=[NewbornGradientMetric(
            GrowPlugin(0.8, seed_compactness=0.4, track_newborn=True))])),
        # the first prune after ceil(160 / 32) = 5 group steps: rewind_to=8 cannot be reached
        "rewind": _refusal(lambda: train(plugins=[PrunePlugin(0.5, rewind_to=8, cycle_unit="samples",
                                                              cycle_length=160)])),
    }
    from avalanche_plugins.core.parallel import rank

    if rank() != 0:
        with tempfile.TemporaryDirectory() as folder:
            out["logger"] = _refusal(lambda: EvaluationPlugin(loggers=[TidyCSVLogger(Path(folder) / "m.csv")]))
    return out


def run_all(batch, wrappers):
    from tests.fixtures import digits_stream

    stream = digits_stream(2)
    results = {name: run(stream, batch, wrappers[name]) for name, run in RUNS.items()}
    results["refusals"] = refusals(stream, batch, wrappers["grow"])
    return results


# --------------------------------------------------------------------------------------------
# the process group


def _worker(rank: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from avalanche.distributed import DistributedHelper
    from torch.nn.parallel import DistributedDataParallel

    DistributedHelper.init_distributed(0, backend="gloo", use_cuda=False)
    try:
        wrappers = {"ewc_lr": DistributedHelper.wrap_model, "grow": DistributedDataParallel,
                    "prune": DistributedHelper.wrap_model}
        torch.save(run_all(B, wrappers), Path(folder) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs():
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        context = mp.start_processes(_worker, args=(_free_port(), folder), nprocs=WORLD, join=False,
                                     start_method="spawn")
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while not context.join(timeout=5):
                if time.monotonic() > deadline:
                    raise AssertionError(f"the 2-process group did not finish in {TIMEOUT_S} s")
        finally:
            for process in context.processes:  # ours only, by object; none left behind on failure
                if process.is_alive():
                    process.kill()
                    process.join()
        ranks = [torch.load(Path(folder) / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    warnings.simplefilter("ignore")
    from avalanche.training.determinism.rng_manager import RNGManager

    RNGManager.set_random_seeds(0)  # what init_distributed does on every rank
    reference = run_all(WORLD * B, {name: (lambda m: m) for name in RUNS})
    return ranks, reference


def _equal(a, b, path="") -> None:
    """Bit-identical nested results."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{path} differs between ranks"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _equal(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{path}[{i}]")
    else:
        assert a == b or (a != a and b != b), f"{path}: {a!r} != {b!r}"


def _close(a, b, path="") -> None:
    """Floats to the all-reduce's rounding (module docstring), everything else equal."""
    if isinstance(a, torch.Tensor):
        if a.dtype.is_floating_point:
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=lambda m: f"{path}: {m}")
        else:
            assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), (path, sorted(set(a) ^ set(b)))
        for k in a:
            _close(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), (path, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-4, abs=2e-5, nan_ok=True), path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.mark.parametrize("run", sorted(RUNS))
def test_ranks_are_bit_identical(runs, run):
    ranks, _ = runs
    _equal(ranks[0][run], ranks[1][run], run)


@pytest.mark.parametrize("run", sorted(RUNS))
def test_two_ranks_equal_one_process_with_the_global_batch(runs, run):
    ranks, reference = runs
    _close(ranks[0][run], reference[run], run)


def test_the_runs_counted_and_logged_something(runs):
    _, reference = runs
    assert reference["ewc_lr"]["ads_steps"] == [21]  # 668 samples of exp 1 in minibatches of 32
    assert len(reference["grow"]["edits"]) >= 3 and len(reference["grow"]["cycles"]) >= 8
    assert len(reference["prune"]["edits"]) >= 2
    logged = reference["grow"]["logged"]
    assert any(k.startswith("TransportKey") for k in logged) and any(k.startswith("CycleAccuracy") for k in logged)
    assert any(k.startswith("Top1_TaskIL") for k in reference["ewc_lr"]["logged"])


def test_an_unwrapped_model_is_refused(runs):
    message = runs[0][0]["refusals"]["unwrapped"]
    assert message.startswith("DistributedTrainingError: TaskILAccuracyMetric refuses distributed training")
    assert "not wrapped in DistributedDataParallel" in message and "DistributedHelper.wrap_model" in message


def test_newborn_tracking_is_refused(runs):
    refused = runs[0][1]["refusals"]
    assert refused["track_newborn"].startswith("DistributedTrainingError: GrowPlugin refuses distributed training")
    assert "track_newborn=False" in refused["track_newborn"]
    assert refused["newborn_metric"].startswith("DistributedTrainingError: NewbornGradientMetric refuses")


def test_an_unreachable_rewind_point_is_refused_as_in_one_process(runs):
    message = runs[0][0]["refusals"]["rewind"]
    assert message.startswith("ValueError: PrunePlugin: rewind_to=8 iterations, but the first prune comes after 5")
    assert runs[1]["refusals"]["rewind"] == message  # one process with the global batch says the same


def test_our_logger_refuses_a_non_main_rank(runs):
    message = runs[0][1]["refusals"]["logger"]
    assert message.startswith("DistributedTrainingError: TidyCSVLogger: built on rank 1 of 2")
    assert "DistributedHelper.is_main_process" in message
    assert "logger" not in runs[0][0]["refusals"]


def test_the_samplers_repeats_are_left_out(monkeypatch):
    # 5 samples on 2 ranks: the sampler pads the index list to 6, rank 1 gets positions 1, 3, 5,
    # and position 5 repeats position 0 (rank 0 counts it)
    from avalanche_plugins._avalanche import distributed

    class Strategy:
        adapted_dataset = range(5)

    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "rank", lambda: 1)
    assert distributed.shared_samples(Strategy(), 0, 3).tolist() == [True, True, False]
    assert distributed.shared_samples(Strategy(), 2, 1).tolist() == [False]
    monkeypatch.setattr(distributed, "rank", lambda: 0)
    assert distributed.shared_samples(Strategy(), 0, 3).tolist() == [True, True, True]
