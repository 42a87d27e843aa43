"""Small models and streams for the library tests (the tests never import ``benchmarks``).

* Tiny models with no data: :func:`small_mlp` (6 → 3) and :func:`small_bn_cnn` (8×8 → 3).
* Image models named like the benchmark zoo's (last layer ``head``; ``multihead=True`` swaps it for
  Avalanche's ``MultiHeadClassifier``): :func:`build_model` ``("mlp" | "cnn" | "vit", ...)``.
  Layer names (``features.1``, ``trunk.features.3``, ``head.classifiers.1.classifier``,
  ``blocks.0``) and the order in which parameters are initialised are part of what the tests assert.
* :func:`digits_stream` — split scikit-learn digits (8×8, offline) through Avalanche's
  ``nc_benchmark``; ``noise > 0`` makes every read of a training sample draw Gaussian noise from
  torch's global RNG, like a torchvision dataset built with ``transform=RandomCrop(...)``.
* :func:`evaluator` — an ``EvaluationPlugin`` with per-experience accuracy that does not warn
  when no logger is given.

Avalanche's ``nc_benchmark`` reseeds torch's global RNG: build the stream before seeding a model.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from avalanche.models import MultiHeadClassifier, MultiTaskModule
from torch import nn
from torch.utils.data import TensorDataset

# --------------------------------------------------------------------------------------------
# tiny models


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


# --------------------------------------------------------------------------------------------
# image models


class MLP(nn.Module):
    """``Flatten -> [Linear -> ReLU] * len(hidden) -> head``."""

    def __init__(self, input_shape: Sequence[int], hidden: Sequence[int] = (32, 32), n_classes: int = 10):
        super().__init__()
        in_features = int(np.prod(input_shape))
        layers: list[nn.Module] = [nn.Flatten()]
        for width in hidden:
            layers += [nn.Linear(in_features, width), nn.ReLU()]
            in_features = width
        self.features = nn.Sequential(*layers)
        self.feature_dim = in_features
        self.head = nn.Linear(in_features, n_classes)

    def forward(self, x):
        return self.head(self.features(x))


class SmallCNN(nn.Module):
    """Blocks ``conv3×3 -> [BN] -> ReLU -> max-pool 2``, global average pool, head."""

    def __init__(self, in_channels: int = 1, n_classes: int = 10, widths: Sequence[int] = (8, 16),
                 batchnorm: bool = True):
        super().__init__()
        blocks, c = [], in_channels
        for w in widths:
            block = [nn.Conv2d(c, w, 3, padding=1, bias=not batchnorm)]
            block += [nn.BatchNorm2d(w)] if batchnorm else []
            blocks.append(nn.Sequential(*block, nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True)))
            c = w
        self.features = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.feature_dim = c
        self.head = nn.Linear(c, n_classes)

    def forward(self, x):
        return self.head(self.features(x))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.qkv(x).reshape(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(n, t, d))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, int(dim * mlp_ratio)), nn.GELU(), nn.Linear(int(dim * mlp_ratio), dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbedding(nn.Module):
    def __init__(self, image_size: int, patch: int, in_channels: int, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, (image_size // patch) ** 2 + 1, dim) * 0.02)

    def forward(self, x):
        tokens = self.proj(x).flatten(2).transpose(1, 2)
        return torch.cat([self.cls_token.expand(x.shape[0], -1, -1), tokens], dim=1) + self.pos_embed


class ClassTokenPool(nn.Module):
    def forward(self, tokens):
        return tokens[:, 0]


class TinyViT(nn.Module):
    """Pre-norm ViT, a chain ``embed -> blocks.0 ... -> norm -> pool -> head`` (splittable per block)."""

    def __init__(self, image_size: int = 8, patch: int = 4, in_channels: int = 1, n_classes: int = 10,
                 dim: int = 16, depth: int = 2, heads: int = 2, mlp_ratio: float = 2.0):
        super().__init__()
        self.embed = PatchEmbedding(image_size, patch, in_channels, dim)
        self.blocks = nn.Sequential(*[TransformerBlock(dim, heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.pool = ClassTokenPool()
        self.feature_dim = dim
        self.head = nn.Linear(dim, n_classes)

    def forward(self, x):
        return self.head(self.pool(self.norm(self.blocks(self.embed(x)))))


class MultiHeadNet(MultiTaskModule):
    """``trunk`` and Avalanche's ``MultiHeadClassifier`` (one 2-way head per task, grown by the
    strategy's model adaptation)."""

    def __init__(self, trunk: nn.Module, feature_dim: int):
        super().__init__()
        self.trunk = trunk
        self.head = MultiHeadClassifier(feature_dim, initial_out_features=2)
        self.max_class_label = 2

    def forward_single_task(self, x, task_label):
        return self.head(self.trunk(x), task_label)


