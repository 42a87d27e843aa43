"""Does Optimization Readiness (OR) rank checkpoints by how much they can still learn?

What it measures. Learners are trained online (batch 1, one pass per task) on a continual stream;
every ``checkpoint_every`` tasks the state (``state_dict`` + optimizer state) is saved and scored
against the *next* task: OR (``avalanche_plugins.readiness.optimization_readiness``, both the
paper's ``"sampled"`` estimator — 128 minibatches of size 4 — and the exact ``"per_sample"`` one),
its factors S and R, and the label-agnostic baselines (effective rank and 99 % energy rank of the
last hidden layer's features, eNTK energy rank, Hessian energy rank, active-unit fraction). The
ground truth is ``G^(k)`` (``k_step_gain``: the mean relative validation-loss decrease after
``k`` steps, 128 independent runs) for each k and each ground-truth optimizer. Within each run
(one seed of one learner) the pairwise ranking accuracy (PRA) of every metric against every
``G^(k)`` is computed over its checkpoints; tables give mean ± s.e. over runs, for all checkpoints
and stratified by regime ("dead": the last hidden layer has no active unit on the probe inputs;
"live": otherwise) — on SCR the dead regime alone can produce a high headline (docs/references.md,
"Measured on this machine"). Also: the validation-size ablation (OR from 16 minibatches of size 1
on 100 / 10 / 1 / 0.1 % of the validation set for SCR, 100 / 10 / 1 % for P-MNIST), cost ratios
measured in the same run (ground truth ``G^(10)``, ``G^(100)`` vs OR; per-sample vs sampled OR) and
a plot of OR and the true gain along each run.

Benchmarks (source: "Predicting Plasticity in Deep Continual Learning", arXiv 2605.09044, via
docs/references.md §3; the benchmark definitions follow Dohare et al.'s loss-of-plasticity code):

* ``scr``: Slowly-Changing Regression (:mod:`benchmarks.scr`), variants ``bit_flip`` and
  ``resample``; learner MLP 20 → 5 (→ 5) → 1 (1 and 2 hidden layers, ReLU), Adam lr 0.01,
  batch 1, MSE. Task = period. Validation set = an independent draw of the same period.
* ``pmnist``: Permuted MNIST from ``--data-root`` (Permuted scikit-learn digits, 8×8, when absent):
  3×100 ReLU MLP, SGD lr 0.003, batch 1, one pass per task, cross-entropy, pixels in [0, 1] (the
  harness arrays are standardised; they are mapped back to [0, 1] with the training set's min and
  max, which for MNIST/digits is exactly the inverse of the affine standardisation). Task 0 is
  unpermuted, later tasks use seeded random pixel permutations. Training: a fixed subset of
  ``examples_per_task`` training images, reshuffled each task; validation: a fixed subset of
  held-out (test-split) images under the target task's permutation (nothing is tuned on it).

Reconstructions and choices (not fixed by the sources available here):

* **Training loop.** A hand-written NumPy loop (forward, backward and the Adam/SGD update written
  out for Linear+ReLU MLPs, operating in place on the model's parameters) instead of Avalanche's
  strategy loop: measured here on SCR (20-5-5-1, Adam, batch 1, one torch thread, busy 2-core
  machine), Avalanche's ``Naive`` strategy trained at ≈ 440 steps/s and this loop at ≈ 6,000–12,000
  steps/s, and the full run needs millions of steps. :func:`benchmarks.scr.scr_benchmark` still provides the Avalanche stream for
  users who want to run Avalanche strategies on SCR. The update matches ``torch.optim.Adam`` /
  ``torch.optim.SGD`` (tested), and checkpoints store the optimizer state in
  ``torch.optim`` ``state_dict`` format.
* **Ground truth.** ``G^(k)`` for ``k ∈ {1, 10, 100}`` (``{1, 10}`` with ``--quick``), 128 runs,
  minibatches of ``gain_batch = 4`` (the batch of OR's reliability term R, so that the quantity
  OR bounds is the one measured) from the target task's training examples, loss measured on its
  validation set. Ground-truth optimizers: ``adam_fresh`` (fresh Adam state; SCR lr 0.01, P-MNIST
  lr 0.001) and ``sgd`` (SCR lr 0.01, P-MNIST lr 0.003). A diverging run gives a non-finite gain,
  mapped to −1e300 (the worst possible gain) before ranking. On SCR (Adam learner) also
  ``adam_continue``: Adam continuing from the checkpoint's own moments and step count (lr 0.01), by
  :func:`continuing_adam_gain` (``k_step_gain`` with ``adam_state``); it uses the same
  minibatches as ``adam_fresh``. On P-MNIST the learner is plain SGD (stateless), so its
  "continuing" ground truth is the ``sgd`` column.
* **Layer of the representation ranks.** Effective rank / energy rank use the last hidden layer
  (the representation read by the head); the eNTK and Hessian ranks use all parameters (Hessian:
  exact for the tiny SCR nets, Gauss–Newton on the probe set otherwise, as
  ``hessian_energy_rank`` decides). Probes: the first ``n_probe`` validation samples
  (``n_probe_jacobian`` for the Jacobian-based ranks).
* **PRA** = ``pairwise_ranking_accuracy`` (pairs with equal true gain skipped, metric ties ½); a
  stratum with fewer than 2 checkpoints or no untied pair gives no value for that run.
* **Aggregation.** "mean ± s.e." is over runs (seeds × learner variants of a benchmark).
* **Threads.** torch runs single-threaded (``--threads 1``): every tensor is tiny, and on a busy
  2-core machine the default thread pool made the vectorised ground truth ~15× slower.

Cost of the full run (measured per checkpoint on a 2-core machine that was also running another
job, so roughly halve it unloaded): SCR ≈ 5 s per checkpoint (three ground truths × k ≤ 100 on
10,000 validation examples) plus ≈ 140 s of training (150 periods × 10,000 steps) per run, i.e.
≈ 5 min per run, 4 learners × 3 seeds ≈ 1 h; P-MNIST (MNIST subset, 10,000 images per task,
2,000 validation images) ≈ 40 s per checkpoint plus ≈ 4 min of training, ≈ 25 min per seed.
``--only`` runs single learners, e.g. in separate processes. ``--quick``: 3 SCR learners and
Permuted digits, 2 seeds, k ∈ {1, 10} (G^(100) timed once per run for the cost ratio), about
2.5 min on that busy machine.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from avalanche_plugins.core.stats import pairwise_ranking_accuracy
from avalanche_plugins.readiness import (
    active_unit_fraction,
    effective_rank,
    energy_rank,
    entk_energy_rank,
    hessian_energy_rank,
    hidden_features,
    k_step_gain,
    optimization_readiness,
)
from benchmarks.harness import Timer, benchmark_parser, seed_everything, summarize, write_results
from benchmarks.models import MLP
from benchmarks.scr import SlowlyChangingRegression

METRICS = ("or", "or_per_sample", "strength", "reliability", "effective_rank", "energy_rank",
           "entk_energy_rank", "hessian_energy_rank", "active_units")
METRIC_LABELS = {"or": "OR (sampled)", "or_per_sample": "OR (per-sample)", "strength": "S",
                 "reliability": "R", "effective_rank": "effective rank", "energy_rank": "energy rank (99%)",
                 "entk_energy_rank": "eNTK energy rank", "hessian_energy_rank": "Hessian energy rank",
                 "active_units": "active units"}
STRATA = ("all", "dead", "live")
DIVERGED = -1e300


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One learner on one benchmark (a run = one setting × one seed)."""

    benchmark: str  # "scr" | "pmnist"
    name: str
    hidden: tuple[int, ...]
    optimizer: str  # learner optimizer: "adam" | "sgd"
    lr: float
    n_checkpoints: int
    checkpoint_every: int = 5
    examples_per_task: int = 10_000
    n_val: int = 10_000
    variant: str = "bit_flip"  # SCR only
    ks: tuple[int, ...] = (1, 10, 100)
    gain_optimizers: tuple[tuple[str, str, float], ...] = (("adam_fresh", "adam", 0.01), ("sgd", "sgd", 0.01))
    gain_batch: int = 4
    n_runs: int = 128
    or_batch: int = 4
    or_batches: int = 128
    n_probe: int = 256
    n_probe_jacobian: int = 64
    ablation_fractions: tuple[float, ...] = (1.0, 0.1, 0.01, 0.001)
    ablation_batches: int = 16
    ablation_batch: int = 1
    cost_k: tuple[int, ...] = (10, 100)  # G^(k) timed for the cost ratio (extra runs if not in ks)
    data: str = "scr"  # "scr" | "mnist" | "digits"
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def n_tasks(self) -> int:
        """Tasks trained; the target of the last checkpoint is task ``n_tasks``."""
        return self.n_checkpoints * self.checkpoint_every


