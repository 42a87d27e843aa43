"""The small models of the numerical tests, in one table (after curvlinops' ``test/cases.py``).

* :data:`TINY_CASES` — two hand-sized networks with no data behind them, :func:`small_mlp`
  (``6 → 10 → 8 → 3``, Tanh and ReLU) and :func:`small_bn_cnn` (8×8 → 3, BatchNorm with non-trivial
  running statistics): small enough for dense Hessians and per-sample Gram matrices.
* :func:`build_model` — the study's zoo (:mod:`avalanche_plugins.study.catalog.zoo`) at test sizes
  (:data:`ZOO_TEST_SIZES`), so the tests run the very classes users run, never a copy of them. Layer
  names (``features.1``, ``trunk.features.3``, ``head.classifiers.1.classifier``, ``blocks.0``)
  and the order in which parameters are initialised are part of what the tests assert.
* :data:`CASES` — every case above as a :class:`ModelCase` (model and inputs from one seed), for
  tests parametrised over models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from avalanche_plugins.study.catalog import zoo


def small_mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 3))


def small_bn_cnn(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3),
                        nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))
    net.train()
    with torch.no_grad():
        net(torch.randn(64, 1, 8, 8))  # non-trivial running statistics
    return net


# the zoo's defaults are sized for MNIST runs; the tests' models are a few hundred parameters
ZOO_TEST_SIZES = {"mlp": {"hidden": (32, 32)}, "cnn": {"widths": (8, 16)}, "vit": {"dim": 16, "heads": 2}}


def build_model(name: str, input_shape: Sequence[int] = (1, 8, 8), n_classes: int = 10, *,
                multihead: bool = False, **kwargs) -> nn.Module:
    """The zoo's ``name`` for ``(C, H, W)`` inputs at its test size (``kwargs`` override it); a ViT
    takes 7×7 patches of 28×28 inputs and 4×4 ones of 8×8 inputs."""
    kwargs = {**ZOO_TEST_SIZES.get(name, {}), **kwargs}
    if name == "vit":
        kwargs.setdefault("patch", 7 if input_shape[1] % 7 == 0 else 4)
    return zoo.build_model(name, tuple(input_shape), n_classes, multihead=multihead, **kwargs)


@dataclass(frozen=True)
class ModelCase:
    """One model of the table: ``model(seed)`` builds it, ``inputs(n)`` draws ``n`` inputs for it."""

    id: str
    make: Callable[[int], nn.Module]  # seed -> model
    input_shape: tuple[int, ...]  # of one sample
    n_classes: int
    zoo_name: str | None = field(default=None)  # the zoo entry it is, None for a hand-sized network

    def model(self, seed: int = 0) -> nn.Module:
        return self.make(seed)

    def inputs(self, n: int) -> torch.Tensor:
        return torch.randn(n, *self.input_shape)


def _zoo_case(name: str, input_shape=(1, 8, 8), n_classes: int = 10) -> ModelCase:
    def make(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return build_model(name, input_shape, n_classes)

    return ModelCase(name, make, tuple(input_shape), n_classes, zoo_name=name)


TINY_CASES = (ModelCase("mlp", small_mlp, (6,), 3), ModelCase("bn_cnn", small_bn_cnn, (1, 8, 8), 3))
ZOO_CASES = tuple(_zoo_case(name) for name in ZOO_TEST_SIZES)
CASES = TINY_CASES + ZOO_CASES
