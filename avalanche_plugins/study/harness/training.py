"""Training loops, the accuracy matrix, ACC and forgetting, written once for every benchmark.

* Avalanche strategies: :class:`TrainConfig` (everything that defines a run besides the method
  and the seed), :func:`run_strategy` (stream, model, ``Naive`` strategy with a method's plugins,
  trained with :func:`run_stream`), :func:`quiet_evaluator` / :func:`accuracy_evaluator`,
  :func:`quiet_deprecations`.
* Hand-written loops on tensors: :func:`train_minibatches` (shuffled minibatch epochs with Adam
  or SGD and a seeded generator).
* Accuracy: :func:`accuracy` (logits), :func:`batched_accuracy` (a forward over chunks); over a
  union of experiences, the library's ``avalanche_plugins.stream_accuracy``.

``R[i, j]`` is the test accuracy on experience ``j`` after training on experiences ``0..i``
(read from Avalanche's ``Top1_Acc_Exp`` metric). From it: final average accuracy
``ACC = mean_j R[T-1, j]`` and average forgetting
``F = mean_{j<T-1} (max_{j<=i<T-1} R[i, j] - R[T-1, j])`` (Chaudhry et al., 2018).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from avalanche_plugins import quiet_evaluator
from avalanche_plugins.study.harness.data import make_stream
from avalanche_plugins.study.harness.jobs import Timer, seed_everything
from avalanche_plugins.study.harness.models import build_model

__all__ = [
    "TrainConfig",
    "accuracy",
    "accuracy_evaluator",
    "average_accuracy",
    "average_forgetting",
    "batched_accuracy",
    "config_stream",
    "quiet_deprecations",
    "quiet_evaluator",
    "run_strategy",
    "run_stream",
    "train_minibatches",
]

_ACC_EXP = re.compile(r"^Top1_Acc_Exp/eval_phase/test_stream/(?:Task\d+/)?Exp(\d+)$")


@contextlib.contextmanager
def quiet_deprecations():
    """Drop DeprecationWarnings while training. Avalanche's ``deprecated`` decorator (called by
    ReplayPlugin every experience) re-enables them globally with ``simplefilter("once")``, which
    beats any filter, so the display hook is what has to change."""
    original = warnings.showwarning

    def show(message, category, *args, **kwargs):
        if not issubclass(category, DeprecationWarning):
            original(message, category, *args, **kwargs)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = original


def accuracy_evaluator(*extra_metrics, loggers=()):
    """:func:`quiet_evaluator` with per-experience accuracy (what :func:`run_stream` reads)."""
    from avalanche.evaluation.metrics import accuracy_metrics

    return quiet_evaluator(accuracy_metrics(experience=True), *extra_metrics, loggers=loggers)


def run_stream(strategy, benchmark, *, progress: str | None = None, eval_every_experience: bool = True,
               **train_kwargs) -> np.ndarray:
    """Train ``strategy`` on every experience of ``benchmark.train_stream``; after each one
    evaluate on the whole test stream. Returns the accuracy matrix ``R`` (T × T).

    With ``eval_every_experience=False`` only the final row is measured (others are NaN).
    """
    train_stream, test_stream = benchmark.train_stream, benchmark.test_stream
    n = len(train_stream)
    acc = np.full((n, len(test_stream)), np.nan)
    for i, experience in enumerate(tqdm(train_stream, desc=progress, disable=progress is None, leave=False)):
        with quiet_deprecations():
            strategy.train(experience, num_workers=0, **train_kwargs)
        if eval_every_experience or i == n - 1:
            metrics = strategy.eval(test_stream, num_workers=0)
            for name, value in metrics.items():
                match = _ACC_EXP.match(name)
                if match:
                    acc[i, int(match.group(1))] = value
    return acc


def average_accuracy(acc: np.ndarray) -> float:
    """Mean accuracy over all experiences after the last one was trained.

    Example:
        >>> average_accuracy(np.array([[0.9, 0.1], [0.6, 0.8]]))
        0.7
    """
    return float(np.mean(acc[-1]))


def average_forgetting(acc: np.ndarray) -> float:
    """Mean drop from each earlier experience's best accuracy to its final accuracy.

    Example:
        >>> round(average_forgetting(np.array([[0.9, 0.1], [0.6, 0.8]])), 3)
        0.3
    """
    if acc.shape[0] < 2:
        return 0.0
    last = acc.shape[0] - 1
    drops = [np.nanmax(acc[j:last, j]) - acc[last, j] for j in range(last)]
    return float(np.mean(drops))


@dataclass
class TrainConfig:
    """Everything that defines one Avalanche run besides the method and the seed."""

    dataset: str = "digits"
    scenario: str = "split"
    n_experiences: int = 5
    task_incremental: bool = False
    model: str = "mlp"
    hidden: tuple[int, ...] = (128, 128)
    model_kwargs: dict = field(default_factory=dict)  # for non-MLP models (e.g. CNN widths)
    lr: float = 0.05
    momentum: float = 0.0
    epochs: int = 5
    batch_size: int = 32
    ewc_lambda: float = 100.0
    si_lambda: float = 10000.0
    gem_patterns: int = 64
    gem_strength: float = 0.5
    replay_mem: int = 100
    data_root: str | None = None
    validation: bool = False
    extra: dict = field(default_factory=dict)


def config_stream(cfg: TrainConfig, seed: int):
    """The stream of ``cfg`` for ``seed`` (class order, permutations, validation split)."""
    return make_stream(cfg.dataset, cfg.scenario, n_experiences=cfg.n_experiences,
                       task_incremental=cfg.task_incremental, data_root=cfg.data_root, seed=seed,
                       validation=cfg.validation)


def run_strategy(plugins_for: Callable, name: str, cfg: TrainConfig, seed: int, *, stream=None,
                 keep_strategy: bool = False, progress: bool = True) -> dict:
    """Train a ``Naive`` strategy with ``plugins_for(name, cfg)`` on ``cfg``'s stream with ``seed``
    (plain SGD, ``cfg.lr`` / ``cfg.momentum``) and return a row: ACC, forgetting, wall time and
    the accuracy matrix (plus the strategy with ``keep_strategy``)."""
    from avalanche.training.supervised import Naive

    stream = stream or config_stream(cfg, seed)
    seed_everything(seed)  # after the stream: Avalanche's generators reseed torch
    model_kwargs = {"hidden": cfg.hidden} if cfg.model == "mlp" else dict(cfg.model_kwargs)
    model = build_model(cfg.model, stream.input_shape, stream.n_classes,
                        multihead=cfg.task_incremental, **model_kwargs)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    strategy = Naive(model=model, optimizer=optimizer, criterion=torch.nn.CrossEntropyLoss(),
                     train_mb_size=cfg.batch_size, train_epochs=cfg.epochs, eval_mb_size=512,
                     device="cpu", plugins=plugins_for(name, cfg), evaluator=accuracy_evaluator())
    with Timer() as timer:
        acc = run_stream(strategy, stream.benchmark, progress=f"{name} seed {seed}" if progress else None)
    return {
        "strategy": name,
        "scenario": stream.description,
        "seed": seed,
        "acc": average_accuracy(acc),
        "forgetting": average_forgetting(acc),
        "wall_s": timer.seconds,
        "accuracy_matrix": acc.tolist(),
        **({"strategy_object": strategy} if keep_strategy else {}),
    }


def train_minibatches(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, lr: float,
                      batch_size: int, generator: torch.Generator, optimizer: str = "adam",
                      task: int | None = None) -> int:
    """Cross-entropy training on ``(x, y)``: each epoch a fresh permutation from ``generator``,
    minibatches of ``batch_size`` in that order, one ``torch.optim.Adam`` or plain ``SGD`` step
    each; ``model(x, task)`` when ``task`` is given. Leaves the model in eval mode; returns the
    number of steps.

    Example:
        >>> model = nn.Linear(3, 2)
        >>> train_minibatches(model, torch.randn(10, 3), torch.randint(0, 2, (10,)), epochs=2, lr=0.1,
        ...                   batch_size=4, generator=torch.Generator().manual_seed(0), optimizer="sgd")
        6
    """
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    opt = torch.optim.Adam(model.parameters(), lr=lr) if optimizer == "adam" else \
        torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    steps = 0
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch_size):
            idx = order[start:start + batch_size]
            opt.zero_grad()
            out = model(x[idx]) if task is None else model(x[idx], task)
            loss_fn(out, y[idx]).backward()
            opt.step()
            steps += 1
    model.eval()
    return steps


def accuracy(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Top-1 accuracy of ``logits`` ``(N, C)``.

    Example:
        >>> accuracy(torch.tensor([[2.0, 1.0], [0.0, 1.0]]), torch.tensor([0, 0]))
        0.5
    """
    return float((logits.argmax(1) == targets).float().mean())


@torch.no_grad()
def batched_accuracy(forward: Callable[..., torch.Tensor], *inputs: torch.Tensor, targets: torch.Tensor,
                     batch_size: int = 500) -> float:
    """Top-1 accuracy of ``forward(*chunks)`` over aligned chunks of ``inputs`` of ``batch_size``
    rows (memory-bounded evaluation).

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
        >>> batched_accuracy(lambda a: a, x, targets=torch.tensor([0, 1, 1]), batch_size=2)
        0.6666666666666666
    """
    correct = 0
    for s in range(0, len(targets), batch_size):
        out = forward(*(t[s:s + batch_size] for t in inputs))
        correct += int((out.argmax(-1) == targets[s:s + batch_size]).sum())
    return correct / len(targets)
