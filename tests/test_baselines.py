"""The baselines benchmark end to end, and the SI-on-CPU work-around."""

import json

import pytest
import torch
from avalanche.core import SupervisedPlugin
from avalanche.training.plugins import SynapticIntelligencePlugin
from avalanche.training.supervised import Naive

from avalanche_plugins import fix_synaptic_intelligence_on_cpu
from avalanche_plugins.study.harness.data import make_stream
from avalanche_plugins.study.harness.models import build_model
from avalanche_plugins.study.harness.training import accuracy_evaluator, average_forgetting
from benchmarks import baselines


class LossProbe(SupervisedPlugin):
    """Records ``strategy.loss`` at ``before_backward`` per experience."""

    def __init__(self):
        super().__init__()
        self.losses = {}

    def before_backward(self, strategy, **kwargs):
        self.losses.setdefault(strategy.clock.train_exp_counter, []).append(float(strategy.loss.detach()))


def test_si_penalty_is_nonzero_after_first_experience():
    fix_synaptic_intelligence_on_cpu()
    stream = make_stream("digits", "split", n_experiences=5)
    torch.manual_seed(0)
    model = build_model("mlp", stream.input_shape, 10, hidden=(32,))
    before, after = LossProbe(), LossProbe()
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                     criterion=torch.nn.CrossEntropyLoss(), train_mb_size=64, train_epochs=1,
                     plugins=[before, SynapticIntelligencePlugin(si_lambda=1e4), after],
                     evaluator=accuracy_evaluator())
    for exp in stream.benchmark.train_stream[:2]:
        strategy.train(exp)
    penalty = {t: [a - b for a, b in zip(after.losses[t], before.losses[t])] for t in (0, 1)}
    assert max(abs(p) for p in penalty[0]) < 1e-6  # no importances before the first experience ends
    assert max(penalty[1]) > 1e-4  # without the fix this is exactly 0 on CPU


def test_forgetting_counts_only_after_learning():
    acc = torch.tensor([[0.9, 0.05], [0.4, 0.95]]).numpy()
    assert average_forgetting(acc) == pytest.approx(0.5)


@pytest.mark.slow
def test_baselines_quick_end_to_end(tmp_path):
    result = baselines.main(["--quick", "--no-progress", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "results.csv").read_text().startswith("strategy,scenario,seed,acc")
    assert (tmp_path / "accuracy.png").stat().st_size > 1000
    assert {"command", "code_version", "data", "config", "machine", "runs", "summary", "wall_seconds"} <= set(data)
    acc = {(s["scenario"].split(" (")[0] + (" task" if "task-inc" in s["scenario"] else ""), s["strategy"]): s["acc_mean"]
           for s in result["summary"]}
    # class-incremental: fine-tuning keeps only the last 2 of 10 classes; memory-based methods do better
    assert 0.15 <= acc[("split digits", "naive")] <= 0.3
    assert acc[("split digits", "replay")] > 0.4 and acc[("split digits", "gem")] > 0.4
    # task-incremental with a multi-head classifier: every strategy is far above chance (0.5)
    for strategy in baselines.STRATEGIES:
        assert acc[("split digits task", strategy)] > 0.85
