"""Optimization Readiness (OR) as an Avalanche metric: how ready the checkpoint is for the next task.

``OptimizationReadinessMetric`` runs at ``before_training_exp``. At that moment the model is the
checkpoint left by the previous experiences (after the strategy's model adaptation, so a
multi-head model already has the incoming task's head, and after ``make_optimizer``) and
``strategy.experience`` is the incoming experience, i.e. the *target task*. On up to ``n_samples``
random samples of that experience (evaluation transforms, loss ``strategy._criterion`` as its
per-sample mean whatever its reduction, :mod:`avalanche_plugins.core.reductions`) it
computes :func:`avalanche_plugins.readiness.optimization_readiness` and emits through the
``EvaluationPlugin`` (names follow Avalanche's template ``Name/phase/stream/TaskNNN/ExpNNN``, with
the incoming experience's task label and index, e.g. ``.../train_phase/train_stream/Task000/Exp001``):

* ``OptimizationReadiness/...`` — ``OR = S·R``,
* ``ORStrength/...`` — ``S = ‖g‖²/L``,
* ``ORReliability/...`` — ``R = ‖g‖²/E_B‖ĝ_B‖²``,
* ``ORLoss/...`` — ``L``, the mean loss of the sampled target data at the checkpoint,
* ``ORSamplesUsed/...`` — how many samples of the experience these values rest on
  (``min(n_samples, |experience|)``);

with ``baselines=True`` the label-agnostic baselines of :mod:`avalanche_plugins.readiness` on
``n_probe`` of those samples (the Hessian one also uses their targets):

* ``ORBaselineEffectiveRank/...`` and ``ORBaselineEnergyRank/...`` — dicts
  ``{hidden layer name: value}`` from :func:`~avalanche_plugins.readiness.representation_ranks`
  (loggers split them into one scalar per layer; not emitted for a model without hidden layer),
* ``ORBaselineENTKEnergyRank/...`` — :func:`~avalanche_plugins.readiness.entk_energy_rank`,
* ``ORBaselineHessianEnergyRank/...`` — :func:`~avalanche_plugins.readiness.hessian_energy_rank`,
  by default through its Gauss–Newton path (``hessian_max_params=1``; see Cost),
* ``ORBaselineActiveUnitFraction/...`` — :func:`~avalanche_plugins.readiness.active_unit_fraction`
  (not emitted for a model without hidden layer);

with ``diagnostics=True`` (or a tuple of names from :data:`DIAGNOSTICS`) the diagnostics that rank
checkpoints of a declining stream as well as or better than OR (issue 33, docs/RESULTS.md
"Optimization Readiness on streams that lose plasticity"), on the same sampled data (unit
diagnostics on the ``n_probe`` probes), beside OR:

* ``ORGradNormSq/...`` — ``‖g‖²``, OR's own numerator (no extra cost),
* ``ORLookahead/...`` — :func:`~avalanche_plugins.readiness.lookahead.lookahead_readiness`,
  ``LA^(10)`` from 8 runs of ``ground_truth_optimizer`` at ``ground_truth_lr``, minibatches of
  ``batch_size``,
* ``ORLookaheadGD/...`` — the full-batch lookahead ``LA_GD^(10)``: 10 gradient-descent steps of
  ``ground_truth_optimizer`` at ``ground_truth_lr`` on the ``n_probe`` probes, relative loss
  decrease on them (deterministic),
* ``ORCurvatureGain/...`` — :func:`~avalanche_plugins.readiness.lookahead.curvature_readiness`
  ``Q(η)`` at ``ground_truth_lr``,
* ``ORDiagnosticEffectiveRank/...`` (Roy & Vetterli's entropy rank, as in Dohare et al. 2024),
  ``ORDiagnosticSRank/...`` (Kumar et al. 2021) and ``ORDiagnosticFeatureRank/...`` (Lyle et al.
  2022) of the last hidden layer's features, ``ORDiagnosticDormantUnits/...`` (Sokar et al. 2023,
  τ = 0.025) and ``ORDiagnosticWeightMagnitude/...`` (Dohare et al. 2024) — the field's plasticity
  diagnostics (:mod:`avalanche_plugins.readiness.baselines`; the unit and rank ones not emitted for
  a model without hidden layer);

and with ``ground_truth_k=k`` the measured plasticity at the same checkpoint,
:func:`~avalanche_plugins.readiness.k_step_gain`:

* ``ORGroundTruthGain/...`` — ``G^(k)`` and ``ORGroundTruthGainStdErr/...`` its standard error.

  The sampled data are split in two halves by a seeded permutation: the ``k`` optimizer steps
  (``ground_truth_optimizer`` with a fresh state, ``ground_truth_lr``, minibatches of
  ``batch_size``, ``ground_truth_runs`` independent runs) use the first half and ``G^(k)`` is the
  relative loss decrease on the second half. OR itself uses all the sampled data. ``k_step_gain``
  works on a functional copy of the parameters (``torch.func.functional_call`` on stacked
  copies), so the strategy's model and optimizer are never stepped.

All values, with the seeds, sizes and the seconds spent, are also appended to
:attr:`OptimizationReadinessMetric.history` (one dict per training experience); ``result()``
returns the last OR. An experience with fewer samples than ``n_samples`` is measured on all of
them: a warning says so once, and every record holds ``n_samples_used`` (with ``n_samples_asked``;
``n_probe_used`` for the probes), also logged as ``ORSamplesUsed/...``.

Its first measurement runs before the first iteration; a pre-flight
(:mod:`avalanche_plugins._avalanche.preflight`: the model's output type, the layer map when
``baselines=True``, OR on two samples) names the metric when a model is unsupported, and one
of its settings (:meth:`OptimizationReadinessMetric.check_experience`: ``batch_size`` against the
samples each experience of the stream offers, the ground truth's halves) when an experience of the
stream cannot meet them. A task-agnostic stream (``split_continuous_linear_decay_stream``: no
original experience to be ready for) is refused before training.

Side effects: none on the training run. Every estimator reads the parameters through
``torch.func`` (nothing is written to ``.grad``, parameters and buffers are not changed), the
model is evaluated in eval mode (restored afterwards), the optimizer is not touched, random draws
use seeded ``torch.Generator`` objects and the global torch RNG state (CPU, and the strategy's CUDA
device) is additionally saved and restored around the whole measurement.

Cost per experience, with ``N = n_samples``, ``P`` trainable parameters and ``C`` outputs:

* OR (``estimator="sampled"``): one forward/backward pass over the ``N`` samples plus
  ``n_batches`` minibatch gradients of ``batch_size`` samples (about ``N + n_batches·batch_size``
  per-sample gradient evaluations); ``"per_sample"``: ``N`` per-sample gradients. Cheap.
* Baselines: the feature ranks need one forward pass and an SVD per hidden layer. The eNTK and
  the Gauss–Newton Hessian ranks each build the ``(n_probe·C) × P`` output Jacobian in float64
  (``8·n_probe·C·P`` bytes, e.g. 2 GB for 256 probes, 10 classes and 100k parameters; lower
  ``n_probe`` for large models) with about ``C`` backward passes per probe, then a
  ``min(n_probe·C, P)``-sized eigensolve. The exact Hessian (``P ≤ hessian_max_params``) needs
  ``O(P)`` gradient passes and an ``O(P³)`` eigensolve: only for tiny models.
* Ground truth: ``ground_truth_runs · ground_truth_k`` minibatch gradients (vectorised) plus
  ``ground_truth_runs`` evaluations of the validation half; memory ``ground_truth_runs·P``.
"""

