"""Slowly-Changing Regression (SCR), the loss-of-plasticity regression stream, as tensors and as an
Avalanche benchmark. Source, LTU rule, reconstructions: docs/benchmarks.md, "benchmarks.scr".
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["VARIANTS", "SlowlyChangingRegression", "ltu_thresholds", "scr_benchmark"]

VARIANTS = ("bit_flip", "resample")


def ltu_thresholds(weights: torch.Tensor, bias: torch.Tensor, beta: float = 0.7) -> torch.Tensor:
    """LTU thresholds ``τ_i = β(m+1) − S_i`` for ±1 ``weights`` ``(units, m)`` and ``bias``
    ``(units,)`` (``m``, ``S_i`` and a hand-checked case: docs/benchmarks.md, "benchmarks.scr")."""
    m = weights.shape[1]
    negatives = (weights < 0).sum(dim=1) + (bias < 0).long()
    return beta * (m + 1) - negatives.to(weights.dtype)


class SlowlyChangingRegression:
    """The SCR problem with a fixed seeded target network (arguments: docs/benchmarks.md,
    "benchmarks.scr")."""

    def __init__(self, *, n_flipping: int = 15, n_random: int = 5, n_hidden: int = 100, beta: float = 0.7,
                 variant: str = "bit_flip", examples_per_period: int = 10_000, seed: int = 0):
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if n_flipping < 1 or n_random < 0 or n_hidden < 1 or examples_per_period < 1:
            raise ValueError("n_flipping, n_hidden and examples_per_period must be >= 1, n_random >= 0")
        self.n_flipping, self.n_random, self.n_hidden = n_flipping, n_random, n_hidden
        self.n_inputs = n_flipping + n_random
        self.beta, self.variant, self.seed = beta, variant, seed
        self.examples_per_period = examples_per_period
        g = torch.Generator().manual_seed(seed)

        def signs(*shape):
            return torch.randint(0, 2, shape, generator=g).float() * 2 - 1

        self.weights = signs(n_hidden, self.n_inputs)
        self.bias = signs(n_hidden)
        self.output_weights = signs(n_hidden)
        self.thresholds = ltu_thresholds(self.weights, self.bias, beta)
        self._flip_generator = torch.Generator().manual_seed(seed + 7919)
        self._flipping = [torch.randint(0, 2, (n_flipping,), generator=self._flip_generator).float()]

    def flipping_bits(self, t: int) -> torch.Tensor:
        """The ``(n_flipping,)`` flipping bits of period ``t`` (periods are generated in order once)."""
        if t < 0:
            raise ValueError(f"period must be >= 0, got {t}")
        while len(self._flipping) <= t:
            if self.variant == "bit_flip":
                bit = int(torch.randint(0, self.n_flipping, (1,), generator=self._flip_generator))
                nxt = self._flipping[-1].clone()
                nxt[bit] = 1 - nxt[bit]
            else:
                nxt = torch.randint(0, 2, (self.n_flipping,), generator=self._flip_generator).float()
            self._flipping.append(nxt)
        return self._flipping[t].clone()

    def hidden(self, inputs: torch.Tensor) -> torch.Tensor:
        """LTU features ``(n, n_hidden)`` in ``{0, 1}`` of the target network."""
        pre = inputs @ self.weights.T + self.bias
        return (pre > self.thresholds).float()

    def target(self, inputs: torch.Tensor) -> torch.Tensor:
        """Targets ``(n, 1)`` of the fixed target network."""
        return (self.hidden(inputs) @ self.output_weights).unsqueeze(1)

    def period(self, t: int, n: int | None = None, *, stream: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs (n, 20), targets (n, 1))`` of period ``t``; ``stream`` selects an independent draw
        of the random bits (0 = training examples, 1 = a held-out validation sample, ...)."""
        n = self.examples_per_period if n is None else int(n)
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        g = torch.Generator().manual_seed(int(np.random.SeedSequence([self.seed, t, stream]).generate_state(1)[0]))
        random_bits = torch.randint(0, 2, (n, self.n_random), generator=g).float()
        inputs = torch.cat([self.flipping_bits(t).expand(n, -1), random_bits], dim=1)
        return inputs, self.target(inputs)


def scr_benchmark(n_periods: int, *, variant: str = "bit_flip", examples_per_period: int = 10_000,
                  test_examples: int = 1_000, seed: int = 0):
    """Avalanche benchmark with one experience per period (train: ``examples_per_period`` examples;
    test: ``test_examples`` held-out examples of the same period). Items are ``(x, y, 0)``."""
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets
    from avalanche.benchmarks.utils import AvalancheDataset
    from avalanche.benchmarks.utils.data_attribute import DataAttribute
    from torch.utils.data import TensorDataset

    scr = SlowlyChangingRegression(variant=variant, examples_per_period=examples_per_period, seed=seed)

    def dataset(x, y):
        t = torch.zeros(len(x), dtype=torch.long)
        return AvalancheDataset([TensorDataset(x, y, t)], data_attributes=[
            DataAttribute(t.tolist(), "targets_task_labels", use_in_getitem=False)])

    train = [dataset(*scr.period(t)) for t in range(n_periods)]
    test = [dataset(*scr.period(t, test_examples, stream=1)) for t in range(n_periods)]
    return benchmark_from_datasets(train=train, test=test)
