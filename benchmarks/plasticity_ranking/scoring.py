"""Scoring one checkpoint: OR, its factors, the label-agnostic baselines, the ground truths
``G^(k)``, the validation-size ablation, and the dead/live regime of the checkpoint."""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from avalanche_plugins import readiness as rd
from avalanche_plugins.readiness.lookahead import curvature_readiness, lookahead_readiness
from benchmarks.plasticity_ranking.settings import DIVERGED, Setting


def last_hidden_features(model: nn.Module, probe: torch.Tensor) -> torch.Tensor:
    """The last hidden layer's features ``(n_probe, units)`` on ``probe`` (the representation the
    head reads; the effective / energy ranks and the regime are computed on it)."""
    feats = rd.hidden_features(model, probe)
    return list(feats.values())[-1].reshape(len(probe), -1)


def regime(last: torch.Tensor) -> dict:
    """The regime of a checkpoint from its last hidden layer's features ``(n_probe, units)``:
    ``dead`` when no unit is non-zero on any probe input, and the fraction of units that are
    (``last_layer_active``; examples: docs/benchmarks.md, "Regime"). The PRA tables are stratified
    by ``dead``."""
    active = last.abs().amax(dim=0) > 0
    return {"dead": not bool(active.any()), "last_layer_active": float(active.float().mean())}


def _finite_gain(value: float) -> float:
    return value if math.isfinite(value) else DIVERGED