from __future__ import annotations

import math
import time

import torch
from avalanche.evaluation.metric_results import MetricValue

from avalanche_plugins._avalanche.boundaries import at_origin, enter_boundary
from avalanche_plugins._avalanche.data import experience_tensors
from avalanche_plugins._avalanche.distributed import plain_model
from avalanche_plugins._avalanche.preflight import (
    check_experiences,
    preflight,
    warn_fewer_samples,
    with_output_transform,
)
from avalanche_plugins._avalanche.recording import RecordingMetric
from avalanche_plugins.core.calls import eval_mode, is_multitask
from avalanche_plugins.core.checks import check_choice, check_int, check_positive
from avalanche_plugins.core.outputs import check_output_transform
from avalanche_plugins.readiness import (
    ESTIMATORS,
    OPTIMIZERS,
    active_unit_fraction,
    average_weight_magnitude,
    dormant_unit_fraction,
    effective_rank,
    entk_energy_rank,
    feature_rank,
    hessian_energy_rank,
    hidden_features,
    k_step_gain,
    optimization_readiness,
    representation_ranks,
    srank,
)
from avalanche_plugins.readiness.lookahead import curvature_readiness, lookahead_readiness

__all__ = ["OptimizationReadinessMetric", "DIAGNOSTICS", "DEFAULT_DIAGNOSTICS"]

