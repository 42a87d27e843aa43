"""The task source of a run: ``task(t)`` → training and validation tensors of task ``t``."""

from __future__ import annotations

import functools

import torch

from avalanche_plugins.study.harness.data import load_digits_arrays, load_mnist_arrays
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
        x_tr, y_tr, x_te, y_te = arrays if arrays is not None else load_unit_arrays(setting.data, data_root)
        g = torch.Generator().manual_seed(10_000 + seed)
        n_train = min(setting.examples_per_task, len(x_tr))
        n_val = min(setting.n_val, len(x_te))
        tr = torch.randperm(len(x_tr), generator=g)[:n_train]
        va = torch.randperm(len(x_te), generator=g)[:n_val]
        self.x_tr, self.y_tr = x_tr[tr], y_tr[tr]
        self.x_val, self.y_val = x_te[va], y_te[va]
        self.n_pixels = self.x_tr.shape[1]
        self.input_shape, self.n_out = (self.n_pixels,), 10
        self._perm_generator = torch.Generator().manual_seed(20_000 + seed)
        self._perms = [torch.arange(self.n_pixels)]

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
        p = self.permutation(t)
        order = torch.randperm(len(self.x_tr), generator=torch.Generator().manual_seed(30_000 + 1000 * self.seed + t))
        return self.x_tr[order][:, p], self.y_tr[order], self.x_val[:, p], self.y_val


@functools.lru_cache(maxsize=2)
def load_unit_arrays(data: str, data_root=None):
    """``(x_train, y_train, x_test, y_test)`` flattened, pixels mapped back to [0, 1] (cached per
    process)."""
    arrays = load_mnist_arrays(data_root) if data == "mnist" else load_digits_arrays()
    x_tr, y_tr, x_te, y_te = arrays
    lo, hi = float(x_tr.min()), float(x_tr.max())

    def unit(x):
        return ((x - lo) / (hi - lo)).clamp(0, 1).reshape(len(x), -1).contiguous()

    return unit(x_tr), y_tr, unit(x_te), y_te