def default_settings(quick: bool, data_root=None, *, pmnist_examples: int | None = None,
                     pmnist_val: int | None = None) -> list[Setting]:
    """The learners of the full run (or the reduced ``--quick`` run)."""
    settings = []
    scr_common = dict(optimizer="adam", lr=0.01, gain_optimizers=(
        ("adam_fresh", "adam", 0.01), ("adam_continue", "adam_continue", 0.01), ("sgd", "sgd", 0.01)))
    if quick:
        scr_common.update(n_checkpoints=12, examples_per_task=2000, n_val=1000, ks=(1, 10), n_probe=128,
                          n_probe_jacobian=32)
        scr_grid = [("bit_flip", (5,)), ("bit_flip", (5, 5)), ("resample", (5, 5))]
    else:
        scr_common.update(n_checkpoints=30)
        scr_grid = [(v, h) for v in ("bit_flip", "resample") for h in ((5,), (5, 5))]
    for variant, hidden in scr_grid:
        settings.append(Setting(benchmark="scr", name=f"scr/{variant}/h{len(hidden)}", hidden=hidden,
                                variant=variant, data="scr", **scr_common))
    data = "mnist" if data_root is not None else "digits"
    pm = dict(optimizer="sgd", lr=0.003, gain_optimizers=(("sgd", "sgd", 0.003), ("adam_fresh", "adam", 0.001)),
              ablation_fractions=(1.0, 0.1, 0.01), hidden=(100, 100, 100), data=data)
    if quick:
        pm.update(n_checkpoints=8, ks=(1, 10), n_probe=128, n_probe_jacobian=16,
                  examples_per_task=pmnist_examples or (1347 if data == "digits" else 1000),
                  n_val=pmnist_val or (450 if data == "digits" else 500))
    else:
        pm.update(n_checkpoints=30, n_probe=256, n_probe_jacobian=16,
                  examples_per_task=pmnist_examples or (1347 if data == "digits" else 10_000),
                  n_val=pmnist_val or (450 if data == "digits" else 2000))
    settings.append(Setting(benchmark="pmnist", name=f"pmnist/{data}", **pm))
    return settings