#: ``diagnostics=`` names and the metric name each is logged under
DIAGNOSTICS = {"grad_norm_sq": "ORGradNormSq", "lookahead": "ORLookahead", "lookahead_gd": "ORLookaheadGD",
               "quadratic_gain": "ORCurvatureGain", "effective_rank": "ORDiagnosticEffectiveRank",
               "dormant_units": "ORDiagnosticDormantUnits", "weight_magnitude": "ORDiagnosticWeightMagnitude",
               "srank": "ORDiagnosticSRank", "feature_rank": "ORDiagnosticFeatureRank"}
#: ``diagnostics=True``: the ones that matched or beat OR on a declining stream (docs/RESULTS.md, issue
#: 33) — ‖g‖² and the best plasticity diagnostic (effective rank) on random-label MNIST, the lookahead
#: (k ≤ 10, both streams) and its full-batch form (k = 100, random labels); the loss L and S, which
#: also did, are logged anyway (``ORLoss``, ``ORStrength``)
DEFAULT_DIAGNOSTICS = ("grad_norm_sq", "lookahead", "lookahead_gd", "effective_rank")


def _check_diagnostics(diagnostics) -> tuple[str, ...]:
    if diagnostics is False or diagnostics is None:
        return ()
    if diagnostics is True:
        return DEFAULT_DIAGNOSTICS
    if isinstance(diagnostics, str) or not all(isinstance(d, str) for d in diagnostics):
        raise ValueError(f"diagnostics must be a bool or a tuple of names, got {diagnostics!r}")
    unknown = [d for d in diagnostics if d not in DIAGNOSTICS]
    if unknown:
        raise ValueError(f"diagnostics: unknown {unknown}; choose from {sorted(DIAGNOSTICS)}")
    return tuple(diagnostics)


