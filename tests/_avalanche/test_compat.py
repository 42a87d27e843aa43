"""``fix_synaptic_intelligence_on_cpu``: Avalanche 0.6's SI is a no-op on a CPU without it."""

from __future__ import annotations

import torch
from avalanche.core import SupervisedPlugin
from avalanche.training.plugins import SynapticIntelligencePlugin
from avalanche.training.supervised import Naive

from avalanche_plugins import fix_synaptic_intelligence_on_cpu
from avalanche_plugins.study.catalog.datasets import make_stream
from avalanche_plugins.study.catalog.zoo import build_model
from benchmarks._training import accuracy_evaluator


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