def build_model(name: str, input_shape: Sequence[int] = (1, 8, 8), n_classes: int = 10, *,
                multihead: bool = False, **kwargs) -> nn.Module:
    """``"mlp"``, ``"cnn"`` or ``"vit"`` for ``(C, H, W)`` inputs; ``multihead=True`` replaces the
    head by a ``MultiHeadClassifier`` (created after the trunk, from the same RNG stream)."""
    c, h, _ = input_shape
    if name == "mlp":
        model = MLP(input_shape, n_classes=n_classes, **kwargs)
    elif name == "cnn":
        model = SmallCNN(c, n_classes, **kwargs)
    elif name == "vit":
        kwargs.setdefault("patch", 7 if h % 7 == 0 else 4)
        model = TinyViT(image_size=h, in_channels=c, n_classes=n_classes, **kwargs)
    else:
        raise ValueError(f"unknown model {name!r}")
    if multihead:
        model.head = nn.Identity()
        return MultiHeadNet(model, model.feature_dim)
    return model


# --------------------------------------------------------------------------------------------
# data


class Stream(NamedTuple):
    benchmark: object  # Avalanche scenario: train_stream, test_stream
    input_shape: tuple[int, int, int]
    n_classes: int  # outputs of one shared head (per head with task labels)


class NoisyTensorDataset(TensorDataset):
    """``(x + noise · ε, y)`` with ``ε ~ N(0, 1)`` from torch's global RNG at every read."""

    def __init__(self, x, y, noise: float):
        super().__init__(x, y)
        self.noise = noise

    def __getitem__(self, index):
        x, y = super().__getitem__(index)
        return x + self.noise * torch.randn_like(x), y


@functools.lru_cache(maxsize=1)
def digits_arrays():
    """Standardised digits ``(N, 1, 8, 8)``: 1,347 training and 450 test images (a stratified,
    seeded split, a quarter of each class held out for testing)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = np.asarray(data.target)
    rng = np.random.default_rng(0)
    held = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        held.extend(idx[: max(1, int(round(0.25 * len(idx))))])
    test = np.sort(np.array(held))
    train = np.setdiff1d(np.arange(len(y)), test)
    x = (x - x[train].mean()) / x[train].std()
    y = torch.as_tensor(y, dtype=torch.long)
    return x[train], y[train], x[test], y[test]


def digits_stream(n_experiences: int = 5, *, task_incremental: bool = False, noise: float = 0.0,
                  seed: int = 0) -> Stream:
    """Split digits: ``n_experiences`` experiences of ``10 / n_experiences`` classes each, class-
    incremental (one 10-way head) or task-incremental (task labels, class ids from 0 per task)."""
    from avalanche.benchmarks import nc_benchmark

    xtr, ytr, xte, yte = digits_arrays()
    train = NoisyTensorDataset(xtr, ytr, noise) if noise else TensorDataset(xtr, ytr)
    benchmark = nc_benchmark(train, TensorDataset(xte, yte), n_experiences=n_experiences,
                             task_labels=task_incremental, seed=seed,
                             class_ids_from_zero_in_each_exp=task_incremental,
                             class_ids_from_zero_from_first_exp=not task_incremental)
    return Stream(benchmark, (1, 8, 8), 10 // n_experiences if task_incremental else 10)


@functools.cache
def few_digits_benchmark(n_classes: int, train_per_class: int, test_per_class: int, n_experiences: int,
                         class_order: bool = True):
    """Class-incremental digits of the first ``n_classes`` classes, ``train_per_class`` /
    ``test_per_class`` images of each (the first ones), in ``n_experiences`` experiences (in class
    order, or shuffled with seed 0 when ``class_order`` is False): a stream small enough to count
    its iterations by hand."""
    from avalanche.benchmarks import nc_benchmark

    xtr, ytr, xte, yte = digits_arrays()

    def pick(x, y, n):
        idx = torch.cat([torch.nonzero(y == c).reshape(-1)[:n] for c in range(n_classes)])
        return TensorDataset(x[idx], y[idx])

    return nc_benchmark(pick(xtr, ytr, train_per_class), pick(xte, yte, test_per_class), n_experiences=n_experiences,
                        task_labels=False, seed=0, fixed_class_order=list(range(n_classes)) if class_order else None,
                        class_ids_from_zero_from_first_exp=True)


def one_torch_thread():
    """Generator body of a fixture running a test on one torch thread (restored after): tiny
    models run fastest that way, and a test's numbers do not depend on the machine's cores."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def evaluator(*metrics, loggers=()):
    """``EvaluationPlugin(accuracy_metrics(experience=True), *metrics)``, silent without loggers."""
    from avalanche.evaluation.metrics import accuracy_metrics
    from avalanche.training.plugins import EvaluationPlugin

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No loggers specified")
        return EvaluationPlugin(accuracy_metrics(experience=True), *metrics, loggers=list(loggers))
