"""The task source of a run: ``task(t)`` → training and validation tensors of task ``t``."""

from __future__ import annotations

import functools

import torch

from avalanche_plugins.study.catalog.datasets import load_digits_arrays, load_mnist_arrays
from benchmarks.plasticity_ranking.settings import Setting
from benchmarks.scr import SlowlyChangingRegression


class TaskSource:
    """``task(t)`` → ``(x_train, y_train, x_val, y_val)`` of task ``t`` for one run."""

    def __init__(self, setting: Setting, seed: int, data_root=None, arrays=None):
        self.setting, self.seed = setting, seed
        if setting.data == "scr":
            self.scr = SlowlyChangingRegression(variant=setting.variant, seed=seed,
                                                examples_per_period=setting.examples_per_task)
            self.input_shape, self.n_out = (self.scr.n_inputs,), 1
            return
        if setting.stream != "permuted":
            self._init_declining(setting, seed, data_root, arrays)
            return
        x_tr, y_tr, x_te, y_te = arrays if arrays is not None else load_unit_arrays(setting.data, data_root)
        g = torch.Generator().manual_seed(10_000 + seed)
        tr = torch.randperm(len(x_tr), generator=g)[:setting.examples_per_task]
        va = torch.randperm(len(x_te), generator=g)[:setting.n_val]
        self.x_tr, self.y_tr = x_tr[tr], y_tr[tr]
        self.x_val, self.y_val = x_te[va], y_te[va]
        self.n_pixels = self.x_tr.shape[1]
        self.input_shape, self.n_out = (self.n_pixels,), 10
        self._perm_generator = torch.Generator().manual_seed(20_000 + seed)
        self._perms = [torch.arange(self.n_pixels)]

    def _init_declining(self, setting: Setting, seed: int, data_root, arrays) -> None:
        """Random-label / binary streams: the harness's standardised images, flattened."""
        x_tr, y_tr, x_te, y_te = arrays if arrays is not None else load_standard_arrays(setting.data, data_root)
        self.x_all, self.y_all, self.x_te, self.y_te = x_tr, y_tr, x_te, y_te
        self.x_tr = x_tr[: setting.examples_per_task]
        self.input_shape = (x_tr.shape[1],)
        self.n_out = 10 if setting.stream == "random_labels" else 2
        if setting.stream not in ("random_labels", "binary"):
            raise ValueError(f"unknown stream {setting.stream!r}")

    def _declining_task(self, t: int):
        s = self.setting
        g = torch.Generator().manual_seed(40_000 + 1000 * self.seed + t)
        if s.stream == "random_labels":  # same images, fresh labels; the task is to memorise them
            y = torch.randint(0, 10, (len(self.x_tr),), generator=g)
            order = torch.randperm(len(self.x_tr), generator=g)
            return self.x_tr[order], y[order], self.x_tr, y
        pair = torch.randperm(10, generator=g)[:2]
        train = ((self.y_all == pair[0]) | (self.y_all == pair[1])).nonzero().squeeze(1)[: s.examples_per_task]
        val = ((self.y_te == pair[0]) | (self.y_te == pair[1])).nonzero().squeeze(1)[: s.n_val]
        train = train[torch.randperm(len(train), generator=g)]
        return (self.x_all[train], (self.y_all[train] == pair[1]).long(), self.x_te[val],
                (self.y_te[val] == pair[1]).long())

    def permutation(self, t: int) -> torch.Tensor:
        while len(self._perms) <= t:
            self._perms.append(torch.randperm(self.n_pixels, generator=self._perm_generator))
        return self._perms[t]

    def task(self, t: int):
        s = self.setting
        if s.data == "scr":
            x, y = self.scr.period(t)
            xv, yv = self.scr.period(t, s.n_val, stream=1)
            return x, y, xv, yv
        if s.stream != "permuted":
            return self._declining_task(t)
        p = self.permutation(t)
        order = torch.randperm(len(self.x_tr), generator=torch.Generator().manual_seed(30_000 + 1000 * self.seed + t))
        return self.x_tr[order][:, p], self.y_tr[order], self.x_val[:, p], self.y_val


@functools.lru_cache(maxsize=2)
def load_standard_arrays(data: str, data_root=None):
    """``(x_train, y_train, x_test, y_test)`` flattened as the harness loads them (MNIST standardised
    with Avalanche's mean and std; digits standardised), cached per process."""
    x_tr, y_tr, x_te, y_te = load_mnist_arrays(data_root) if data == "mnist" else load_digits_arrays()
    return x_tr.reshape(len(x_tr), -1).contiguous(), y_tr, x_te.reshape(len(x_te), -1).contiguous(), y_te


@functools.lru_cache(maxsize=2)
def load_unit_arrays(data: str, data_root=None):
    """``(x_train, y_train, x_test, y_test)`` flattened, pixels mapped back to [0, 1] (cached per
    process)."""
    x_tr, y_tr, x_te, y_te = load_standard_arrays(data, data_root)
    lo, hi = float(x_tr.min()), float(x_tr.max())
    return ((x_tr - lo) / (hi - lo)).clamp(0, 1), y_tr, ((x_te - lo) / (hi - lo)).clamp(0, 1), y_te
