"""Pieces the study runner's zoo lacks, for the continual-learning-baselines reproductions.

Each piece re-expresses one *setting* of an experiment of ContinualAI's
``continual-learning-baselines`` (the files named in ``docs/targets.csv``); none of their code is
used here. Referenced from the configs of this folder as ``clb:NAME``.

* :func:`mlp`: a fully connected net with the activation as a string (``relu`` or ``tanh``) and a
  ``get_features(x)`` method (LFL regularises the features before the classifier);
* :class:`LwFCEPenalty`: LwF whose cross-entropy term is divided by the number of experiences seen
  so far (their Split MNIST LwF, after van de Ven et al. 2018);
* :func:`split_mnist_subsampled`: Split MNIST (5 experiences, class-incremental) keeping
  ``experience_size`` random training images of each experience (their GSS setting).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from avalanche.models import BaseModel
from avalanche.training import LwF
from torch import nn

__all__ = ["MLP", "mlp", "LwFCEPenalty", "split_mnist_subsampled"]

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


class MLP(nn.Module, BaseModel):
    """``flatten -> [Linear -> activation] * len(hidden) -> head`` with ``get_features`` (an Avalanche
    ``BaseModel``: LFL refuses other models)."""

    def __init__(self, input_shape: Sequence[int], n_classes: int, hidden: Sequence[int], activation: str):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = int(torch.tensor(tuple(input_shape)).prod())
        for h in hidden:
            layers += [nn.Linear(width, int(h)), _ACTIVATIONS[activation]()]
            width = int(h)
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(width, n_classes)

    def get_features(self, x):
        return self.features(x)

    def forward(self, x):
        return self.head(self.features(x))


def mlp(input_shape=(1, 28, 28), n_classes: int = 10, multihead: bool = False, hidden=(256,),
        activation: str = "relu") -> nn.Module:
    """A single-head :class:`MLP` (``multihead`` scenarios should use the zoo's ``mlp``)."""
    if multihead:
        raise ValueError("clb:mlp has one shared head; use the zoo's mlp for task-incremental scenarios")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
    return MLP(input_shape, n_classes, hidden, activation)


class LwFCEPenalty(LwF):
    """LwF with loss ``CE / n + alpha[n - 1] * distillation`` after ``n`` experiences."""

    def _before_backward(self, **kwargs):
        self.loss = self.loss / float(self.clock.train_exp_counter + 1)
        super()._before_backward(**kwargs)


def split_mnist_subsampled(data_root: str, experience_size: int = 1000, class_order_seed: int = 1, seed: int = 0):
    """Class-incremental Split MNIST in 5 experiences whose class order comes from
    ``class_order_seed`` (fixed, as in their GSS experiment) and whose every training experience
    keeps ``experience_size`` images drawn with ``seed``; the test stream is whole."""
    from avalanche.benchmarks import data_incremental_benchmark

    from avalanche_plugins.study.catalog.datasets import Stream, make_stream

    base = make_stream("mnist", "split", n_experiences=5, data_root=data_root, seed=class_order_seed)
    generator = torch.Generator().manual_seed(seed)

    def keep_some(experience):
        order = torch.randperm(len(experience.dataset), generator=generator)[:experience_size]
        return [experience.dataset.subset(order.tolist())]

    bm = data_incremental_benchmark(base.benchmark, experience_size=0, custom_split_strategy=keep_some)
    return Stream(bm, base.input_shape, base.n_classes, False,
                  f"split mnist (5 experiences, class-incremental, {experience_size} training images each)")
