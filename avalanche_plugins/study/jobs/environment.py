"""The process a job runs in: seeds, torch threads, warnings, a timer.

Every worker runs :func:`init_worker` before its first job; :func:`seed_everything` and
:func:`torch_threads` serve a job itself, :func:`quiet_deprecations` its training loop.
"""

from __future__ import annotations

import contextlib
import random
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch

__all__ = ["Timer", "init_worker", "quiet_deprecations", "seed_everything", "torch_threads"]


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's legacy and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - seeds third-party code that uses the legacy global RNG
    torch.manual_seed(seed)


class Timer:
    """``with Timer() as t: ...; t.seconds``"""

    def __enter__(self):
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._start


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """Run the block with ``threads`` torch threads (``None``: unchanged), then restore."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)



def init_worker(threads: int = 1, seed: int = 0, warmup: Callable[[], None] | None = None) -> None:
    """What every worker runs before its first job: ``threads`` torch threads (oversubscribed
    threads on a small machine make ``torch.func`` code tens of times slower), warnings off,
    every global generator seeded with ``seed`` (each job still seeds itself), then ``warmup()``
    (e.g. a first ``torch.func`` call, whose one-off cost would otherwise land in a job's timing)."""
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore")
    seed_everything(seed)
    if warmup is not None:
        warmup()


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