def _timed(timings: dict, key: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, its wall seconds stored in ``timings[key]``."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    timings[key] = time.perf_counter() - t0
    return out


def _safe_or(model, loss_fn, x, y, **kw):
    try:
        return rd.optimization_readiness(model, loss_fn, x, y, **kw)
    except ValueError:  # zero loss on a tiny subset: OR undefined
        return None


def _variants(s: Setting, model, loss_fn, data, seed: int, timings: dict) -> dict:
    """Our readiness variants LA^(k'), LA_GD^(k') and Q(η) (docs/benchmarks.md, "Variants")."""
    x_tr, y_tr, x_val, y_val = data
    _, opt, lr = s.gain_optimizers[0]
    opt = "adam" if opt.startswith("adam") else opt
    la = _timed(timings, "lookahead_s", lookahead_readiness, model, loss_fn, x_tr, y_tr, eval_inputs=x_val,
                eval_targets=y_val, lr=lr, k=s.lookahead_k, n_runs=s.lookahead_runs, batch_size=s.gain_batch,
                optimizer=opt, seed=seed + 7919)
    probe_x, probe_y = x_val[: s.n_probe], y_val[: s.n_probe]
    # full-batch: every step uses all probe samples, one deterministic run
    la_gd = _timed(timings, "lookahead_gd_s", lookahead_readiness, model, loss_fn, probe_x, probe_y, lr=lr,
                   k=s.lookahead_k, n_runs=1, batch_size=len(probe_x), optimizer=opt)
    sgd_lr = next((g[2] for g in s.gain_optimizers if g[1] == "sgd"), lr)
    q = _timed(timings, "quadratic_gain_s", curvature_readiness, model, loss_fn, x_val, y_val, lr=sgd_lr)
    return {"lookahead": _finite_gain(la.readiness), "lookahead_gd": _finite_gain(la_gd.readiness),
            "quadratic_gain": q.quadratic_gain,
            "grad_curvature": q.curvature}


def _gains(s: Setting, model: nn.Module, loss_fn, data, seed: int, timings: dict, optimizer_state: dict | None,
           time_costs: bool) -> dict:
    """The k-step gain ground truths ``gain_<optimizer>_k<k>`` (and their standard errors) of one checkpoint;
    their seconds go into ``timings`` (with ``time_costs`` also for the ``cost_k`` not ranked)."""
    x_tr, y_tr, x_val, y_val = data
    rec: dict = {}
    for name, opt, lr in s.gain_optimizers:
        continuing = opt == "adam_continue"  # Adam continuing from the checkpoint's state
        if continuing and optimizer_state is None:
            raise ValueError("the adam_continue ground truth needs the checkpoint's "
                             "optimizer_state")
        for k in s.ks:
            n_runs = s.n_runs if continuing else dict(s.n_runs_by_k).get(k, s.n_runs)
            g = _timed(timings, f"gain_{name}_k{k}_s", rd.k_step_gain, model, loss_fn, x_tr, y_tr,
                       x_val, y_val, k=k, lr=lr, optimizer="adam" if continuing else opt,
                       batch_size=s.gain_batch, n_runs=n_runs, seed=seed,
                       adam_state=optimizer_state if continuing else None)
            rec[f"gain_{name}_k{k}"] = _finite_gain(g.gain)
            rec[f"gain_{name}_k{k}_stderr"] = g.stderr
    if time_costs:  # the cost ratio needs G^(k) timings also for k not ranked in this run
        name, opt, lr = s.gain_optimizers[0]
        for k in s.cost_k:
            if f"gain_{name}_k{k}_s" not in timings:
                _timed(timings, f"gain_{name}_k{k}_s", rd.k_step_gain, model, loss_fn, x_tr, y_tr, x_val, y_val,
                       k=k, lr=lr, optimizer=opt, batch_size=s.gain_batch, n_runs=s.n_runs, seed=seed)
    return rec


def score_checkpoint(setting: Setting, model: nn.Module, loss_fn, data, *, seed: int,
                     time_costs: bool = False, optimizer_state: dict | None = None) -> dict:
    """Every metric, ground truth and ablation value of ``model`` on one target task."""
    x_tr, y_tr, x_val, y_val = data
    s = setting
    timings: dict = {}
    res = _timed(timings, "or_sampled_s", rd.optimization_readiness, model, loss_fn, x_val, y_val,
                 batch_size=s.or_batch, n_batches=s.or_batches, estimator="sampled", seed=seed)
    or_ps = float("nan")
    if s.per_sample_or:
        or_ps = _timed(timings, "or_per_sample_s", rd.optimization_readiness, model, loss_fn, x_val, y_val,
                       batch_size=s.or_batch, estimator="per_sample").readiness
    rec = {"loss": res.loss, "grad_norm_sq": res.grad_norm_sq, "strength": res.strength,
           "reliability": res.reliability, "or_per_sample": or_ps, "or": res.readiness}
    probe = x_val[: s.n_probe]
    probe_j, probe_jy = x_val[: s.n_probe_jacobian], y_val[: s.n_probe_jacobian]
    last = last_hidden_features(model, probe)
    rec.update(effective_rank=rd.effective_rank(last), energy_rank=float(rd.energy_rank(last)),
               active_units=rd.active_unit_fraction(model, probe), srank=float(rd.srank(last)),
               feature_rank=float(rd.feature_rank(last)),
               dormant_units=rd.dormant_unit_fraction(model, probe),
               weight_magnitude=rd.average_weight_magnitude(model))
    rec.update(regime(last))
    rec.update(_variants(s, model, loss_fn, data, seed, timings))
    rec["entk_energy_rank"] = float(_timed(timings, "entk_s", rd.entk_energy_rank, model, probe_j))
    rec["hessian_energy_rank"] = float(_timed(timings, "hessian_s", rd.hessian_energy_rank, model, loss_fn,
                                              probe_j, probe_jy))
    rec.update(_gains(s, model, loss_fn, data, seed, timings, optimizer_state, time_costs))
    for frac in s.ablation_fractions:
        n = max(2, int(round(frac * len(x_val))))
        r = _safe_or(model, loss_fn, x_val[:n], y_val[:n], batch_size=min(s.ablation_batch, n),
                     n_batches=s.ablation_batches, estimator="sampled", seed=seed)
        rec[f"or_val{frac:g}"] = r.readiness if r is not None else float("nan")
        rec[f"or_val{frac:g}_n"] = n
    rec["timings"] = timings
    return rec