# --------------------------------------------------------------------------------------------
# Task data
# --------------------------------------------------------------------------------------------


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


def load_unit_arrays(data: str, data_root=None):
    """``(x_train, y_train, x_test, y_test)`` flattened, pixels mapped back to [0, 1]."""
    from benchmarks.data import load_digits_arrays, load_mnist_arrays

    arrays = load_mnist_arrays(data_root) if data == "mnist" else load_digits_arrays()
    x_tr, y_tr, x_te, y_te = arrays
    lo, hi = float(x_tr.min()), float(x_tr.max())

    def unit(x):
        return ((x - lo) / (hi - lo)).clamp(0, 1).reshape(len(x), -1).contiguous()

    return unit(x_tr), y_tr, unit(x_te), y_te


# --------------------------------------------------------------------------------------------
# Tight online training loop
# --------------------------------------------------------------------------------------------


class OnlineLearner:
    """Batch-1 online training of an ``MLP`` (Linear+ReLU chain) in NumPy, in place on the model.

    ``loss``: ``"mse"`` (``nn.MSELoss`` on a ``(1, 1)`` output) or ``"ce"`` (``nn.CrossEntropyLoss``).
    ``optimizer``: ``"adam"`` (``torch.optim.Adam`` defaults: betas (0.9, 0.999), eps 1e-8, bias
    correction) or ``"sgd"``. The parameter arrays are NumPy views of the model's tensors.
    """

    def __init__(self, model: nn.Module, optimizer: str, lr: float, loss: str,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        if optimizer not in ("adam", "sgd") or loss not in ("mse", "ce"):
            raise ValueError(f"unsupported optimizer/loss {optimizer!r}/{loss!r}")
        self.model, self.optimizer, self.lr, self.loss = model, optimizer, lr, loss
        self.betas, self.eps = betas, eps
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        self.tensors = [p for lin in linears for p in (lin.weight, lin.bias)]
        if [id(p) for p in self.tensors] != [id(p) for p in model.parameters()]:
            raise ValueError("OnlineLearner needs a plain Linear/ReLU MLP (parameters = weights and biases in order)")
        self.W = [lin.weight.detach().numpy() for lin in linears]
        self.b = [lin.bias.detach().numpy() for lin in linears]
        self.steps = 0
        if optimizer == "adam":
            self.mW = [np.zeros_like(w) for w in self.W]
            self.vW = [np.zeros_like(w) for w in self.W]
            self.mb = [np.zeros_like(b) for b in self.b]
            self.vb = [np.zeros_like(b) for b in self.b]

    def train(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One pass over ``(x, y)`` in order, one sample per step; returns the mean online loss."""
        xs = x.reshape(len(x), -1).numpy().astype(np.float32, copy=False)
        ys = y.numpy()
        W, b, n_layers = self.W, self.b, len(self.W)
        mse = self.loss == "mse"
        adam = self.optimizer == "adam"
        lr = self.lr
        beta1, beta2 = self.betas
        eps = self.eps
        total = 0.0
        acts: list = [None] * n_layers
        for i in range(len(xs)):
            h = xs[i]
            for j in range(n_layers - 1):
                acts[j] = h
                h = W[j] @ h + b[j]
                np.maximum(h, 0, out=h)
            acts[n_layers - 1] = h
            out = W[-1] @ h + b[-1]
            if mse:
                diff = out - ys[i]
                total += float(diff @ diff) / diff.size
                delta = (2.0 / diff.size) * diff
            else:
                z = out - out.max()
                e = np.exp(z)
                s = e.sum()
                label = int(ys[i])
                total += math.log(s) - float(z[label])
                delta = e / s
                delta[label] -= 1.0
            if adam:
                self.steps += 1
                t = self.steps
                step_size = lr / (1 - beta1 ** t)
                root_c2 = math.sqrt(1 - beta2 ** t)
            for j in range(n_layers - 1, -1, -1):
                a = acts[j]
                g_w = np.outer(delta, a)
                g_b = delta
                if j > 0:
                    delta = (W[j].T @ delta) * (a > 0)
                if adam:
                    for p, m, v, g in ((W[j], self.mW[j], self.vW[j], g_w), (b[j], self.mb[j], self.vb[j], g_b)):
                        m *= beta1
                        m += (1 - beta1) * g
                        v *= beta2
                        v += (1 - beta2) * (g * g)
                        p -= step_size * m / (np.sqrt(v) / root_c2 + eps)
                else:
                    W[j] -= lr * g_w
                    b[j] -= lr * g_b
            if not adam:
                self.steps += 1
        return total / max(len(xs), 1)

    def optimizer_state_dict(self) -> dict:
        """The optimizer state in ``torch.optim.Adam`` / ``torch.optim.SGD`` ``state_dict`` format."""
        params = list(self.model.parameters())
        if self.optimizer == "adam":
            opt = torch.optim.Adam(params, lr=self.lr, betas=self.betas, eps=self.eps)
            state = opt.state_dict()
            moments = [(m, v) for j in range(len(self.W)) for m, v in ((self.mW[j], self.vW[j]), (self.mb[j], self.vb[j]))]
            state["state"] = {i: {"step": torch.tensor(float(self.steps)), "exp_avg": torch.tensor(m.copy()),
                                  "exp_avg_sq": torch.tensor(v.copy())} for i, (m, v) in enumerate(moments)}
            return state
        return torch.optim.SGD(params, lr=self.lr).state_dict()

    def checkpoint(self) -> dict:
        return {"model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "optimizer": self.optimizer_state_dict(), "steps": self.steps}


# --------------------------------------------------------------------------------------------
# Scoring a checkpoint
# --------------------------------------------------------------------------------------------


def last_hidden_dead(model: nn.Module, probe: torch.Tensor) -> bool:
    """True if the last hidden layer has no unit that is non-zero on any probe input."""
    feats = hidden_features(model, probe)
    last = list(feats.values())[-1]
    return not bool((last.abs().reshape(len(last), -1).amax(dim=0) > 0).any())


def _finite_gain(value: float) -> float:
    return value if math.isfinite(value) else DIVERGED


def _safe_or(model, loss_fn, x, y, **kw):
    try:
        return optimization_readiness(model, loss_fn, x, y, **kw)
    except ValueError:  # zero loss on a tiny subset: OR undefined
        return None


def continuing_adam_gain(model: nn.Module, loss_fn, optimizer_state: dict, train_inputs, train_targets,
                         val_inputs, val_targets, *, k: int, lr: float, batch_size: int, n_runs: int = 128,
                         seed: int = 0, chunk_size: int = 1024) -> dict:
    """``G^(k)`` for Adam *continuing* from a checkpoint's optimizer state (moments and step count).

    Same protocol as :func:`avalanche_plugins.readiness.k_step_gain` (``n_runs`` vectorised runs,
    the same seeded minibatch draw, so with the same ``seed`` the runs use exactly the minibatches
    of ``k_step_gain``'s), but every run starts from ``optimizer_state`` (a ``torch.optim.Adam``
    ``state_dict``, parameters in ``model.parameters()`` order) instead of zero moments: step
    ``t`` uses bias corrections ``1 − β^(t₀ + t)`` (``k_step_gain(..., adam_state=...)``).
    Returns ``{"gain", "stderr", "indices"}``; a diverged run gives a non-finite gain.
    """
    result = k_step_gain(model, loss_fn, train_inputs, train_targets, val_inputs, val_targets, k=k, lr=lr,
                         optimizer="adam", batch_size=batch_size, n_runs=n_runs, seed=seed,
                         chunk_size=chunk_size, adam_state=optimizer_state)
    return {"gain": result.gain, "stderr": result.stderr, "indices": result.indices,
            "loss_before": result.loss_before}


def score_checkpoint(setting: Setting, model: nn.Module, loss_fn, data, *, seed: int,
                     time_costs: bool = False, optimizer_state: dict | None = None) -> dict:
    """Every metric, ground truth and ablation value of ``model`` on one target task."""
    x_tr, y_tr, x_val, y_val = data
    s = setting
    rec: dict = {}
    timings: dict = {}
    t0 = time.perf_counter()
    res = optimization_readiness(model, loss_fn, x_val, y_val, batch_size=s.or_batch, n_batches=s.or_batches,
                                 estimator="sampled", seed=seed)
    timings["or_sampled_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    res_ps = optimization_readiness(model, loss_fn, x_val, y_val, batch_size=s.or_batch, estimator="per_sample")
    timings["or_per_sample_s"] = time.perf_counter() - t0
    rec.update(loss=res.loss, or_=res.readiness, strength=res.strength, reliability=res.reliability,
               or_per_sample=res_ps.readiness)
    rec["or"] = rec.pop("or_")
    probe = x_val[: s.n_probe]
    probe_j, probe_jy = x_val[: s.n_probe_jacobian], y_val[: s.n_probe_jacobian]
    feats = hidden_features(model, probe)
    last = list(feats.values())[-1].reshape(len(probe), -1)
    rec["effective_rank"] = effective_rank(last)
    rec["energy_rank"] = float(energy_rank(last))
    rec["active_units"] = active_unit_fraction(model, probe)
    rec["dead"] = not bool((last.abs().amax(dim=0) > 0).any())
    rec["last_layer_active"] = float((last.abs().amax(dim=0) > 0).float().mean())
    t0 = time.perf_counter()
    rec["entk_energy_rank"] = float(entk_energy_rank(model, probe_j))
    timings["entk_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    rec["hessian_energy_rank"] = float(hessian_energy_rank(model, loss_fn, probe_j, probe_jy))
    timings["hessian_s"] = time.perf_counter() - t0
    for name, opt, lr in s.gain_optimizers:
        for k in s.ks:
            t0 = time.perf_counter()
            if opt == "adam_continue":
                if optimizer_state is None:
                    raise ValueError("the adam_continue ground truth needs the checkpoint's optimizer_state")
                g = continuing_adam_gain(model, loss_fn, optimizer_state, x_tr, y_tr, x_val, y_val, k=k, lr=lr,
                                         batch_size=s.gain_batch, n_runs=s.n_runs, seed=seed)
                gain, stderr = g["gain"], g["stderr"]
            else:
                g = k_step_gain(model, loss_fn, x_tr, y_tr, x_val, y_val, k=k, lr=lr, optimizer=opt,
                                batch_size=s.gain_batch, n_runs=s.n_runs, seed=seed)
                gain, stderr = g.gain, g.stderr
            timings[f"gain_{name}_k{k}_s"] = time.perf_counter() - t0
            rec[f"gain_{name}_k{k}"] = _finite_gain(gain)
            rec[f"gain_{name}_k{k}_stderr"] = stderr
    if time_costs:  # the cost ratio needs G^(k) timings also for k not ranked in this run
        name, opt, lr = s.gain_optimizers[0]
        for k in s.cost_k:
            if f"gain_{name}_k{k}_s" not in timings:
                t0 = time.perf_counter()
                k_step_gain(model, loss_fn, x_tr, y_tr, x_val, y_val, k=k, lr=lr, optimizer=opt,
                            batch_size=s.gain_batch, n_runs=s.n_runs, seed=seed)
                timings[f"gain_{name}_k{k}_s"] = time.perf_counter() - t0
    for frac in s.ablation_fractions:
        n = max(2, int(round(frac * len(x_val))))
        r = _safe_or(model, loss_fn, x_val[:n], y_val[:n], batch_size=min(s.ablation_batch, n),
                     n_batches=s.ablation_batches, estimator="sampled", seed=seed)
        rec[f"or_val{frac:g}"] = r.readiness if r is not None else float("nan")
        rec[f"or_val{frac:g}_n"] = n
    rec["timings"] = timings
    return rec


# --------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------


def run_setting(setting: Setting, seed: int, *, data_root=None, arrays=None, progress: bool = True,
                checkpoint_dir=None) -> dict:
    """Train one learner online, score every checkpoint; returns ``{"checkpoints": [...], ...}``."""
    source = TaskSource(setting, seed, data_root=data_root, arrays=arrays)
    seed_everything(seed)
    model = MLP(source.input_shape, hidden=setting.hidden, n_classes=source.n_out)
    loss_name = "mse" if setting.benchmark == "scr" else "ce"
    loss_fn = nn.MSELoss() if loss_name == "mse" else nn.CrossEntropyLoss()
    learner = OnlineLearner(model, setting.optimizer, setting.lr, loss_name)
    checkpoints = []
    train_seconds = score_seconds = 0.0
    bar = tqdm(range(setting.n_tasks), desc=f"{setting.name} seed {seed}", disable=not progress, leave=False)
    for t in bar:
        x, y, _, _ = source.task(t)
        t0 = time.perf_counter()
        train_loss = learner.train(x, y)
        train_seconds += time.perf_counter() - t0
        if (t + 1) % setting.checkpoint_every:
            continue
        ckpt = learner.checkpoint()
        if checkpoint_dir is not None:
            torch.save(ckpt, f"{checkpoint_dir}/{setting.name.replace('/', '_')}_s{seed}_t{t + 1}.pt")
        scored = MLP(source.input_shape, hidden=setting.hidden, n_classes=source.n_out)
        scored.load_state_dict(ckpt["model"])
        t0 = time.perf_counter()
        rec = score_checkpoint(setting, scored, loss_fn, source.task(t + 1), seed=seed,
                               time_costs=(len(checkpoints) == 0),
                               optimizer_state=ckpt["optimizer"] if setting.optimizer == "adam" else None)
        score_seconds += time.perf_counter() - t0
        rec.update(tasks_trained=t + 1, target_task=t + 1, steps=ckpt["steps"], train_loss_last_task=train_loss)
        checkpoints.append(rec)
        bar.set_postfix(dead=sum(c["dead"] for c in checkpoints), loss=f"{train_loss:.3g}")
    return {"setting": setting.name, "benchmark": setting.benchmark, "seed": seed, "checkpoints": checkpoints,
            "train_seconds": train_seconds, "score_seconds": score_seconds,
            "steps_per_second": learner.steps / max(train_seconds, 1e-9)}


# --------------------------------------------------------------------------------------------
# Ranking accuracy, tables, plot
# --------------------------------------------------------------------------------------------


def gain_keys(setting: Setting) -> list[tuple[str, int]]:
    return [(name, k) for name, _, _ in setting.gain_optimizers for k in setting.ks]


def _pra(metric, truth):
    metric, truth = np.asarray(metric, float), np.asarray(truth, float)
    keep = np.isfinite(metric) & np.isfinite(truth)
    if keep.sum() < 2 or np.unique(truth[keep]).size < 2:
        return None
    return pairwise_ranking_accuracy(metric[keep], truth[keep])


def pra_rows(run: dict, setting: Setting) -> list[dict]:
    """One row per (stratum, ground truth, k, metric) with the run's PRA (None when undefined)."""
    cks = run["checkpoints"]
    rows = []
    dead = np.array([c["dead"] for c in cks], bool)
    masks = {"all": np.ones(len(cks), bool), "dead": dead, "live": ~dead}
    ablation = [f"or_val{f:g}" for f in setting.ablation_fractions]
    for stratum, mask in masks.items():
        sub = [c for c, m in zip(cks, mask) if m]
        for name, k in gain_keys(setting):
            truth = [c[f"gain_{name}_k{k}"] for c in sub]
            for metric in (*METRICS, *ablation):
                value = _pra([c[metric] for c in sub], truth) if len(sub) >= 2 else None
                rows.append({"benchmark": setting.benchmark, "setting": setting.name, "seed": run["seed"],
                             "stratum": stratum, "gain": name, "k": k, "metric": metric, "pra": value,
                             "n_checkpoints": len(sub)})
    return rows


def _mean_se(values):
    xs = np.array([v for v in values if v is not None], float)
    if xs.size == 0:
        return None, None, 0
    se = float(xs.std(ddof=1) / math.sqrt(xs.size)) if xs.size > 1 else 0.0
    return float(xs.mean()), se, int(xs.size)


def _label(metric: str) -> str:
    if metric.startswith("or_val"):
        return f"OR (16×1) on {100 * float(metric[6:]):g}% of val"
    return METRIC_LABELS.get(metric, metric)


def pra_table(rows, stratum: str, metrics=METRICS) -> tuple[str, dict]:
    """Markdown table (rows = metrics, columns = benchmark × ground truth × k) and its values."""
    cols = list(dict.fromkeys((r["benchmark"], r["gain"], r["k"]) for r in rows))
    values: dict = {}
    header = ["metric", *[f"{b} {g} k={k}" for b, g, k in cols]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for metric in metrics:
        cells = [_label(metric)]
        for b, g, k in cols:
            sel = [r["pra"] for r in rows if r["stratum"] == stratum and r["metric"] == metric
                   and r["benchmark"] == b and r["gain"] == g and r["k"] == k]
            mean, se, n = _mean_se(sel)
            if sel:  # metrics that a benchmark does not have (e.g. its ablation sizes) get no entry
                values.setdefault(b, {}).setdefault(f"{g}/k{k}", {})[metric] = {"mean": mean, "se": se, "n_runs": n}
            cells.append("—" if mean is None else f"{mean:.3f} ± {se:.3f} ({n})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), values


BASELINES = ("effective_rank", "energy_rank", "entk_energy_rank", "hessian_energy_rank", "active_units")


def headlines(values: dict, settings: dict) -> dict:
    """Per benchmark, at the first ground truth and the largest k: OR's PRA per stratum and the best
    label-agnostic baseline's (all checkpoints). First ground truth: ``adam_fresh`` on SCR (the most
    predictable choice in the calibration notes; SGD at the learner's lr diverges on many
    Adam-trained checkpoints), ``sgd`` (the paper's definition of G, and the learner's optimizer) on
    P-MNIST."""
    out = {}
    for bench, columns in values["all"].items():
        s = next(x for x in settings.values() if x.benchmark == bench)
        column = f"{s.gain_optimizers[0][0]}/k{max(s.ks)}"
        if column not in columns:
            continue
        cells = columns[column]
        base = {m: cells[m]["mean"] for m in BASELINES if cells.get(m, {}).get("mean") is not None}
        best = max(base, key=base.get) if base else None
        or_all = cells["or"]["mean"]
        out[bench] = {
            "column": column,
            "or_by_stratum": {st: values[st].get(bench, {}).get(column, {}).get("or", {}).get("mean")
                              for st in STRATA},
            "best_baseline": best,
            "best_baseline_pra": base.get(best, float("nan")),
            "or_above_every_baseline": bool(or_all is not None and all(or_all > v for v in base.values())),
        }
    return out


def cost_ratios(runs: list[dict], settings: dict) -> dict:
    """Per benchmark: median over runs of (G^(k) time / sampled OR time) at the run's first
    checkpoint (where every cost_k is timed), and median per-sample / sampled OR time."""
    out: dict = {}
    for bench in dict.fromkeys(r["benchmark"] for r in runs):
        first = [r["checkpoints"][0]["timings"] for r in runs if r["benchmark"] == bench and r["checkpoints"]]
        every = [c["timings"] for r in runs if r["benchmark"] == bench for c in r["checkpoints"]]
        s = next(settings[r["setting"]] for r in runs if r["benchmark"] == bench)
        name = s.gain_optimizers[0][0]
        entry = {"ground_truth": name, "n_runs": s.n_runs, "gain_batch": s.gain_batch,
                 "or_sampled_s": float(np.median([t["or_sampled_s"] for t in every])),
                 "or_per_sample_s": float(np.median([t["or_per_sample_s"] for t in every])),
                 "per_sample_over_sampled": float(np.median([t["or_per_sample_s"] / t["or_sampled_s"] for t in every]))}
        for k in sorted({*s.cost_k, *s.ks}):
            key = f"gain_{name}_k{k}_s"
            ratios = [t[key] / t["or_sampled_s"] for t in first if key in t]
            if ratios:
                entry[f"g{k}_over_or"] = float(np.median(ratios))
                entry[f"g{k}_s"] = float(np.median([t[key] for t in first if key in t]))
        out[bench] = entry
    return out


def plot_runs(runs: list[dict], settings: dict, path) -> None:
    """OR (sampled, log scale) and the true gain along each setting's first run; dead checkpoints marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    firsts = {}
    for r in runs:
        firsts.setdefault(r["setting"], r)
    fig, axes = plt.subplots(1, len(firsts), figsize=(4.2 * len(firsts), 3.4), squeeze=False)
    for ax, (name, run) in zip(axes[0], firsts.items()):
        s = settings[name]
        cks = run["checkpoints"]
        x = [c["tasks_trained"] for c in cks]
        ax.semilogy(x, [max(c["or"], 1e-12) for c in cks], "o-", color="tab:blue", label="OR")
        ax.set_xlabel("tasks trained")
        ax.set_ylabel("OR (sampled)", color="tab:blue")
        twin = ax.twinx()
        gname, k = s.gain_optimizers[0][0], max(s.ks)
        twin.plot(x, [max(c[f"gain_{gname}_k{k}"], -1.0) for c in cks], "s--", color="tab:red")
        twin.set_ylabel(f"G^({k}) {gname}", color="tab:red")
        for xi, c in zip(x, cks):
            if c["dead"]:
                ax.axvline(xi, color="grey", alpha=0.2, lw=4)
        ax.set_title(f"{name} seed {run['seed']} (grey: dead)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def run_benchmark(settings: list[Setting], seeds: list[int], out_dir, *, data_root=None, progress: bool = True,
                  save_checkpoints: bool = False, config_extra: dict | None = None, echo: bool = True,
                  threads: int | None = 1) -> dict:
    """Run every setting × seed, write results.json/csv and the plot, print the tables.

    ``threads``: torch intra-op threads while running (restored afterwards). Default 1: every
    tensor here is tiny, and several threads on a busy machine made the vectorised ground truth
    ~15× slower (oversubscription); ``None`` keeps torch's setting.
    """
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run_benchmark(settings, seeds, out_dir, data_root=data_root, progress=progress,
                              save_checkpoints=save_checkpoints, config_extra=config_extra, echo=echo)
    finally:
        torch.set_num_threads(previous_threads)


def _run_benchmark(settings, seeds, out_dir, *, data_root, progress, save_checkpoints, config_extra, echo):
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_dir = None
    if save_checkpoints:
        ckpt_dir = out / "checkpoints"
        ckpt_dir.mkdir(exist_ok=True)
    by_name = {s.name: s for s in settings}
    arrays_cache: dict = {}
    runs, rows = [], []
    with Timer() as total:
        for s in settings:
            arrays = None
            if s.data != "scr":
                if s.data not in arrays_cache:
                    arrays_cache[s.data] = load_unit_arrays(s.data, data_root)
                arrays = arrays_cache[s.data]
            for seed in seeds:
                run = run_setting(s, seed, data_root=data_root, arrays=arrays, progress=progress,
                                  checkpoint_dir=ckpt_dir)
                runs.append(run)
                rows.extend(pra_rows(run, s))
    tables, values = {}, {}
    for stratum in STRATA:
        tables[stratum], values[stratum] = pra_table(rows, stratum)
    ablation_metrics = list(dict.fromkeys(f"or_val{f:g}" for s in settings for f in s.ablation_fractions))
    ablation_table, ablation_values = pra_table([r for r in rows if r["metric"] in ablation_metrics], "all",
                                                metrics=ablation_metrics)
    costs = cost_ratios(runs, by_name)
    headline = headlines(values, by_name)
    regimes = {}
    for r in runs:
        reg = regimes.setdefault(r["setting"], {"dead": 0, "live": 0})
        for c in r["checkpoints"]:
            reg["dead" if c["dead"] else "live"] += 1
    ablation_sizes = {s.name: {f"{f:g}": max(2, int(round(f * s.n_val))) for f in s.ablation_fractions}
                      for s in settings}
    summary = summarize([r for r in rows if r["pra"] is not None], ["benchmark", "stratum", "gain", "k", "metric"],
                        ["pra"])
    extra = {
        "pra": values["all"],
        "pra_by_stratum": values,
        "ablation": ablation_values,
        "ablation_sizes": ablation_sizes,
        "cost_ratios": costs,
        "headline": headline,
        "regimes": regimes,
        "checkpoints": [{"setting": r["setting"], "seed": r["seed"], "checkpoints": r["checkpoints"]} for r in runs],
        "training": [{"setting": r["setting"], "seed": r["seed"], "train_seconds": r["train_seconds"],
                      "score_seconds": r["score_seconds"], "steps_per_second": r["steps_per_second"]} for r in runs],
    }
    config = {"settings": [asdict(s) for s in settings], "seeds": seeds, **(config_extra or {})}
    write_results(out, config=config, rows=rows, summary=summary, wall_seconds=total.seconds, extra=extra)
    plot_runs(runs, by_name, out / "or_vs_gain.png")
    if echo:
        for stratum in STRATA:
            print(f"\n### Pairwise ranking accuracy — {stratum} checkpoints (mean ± s.e. over runs (n runs))")
            print(tables[stratum])
        print("\n### Validation-size ablation: OR from 16 minibatches of size 1 on a fraction of the validation set")
        print(ablation_table)
        print("validation sizes: " + "; ".join(f"{k}: " + ", ".join(f"{f}→{n}" for f, n in v.items())
                                               for k, v in ablation_sizes.items()))
        print("\nregimes (checkpoints): " + ", ".join(f"{k} dead {v['dead']} / live {v['live']}" for k, v in regimes.items()))
        print("\n### Cost (same run, median)")
        for bench, c in costs.items():
            parts = [f"{key.split('_')[0]}/OR {v:.1f}x" for key, v in c.items() if key.endswith("_over_or")]
            print(f"{bench}: OR sampled {1000 * c['or_sampled_s']:.1f} ms, per-sample {1000 * c['or_per_sample_s']:.1f} ms "
                  f"(per-sample/sampled {c['per_sample_over_sampled']:.2f}x); " + ", ".join(parts)
                  + f" [ground truth {c['ground_truth']}, {c['n_runs']} runs]")
        print("\n### Headline (OR sampled vs the best label-agnostic baseline)")
        for bench, h in headline.items():
            strata = ", ".join(f"{k} {v:.3f}" for k, v in h["or_by_stratum"].items() if v is not None)
            print(f"{bench} [{h['column']}]: OR {strata}; best baseline {h['best_baseline']} "
                  f"{h['best_baseline_pra']:.3f}; OR above every baseline: {h['or_above_every_baseline']}")
        print(f"wrote {out}/results.json, results.csv, or_vs_gain.png ({total.seconds:.0f}s)")
    return {"pra": values["all"], "pra_by_stratum": values, "ablation": ablation_values, "cost_ratios": costs,
            "regimes": regimes, "out": str(out)}


def main(argv=None) -> dict:
    parser = benchmark_parser("plasticity_ranking", __doc__.splitlines()[0])
    parser.add_argument("--benchmarks", default="scr,pmnist", help="comma-separated subset of scr,pmnist")
    parser.add_argument("--only", default=None,
                        help="comma-separated setting names to run (e.g. scr/bit_flip/h2,pmnist/mnist); default all")
    parser.add_argument("--pmnist-examples", type=int, default=None,
                        help="training images per P-MNIST task (default 10,000 full / 1,000 quick; digits: all)")
    parser.add_argument("--pmnist-val", type=int, default=None, help="validation images per P-MNIST task")
    parser.add_argument("--save-checkpoints", action="store_true", help="also write every checkpoint to OUT/checkpoints")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: tiny tensors)")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    wanted = {b.strip() for b in args.benchmarks.split(",") if b.strip()}
    settings = [s for s in default_settings(args.quick, args.data_root, pmnist_examples=args.pmnist_examples,
                                            pmnist_val=args.pmnist_val) if s.benchmark in wanted]
    if args.only:
        names = {n.strip() for n in args.only.split(",") if n.strip()}
        settings = [s for s in settings if s.name in names]
        if not settings:
            parser.error(f"--only {args.only!r} matches no setting of --benchmarks {args.benchmarks!r}")
    if not settings:
        parser.error(f"--benchmarks selects nothing from {args.benchmarks!r}")
    seeds = list(range(min(args.seeds, 2) if args.quick else args.seeds))
    return run_benchmark(settings, seeds, args.out, data_root=args.data_root, progress=not args.no_progress,
                         save_checkpoints=args.save_checkpoints, config_extra={"args": vars(args)},
                         threads=args.threads)


if __name__ == "__main__":
    main()