class OptimizationReadinessMetric(RecordingMetric[float]):
    """Logs Optimization Readiness of the checkpoint for each incoming experience (module docstring).

    :param n_samples: samples of the incoming experience used (random, seeded; all of them when the
        experience is smaller: a warning says so once, and each record holds ``n_samples_used``).
    :param batch_size: minibatch size ``B`` of OR's second moment ``E_B‖ĝ_B‖²`` (and of the
        ground-truth optimizer steps). At most ``n_samples`` (``n_samples // 2`` with
        ``ground_truth_k``).
    :param n_batches: minibatches drawn by the ``"sampled"`` estimator.
    :param estimator: ``"sampled"`` (the paper's) or ``"per_sample"`` (exact second moment).
    :param baselines: also log the label-agnostic baselines.
    :param diagnostics: ``True`` logs :data:`DEFAULT_DIAGNOSTICS` beside OR, a tuple of names from
        :data:`DIAGNOSTICS` chooses them (module docstring); ``False`` (default) none.
    :param n_probe: probe inputs of the baselines (the first ``n_probe`` of a seeded permutation of
        the sampled data).
    :param ground_truth_k: if an int ``k``, also measure ``G^(k)`` (None: do not).
    :param ground_truth_lr, ground_truth_optimizer, ground_truth_runs: step size, ``"sgd"`` or
        ``"adam"`` (fresh state), and number of independent runs of the ground truth.
    :param seed: base seed; experience number ``e`` (``strategy.clock.train_exp_counter``) uses
        ``seed + e`` for the sample selection, OR's minibatches, the probe/split permutation and
        the ground-truth minibatches.
    :param hessian_max_params: the Hessian baseline is exact when the model has at most this many
        trainable parameters, Gauss–Newton otherwise (default 1: always Gauss–Newton).
    :param output_transform: for a model whose forward returns a tuple or a dict, a function from
        its output to the logits tensor (``strategy._criterion`` is applied to them); without it
        such a model is refused before training with a ``ValueError`` naming it.

    Raises ``ValueError`` naming the argument for bad arguments, and before training for a stream
    whose experiences cannot meet them (:meth:`check_experience`) or that has no original
    experiences (a task-agnostic stream). At run time the estimators' own errors propagate (e.g. a
    zero loss makes OR undefined; ground truth on a multi-task model with an experience of several
    task labels).

    Example::

        from avalanche.evaluation.metrics import accuracy_metrics
        from avalanche.logging import InteractiveLogger, TensorboardLogger
        from avalanche.training.plugins import EvaluationPlugin

        readiness = OptimizationReadinessMetric(n_samples=1024, baselines=True, ground_truth_k=10)
        evaluator = EvaluationPlugin(accuracy_metrics(experience=True), readiness,
                                     loggers=[InteractiveLogger(), TensorboardLogger()])
        strategy = Naive(model, optimizer, criterion, evaluator=evaluator)
        for experience in benchmark.train_stream:
            strategy.train(experience)      # logs OptimizationReadiness/train_phase/... first
        readiness.history[-1]["readiness"], readiness.history[-1]["ground_truth"]["gain"]
    """

    supports_distributed = True  # under torchrun: whole-experience reads, unwrapped model (_avalanche.distributed)

    def __init__(self, n_samples: int = 1024, batch_size: int = 4, n_batches: int = 128,
                 estimator: str = "sampled", baselines: bool = False, n_probe: int = 256,
                 ground_truth_k: int | None = None, ground_truth_lr: float = 0.01,
                 ground_truth_optimizer: str = "sgd", ground_truth_runs: int = 32, seed: int = 0,
                 *, hessian_max_params: int = 1, output_transform=None, diagnostics=False):
        super().__init__()
        self.diagnostics = _check_diagnostics(diagnostics)
        check_output_transform(output_transform)
        self.output_transform = output_transform
        check_int("n_samples", n_samples)
        check_int("batch_size", batch_size)
        if batch_size > n_samples:
            raise ValueError(f"batch_size={batch_size} is larger than n_samples={n_samples}")
        check_int("n_batches", n_batches)
        check_choice("estimator", estimator, ESTIMATORS)
        if not isinstance(baselines, bool):
            raise ValueError(f"baselines must be a bool, got {baselines!r}")
        check_int("n_probe", n_probe)
        if ground_truth_k is not None:
            check_int("ground_truth_k", ground_truth_k)
            if n_samples // 2 < batch_size:
                raise ValueError(
                    f"ground_truth_k needs n_samples // 2 >= batch_size (half of the samples train, "
                    f"half validate), got n_samples={n_samples} and batch_size={batch_size}")
        check_positive("ground_truth_lr", ground_truth_lr)
        check_choice("ground_truth_optimizer", ground_truth_optimizer, OPTIMIZERS)
        check_int("ground_truth_runs", ground_truth_runs)
        check_int("seed", seed, minimum=0)
        check_int("hessian_max_params", hessian_max_params)
        self.n_samples, self.batch_size, self.n_batches = n_samples, batch_size, n_batches
        self.estimator, self.baselines, self.n_probe = estimator, baselines, n_probe
        self.ground_truth_k, self.ground_truth_lr = ground_truth_k, ground_truth_lr
        self.ground_truth_optimizer, self.ground_truth_runs = ground_truth_optimizer, ground_truth_runs
        self.seed, self.hessian_max_params = seed, hessian_max_params

    result_key = "readiness"  # result(): the last OR (None before the first experience)

    def __str__(self) -> str:
        return "OptimizationReadiness"

    # ----------------------------------------------------------------------------------------

    def _probe(self, model, loss_fn, x, y, t) -> None:
        with eval_mode(model):
            optimization_readiness(model, loss_fn, x, y, batch_size=1, n_batches=1, estimator=self.estimator,
                                   seed=self.seed, task_labels=t)

    def check_experience(self, experience) -> str | None:
        """What of this metric's settings an experience of the stream cannot meet (None: nothing):
        OR's minibatches (``batch_size``) and the ground truth's halves must fit in the samples it
        takes from the experience (``min(n_samples, len(experience.dataset))``)."""
        n = len(experience.dataset)
        used = min(self.n_samples, n)
        if used == 0:
            return "has no samples to measure OR on: give every experience samples"
        if self.batch_size > used:
            return (f"offers {used} samples to OR (n_samples={self.n_samples}), fewer than its minibatch "
                    f"batch_size={self.batch_size}: choose batch_size <= {used}")
        if self.ground_truth_k is not None and used // 2 < self.batch_size:
            return (f"offers {used} samples: half of them ({used // 2}) train the ground truth G^(k) "
                    f"(ground_truth_k={self.ground_truth_k}), fewer than batch_size={self.batch_size}: choose "
                    f"batch_size <= {used // 2}, or ground_truth_k=None")
        return None

    @with_output_transform
    def before_training_exp(self, strategy) -> list[MetricValue]:
        boundary = enter_boundary(
            self, strategy, "OptimizationReadinessMetric", needs_origin=True,
            needs="measures the checkpoint's readiness for each incoming original experience, on its data")
        check_experiences(self, boundary, self.check_experience, "OptimizationReadinessMetric")
        with self.measuring(strategy):
            preflight(self, strategy, self._probe, output_transform=self.output_transform,
                      layer_map=self.baselines)
            if not boundary.first:  # online: once per original experience, at its first sub-experience
                return None
            with at_origin(strategy, boundary):
                record = self.measure(strategy)
        self.history.append(record)
        return self._values(strategy, record)

    def measure(self, strategy) -> dict:
        """Measure on ``strategy.model`` and the current experience; returns the history record."""
        model, loss_fn = plain_model(strategy), strategy._criterion
        exp_counter = strategy.clock.train_exp_counter
        seed = self.seed + exp_counter
        x, y, t = experience_tensors(strategy, n_samples=self.n_samples, seed=seed)
        n = x.shape[0]
        record = {"experience": getattr(strategy.experience, "current_experience", exp_counter),
                  "train_exp_counter": exp_counter, "seed": seed, "n_samples": n, "n_samples_asked": self.n_samples,
                  "n_samples_used": n, "seconds": {}}
        where = f"experience {record['experience']}"
        warn_fewer_samples(self, "OptimizationReadinessMetric", "n_samples", self.n_samples, n, where)
        if self.baselines or self.diagnostics:
            record["n_probe_used"] = min(self.n_probe, n)
            warn_fewer_samples(self, "OptimizationReadinessMetric", "n_probe", self.n_probe, min(self.n_probe, n), where)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).to(x.device)

        with eval_mode(model):
            start = time.perf_counter()
            res = optimization_readiness(model, loss_fn, x, y, batch_size=self.batch_size,
                                         n_batches=self.n_batches, estimator=self.estimator,
                                         seed=seed, task_labels=t)
            record["seconds"]["readiness"] = time.perf_counter() - start
            record.update(loss=res.loss, grad_norm_sq=res.grad_norm_sq, second_moment=res.second_moment,
                          strength=res.strength, reliability=res.reliability, readiness=res.readiness)

            if self.baselines:
                start = time.perf_counter()
                probe = perm[:min(self.n_probe, n)]
                record["baselines"] = self._baselines(model, loss_fn, x[probe], y[probe], t[probe])
                record["seconds"]["baselines"] = time.perf_counter() - start

            if self.diagnostics:
                start = time.perf_counter()
                record["diagnostics"] = self._diagnostics(model, loss_fn, x, y, t, perm[:min(self.n_probe, n)],
                                                          res.grad_norm_sq, seed)
                record["seconds"]["diagnostics"] = time.perf_counter() - start

            if self.ground_truth_k is not None:
                start = time.perf_counter()
                record["ground_truth"] = self._ground_truth(model, loss_fn, x, y, t, perm, seed)
                record["seconds"]["ground_truth"] = time.perf_counter() - start
        return record

    def _baselines(self, model, loss_fn, x, y, t) -> dict:
        ranks = representation_ranks(model, x, task_labels=t)
        out = {
            "effective_rank": {name: float(r["effective_rank"]) for name, r in ranks.items()},
            "energy_rank": {name: float(r["energy_rank"]) for name, r in ranks.items()},
            "entk_energy_rank": float(entk_energy_rank(model, x, task_labels=t)),
            "hessian_energy_rank": float(hessian_energy_rank(model, loss_fn, x, y,
                                                             max_params=self.hessian_max_params,
                                                             task_labels=t)),
            "active_unit_fraction": float(active_unit_fraction(model, x, task_labels=t)) if ranks else None,
        }
        return out

    def _diagnostics(self, model, loss_fn, x, y, t, probe, grad_norm_sq, seed) -> dict:
        """The opted-in diagnostics (``None`` for a unit/rank one of a model without hidden layer)."""
        out: dict = {}
        wanted = set(self.diagnostics)
        if "grad_norm_sq" in wanted:
            out["grad_norm_sq"] = float(grad_norm_sq)
        if "lookahead" in wanted:
            multitask = is_multitask(model)
            out["lookahead"] = lookahead_readiness(
                model, loss_fn, x, y, lr=self.ground_truth_lr, k=10, n_runs=8, batch_size=self.batch_size,
                optimizer=self.ground_truth_optimizer, seed=seed + 7919,
                task_labels=t if multitask else None).readiness
        if "lookahead_gd" in wanted:
            xp, yp = x[probe], y[probe]
            out["lookahead_gd"] = lookahead_readiness(
                model, loss_fn, xp, yp, lr=self.ground_truth_lr, k=10, n_runs=1, batch_size=len(xp),
                optimizer=self.ground_truth_optimizer, task_labels=t[probe] if is_multitask(model) else None).readiness
        if "quadratic_gain" in wanted:
            out["quadratic_gain"] = curvature_readiness(model, loss_fn, x, y, lr=self.ground_truth_lr,
                                                        task_labels=t).quadratic_gain
        if "weight_magnitude" in wanted:
            out["weight_magnitude"] = average_weight_magnitude(model)
        units = wanted & {"dormant_units", "srank", "feature_rank", "effective_rank"}
        if units:
            feats = hidden_features(model, x[probe], task_labels=t[probe])
            last = list(feats.values())[-1].reshape(len(probe), -1) if feats else None
            if "dormant_units" in units:
                out["dormant_units"] = dormant_unit_fraction(model, x[probe], task_labels=t[probe]) if feats else None
            if "effective_rank" in units:
                out["effective_rank"] = None if last is None else float(effective_rank(last))
            if "srank" in units:
                out["srank"] = None if last is None else float(srank(last))
            if "feature_rank" in units:
                out["feature_rank"] = None if last is None else float(feature_rank(last))
        return out

    def _ground_truth(self, model, loss_fn, x, y, t, perm, seed) -> dict:
        n = x.shape[0]
        n_train = n // 2
        if n_train < self.batch_size:
            raise ValueError(
                f"the experience has {n} samples: half of them ({n_train}) train the ground truth, "
                f"fewer than batch_size={self.batch_size}")
        train, val = perm[:n_train], perm[n_train:]
        gain = k_step_gain(model, loss_fn, x[train], y[train], x[val], y[val], k=self.ground_truth_k,
                           lr=self.ground_truth_lr, optimizer=self.ground_truth_optimizer,
                           batch_size=self.batch_size, n_runs=self.ground_truth_runs, seed=seed,
                           task_labels=t[train] if is_multitask(model) else None)
        return {"k": gain.k, "gain": gain.gain, "stderr": gain.stderr, "loss_before": gain.loss_before,
                "loss_after_mean": gain.loss_after_mean, "lr": self.ground_truth_lr,
                "optimizer": self.ground_truth_optimizer, "n_runs": gain.n_runs, "n_train": n_train,
                "n_val": n - n_train}

    def _values(self, strategy, record: dict) -> list[MetricValue]:
        values = {"OptimizationReadiness": float(record["readiness"]), "ORStrength": float(record["strength"]),
                  "ORReliability": float(record["reliability"]), "ORLoss": float(record["loss"]),
                  "ORSamplesUsed": int(record["n_samples_used"])}
        base = record.get("baselines")
        if base is not None:
            if base["effective_rank"]:
                values["ORBaselineEffectiveRank"] = dict(base["effective_rank"])
                values["ORBaselineEnergyRank"] = dict(base["energy_rank"])
            values["ORBaselineENTKEnergyRank"] = base["entk_energy_rank"]
            values["ORBaselineHessianEnergyRank"] = base["hessian_energy_rank"]
            values["ORBaselineActiveUnitFraction"] = base["active_unit_fraction"]
        for name, value in record.get("diagnostics", {}).items():
            values[DIAGNOSTICS[name]] = None if value is None else float(value)
        truth = record.get("ground_truth")
        if truth is not None:
            values["ORGroundTruthGain"] = float(truth["gain"])
            if math.isfinite(truth["stderr"]):
                values["ORGroundTruthGainStdErr"] = float(truth["stderr"])
        return self.emit(strategy, values)
