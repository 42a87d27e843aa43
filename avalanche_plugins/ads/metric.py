"""Architecture-Driven Shift (ADS) as an Avalanche metric: predicted vs realised old-task logit shift.

``ArchitectureDrivenShiftMetric`` keeps a small buffer of every trained experience's samples
(``calibration_size`` random samples each, evaluation transforms, with targets and task labels).
For every experience after the first:

* at ``before_training_exp`` (the checkpoint after the strategy's model adaptation; the incoming
  experience is the new task) it draws the *old set* — ``calibration_size`` samples of the buffer
  (seeded) — and ``calibration_size`` labelled samples of the incoming experience, and computes
  :func:`avalanche_plugins.ads.shift.architecture_driven_shift` with the strategy's loss
  (``strategy._criterion``, as its per-sample mean; a ``reduction='sum'`` criterion's SGD step is
  ``train_mb_size`` times larger, folded into the step size) and, unless given, its optimizer's
  step size, the number of steps
  the experience will take (``train_epochs × ⌈|dataset| / train_mb_size⌉``; under torchrun the
  group's, ``train_mb_size`` times the world size) and the optimizer
  kind (``"adam"`` for ``Adam``/``AdamW``, else ``"sgd"``; SGD momentum ``μ`` is folded into the
  step size as ``lr / (1 − μ)``, its steady-state effective step). It also stores the old set's
  logits and their ECE;
* at ``after_training_exp`` it measures the realised shift ``mean ‖z_after − z_before‖`` on the
  same old set (:func:`~avalanche_plugins.ads.ground_truth.logit_shift` semantics) and the ECE on it.

Values go through the ``EvaluationPlugin`` with Avalanche's template names (``Name/train_phase/
train_stream/TaskNNN/ExpNNN``, the incoming experience in both callbacks, so predicted and
realised values sit side by side under the same suffix):

* ``ADS/...`` — the prediction (before training), ``ADSRealisedShift/...`` — the truth (after);
* ``ADSFirstStep/...`` — ``lr × ‖Σ_ℓ J_ℓ u_ℓ‖``, the one-step change without the width
  decomposition; ``ADSPathFactor/...`` — ``P``;
* ``ADSLayerShift/...`` — ``{layer: P·n_{ℓ−1}·d̂_ℓ}`` (loggers split dicts into one scalar each);
* ``ADSOldECEBefore/...`` and ``ADSOldECE/...`` — ECE (``n_bins`` bins) of the old set before and
  after training on the new experience.

* ``ADSSamplesUsed/...`` — how many samples the prediction rests on: the smaller of the old set
  and the incoming experience's sample (each ``calibration_size`` when the data allow).

Every record (with the seconds spent) is appended to :attr:`ArchitectureDrivenShiftMetric.history`,
with ``n_old`` / ``n_new`` and ``n_samples_used`` (their minimum) beside ``calibration_size``: an
experience (or a buffer) smaller than ``calibration_size`` is used whole, and a warning says so once.

At the first experience, before any iteration, a pre-flight
(:mod:`avalanche_plugins._avalanche.preflight`) runs ADS on two samples of it (the model's output
type, its layer map, forward-mode AD through every layer): an unsupported model is refused before
training, not at the second experience; so are a task-agnostic stream
(``split_continuous_linear_decay_stream``: no original experiences to predict between) and a
stream with an empty experience.

Side effects: none on the training run. ADS reads parameters through ``torch.func`` (no
``.grad`` written, nothing changed), the model runs in eval mode (restored), the optimizer is only
read, sample draws use seeded generators and the global torch RNG (CPU and the strategy's CUDA
device) is saved and restored around every measurement.
"""

from __future__ import annotations

import math
import time

import torch
from avalanche.evaluation.metric_results import MetricValue

from avalanche_plugins._avalanche.boundaries import (
    at_experience_end,
    at_origin,
    current_boundary,
    enter_boundary,
)
from avalanche_plugins._avalanche.data import experience_tensors
from avalanche_plugins._avalanche.distributed import global_batch_size, plain_model
from avalanche_plugins._avalanche.preflight import (
    check_experiences,
    preflight,
    warn_fewer_samples,
    with_output_transform,
)
from avalanche_plugins._avalanche.recording import RecordingMetric
from avalanche_plugins.ads import (
    ADS_OPTIMIZERS,
    ADS_PATHS,
    architecture_driven_shift,
    model_outputs,
    output_shift,
)
from avalanche_plugins.core.checks import (
    check_choice,
    check_int,
    check_positive,
)
from avalanche_plugins.core.outputs import check_output_transform
from avalanche_plugins.core.stats import expected_calibration_error

__all__ = ["ArchitectureDrivenShiftMetric"]


class ArchitectureDrivenShiftMetric(RecordingMetric[float]):
    """Logs ADS before each experience after the first, and the realised shift and ECE after it.

    :param calibration_size: samples kept per trained experience, samples of the old set and of
        the incoming experience used by ADS (default 64: cost is one JVP per layer per sample,
        0.085 of a 5,000-image epoch on a CIFAR ResNet-18 by ``benchmarks.scale``; the ADS zoo's
        rankings hold from 16 to 128, docs/RESULTS.md). A smaller experience or buffer is used
        whole: a warning says so once, and each record holds ``n_old``, ``n_new`` and
        ``n_samples_used``.
    :param lr, steps, optimizer: ADS's step size, step budget and ``"sgd"``/``"adam"``; None
        reads them from the strategy (module docstring). ``lr=None`` with an optimizer whose
        parameter groups step at different sizes is refused at the first experience, before any
        training: ADS models one step size, so name it.
    :param path: ``"logit"`` (default; ``P = min(lr·steps, L_new / mean_b ‖J(x_b) u‖)``, the
        step length at which the new-task logits have moved, to first order, by the loss to go),
        ``"loss"`` (``P = min(lr·steps, L_new / −⟨∇L_new, u⟩)``, the step length at which the
        first-order new-task loss reaches 0), ``"budget"`` (``P = lr·steps``) or ``"probe"``
        (fitted decay over ``probe_steps`` steps). The logit path is the one that ranks all three
        scenarios of the ADS zoo benchmark above 0.8 (Spearman; the loss path fails on split
        MNIST), and its values are on the scale of the realised shift, where the budget path's
        linear extrapolation over a whole experience overshoots by orders of magnitude
        (docs/ads.md).
    :param n_bins: ECE bins. :param seed: base seed; experience ``e`` uses ``seed + e``.
    :param output_transform: for a model whose forward returns a tuple or a dict, a function from
        its output to the logits tensor (ADS, the realised shift and the ECE are then those of the
        logits, and ``strategy._criterion`` is applied to them); without it such a model is refused
        before training with a ``ValueError`` naming it.

    Raises ``ValueError`` naming the argument for bad arguments.

    Example::

        ads = ArchitectureDrivenShiftMetric()
        evaluator = EvaluationPlugin(accuracy_metrics(experience=True), ads, loggers=[InteractiveLogger()])
        strategy = Naive(model=model, optimizer=optimizer, criterion=criterion, evaluator=evaluator)
        for experience in benchmark.train_stream:
            strategy.train(experience)   # logs ADS/... before, ADSRealisedShift/... after
        ads.history[-1]["ads"], ads.history[-1]["realised_shift"]
    """

    supports_distributed = True  # under torchrun: whole-experience reads, the group's step count (_avalanche.distributed)

    def __init__(self, calibration_size: int = 64, *, lr: float | None = None, steps: int | None = None,
                 optimizer: str | None = None, path: str = "logit", probe_steps: int = 10,
                 n_bins: int = 15, seed: int = 0, output_transform=None):
        super().__init__()
        check_output_transform(output_transform)
        self.output_transform = output_transform
        check_int("calibration_size", calibration_size)
        if lr is not None:
            check_positive("lr", lr)
        if steps is not None:
            check_int("steps", steps)
        if optimizer is not None:
            check_choice("optimizer", optimizer, ADS_OPTIMIZERS)
        check_choice("path", path, ADS_PATHS)
        check_int("probe_steps", probe_steps, minimum=2)
        check_int("n_bins", n_bins)
        check_int("seed", seed, minimum=0)
        self.calibration_size, self.lr, self.steps, self.optimizer = calibration_size, lr, steps, optimizer
        self.path, self.probe_steps, self.n_bins, self.seed = path, probe_steps, n_bins, seed
        self.calibration: dict | None = None  # tensors of the last measurement
        self._buffer: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._pending: dict | None = None

    result_key = "ads"  # result(): the last predicted ADS (None before the second experience)

    def reset_state(self) -> None:
        self.calibration, self._buffer, self._pending = None, [], None

    def __str__(self) -> str:
        return "ArchitectureDrivenShift"

    # ----------------------------------------------------------------------------------------

    def _training_settings(self, strategy) -> tuple[float, int, str]:
        opt = strategy.optimizer
        kind = self.optimizer or ("adam" if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)) else "sgd")
        lr = self.lr
        if lr is None:
            lr = _one_step_size(opt, fold_momentum=kind == "sgd" and isinstance(opt, torch.optim.SGD))
            if kind == "sgd" and getattr(strategy._criterion, "reduction", None) == "sum":
                lr *= strategy.train_mb_size  # ADS steps on the mean loss; training on the minibatch sum
        steps = self.steps
        if steps is None:  # online: the original experience's samples (the sub-experiences' sum)
            boundary = current_boundary(self, strategy)
            n = len(boundary.origin.dataset) if boundary.online else len(strategy.adapted_dataset)
            # the group's steps under torchrun: W ranks step together on W minibatches
            steps = max(1, strategy.train_epochs * math.ceil(n / global_batch_size(strategy)))
        return lr, steps, kind

    def _old_set(self, seed: int):
        x = torch.cat([b[0] for b in self._buffer])
        y = torch.cat([b[1] for b in self._buffer])
        t = torch.cat([b[2] for b in self._buffer])
        if x.shape[0] > self.calibration_size:
            g = torch.Generator().manual_seed(seed)
            idx = torch.randperm(x.shape[0], generator=g)[: self.calibration_size].sort().values.to(x.device)
            x, y, t = x[idx], y[idx], t[idx]
        return x, y, t

    def _probe(self, model, loss_fn, x, y, t) -> None:
        """ADS with the old set = the new set = the pre-flight's samples, one step."""
        architecture_driven_shift(model, loss_fn, x, x, y, lr=self.lr or 1e-3, steps=1,
                                  optimizer=self.optimizer or "sgd", path=self.path, probe_steps=2,
                                  old_task_labels=t, new_task_labels=t)
        model_outputs(model, x, t, 1024)

    @with_output_transform
    def before_training_exp(self, strategy) -> list[MetricValue] | None:
        boundary = enter_boundary(self, strategy, "ArchitectureDrivenShiftMetric", needs_origin=True,
                                  needs="predicts and measures the old-task shift of each original experience's "
                                        "training, on the experiences' data")
        check_experiences(self, boundary, _empty_experience, "ArchitectureDrivenShiftMetric")
        with self.measuring(strategy):
            preflight(self, strategy, self._probe, output_transform=self.output_transform)
        if self.lr is None:  # an optimizer it cannot read is refused now, before any training
            self._training_settings(strategy)
        if not boundary.first:  # online: once per original experience, at its first sub-experience
            return None
        self._pending = None
        if not self._buffer:
            return None
        with self.measuring(strategy), at_origin(strategy, boundary):
            record = self.measure(strategy)
        return self._values(strategy, record, after=False)

    def measure(self, strategy) -> dict:
        """ADS of ``strategy.model`` for the incoming experience; returns the (pending) record."""
        model = plain_model(strategy)
        exp_counter = current_boundary(self, strategy).index
        seed = self.seed + exp_counter
        start = time.perf_counter()
        old_x, old_y, old_t = self._old_set(seed)
        new_x, new_y, new_t = experience_tensors(strategy, n_samples=self.calibration_size, seed=seed)
        lr, steps, kind = self._training_settings(strategy)
        res = architecture_driven_shift(model, strategy._criterion, old_x, new_x, new_y, lr=lr, steps=steps,
                                        optimizer=kind, path=self.path, probe_steps=self.probe_steps,
                                        old_task_labels=old_t, new_task_labels=new_t)
        logits = model_outputs(model, old_x, old_t, 1024)
        n_old, n_new = int(old_x.shape[0]), int(new_x.shape[0])
        experience = getattr(strategy.experience, "current_experience", exp_counter)
        warn_fewer_samples(self, "ArchitectureDrivenShiftMetric", "calibration_size", self.calibration_size,
                           min(n_old, n_new), f"experience {experience}" if n_new <= n_old else
                           "the buffer of the experiences trained so far")
        record = {
            "experience": experience, "train_exp_counter": exp_counter, "seed": seed,
            "calibration_size": self.calibration_size, "n_old": n_old, "n_new": n_new,
            "n_samples_used": min(n_old, n_new), "lr": lr, "steps": steps, "optimizer": kind, "path": self.path,
            "ads": res.ads, "first_step": lr * res.first_order_shift, "path_factor": res.path_factor,
            "layer_names": res.layer_names, "architecture_terms": res.architecture_terms,
            "data_terms": res.data_terms,
            "layer_shifts": {n: res.path_factor * s for n, s in zip(res.layer_names, res.layer_shifts)},
            "ece_before": self._ece(logits, old_y),
            "seconds": {"ads": res.seconds},
        }
        record["seconds"]["before"] = time.perf_counter() - start
        self.calibration = {"old_inputs": old_x, "old_targets": old_y, "old_task_labels": old_t,
                            "new_inputs": new_x, "new_targets": new_y, "new_task_labels": new_t}
        self._pending = {"record": record, "logits": logits}
        return record

    def _ece(self, logits: torch.Tensor, targets: torch.Tensor) -> float | None:
        """ECE for classifiers (2-D logits, integer targets); None otherwise."""
        if logits.dim() != 2 or targets.dtype.is_floating_point:
            return None
        # NaN columns pad narrower task heads (model_outputs): classes the sample's head lacks, so
        # they get probability 0
        logits = logits.nan_to_num(nan=torch.finfo(logits.dtype).min)
        return expected_calibration_error(logits, targets, self.n_bins)

    @with_output_transform
    def after_training_exp(self, strategy) -> list[MetricValue] | None:
        return at_experience_end(self, strategy, lambda boundary: self._after(strategy, boundary.index))

    def _after(self, strategy, exp_counter: int) -> list[MetricValue] | None:
        values = None
        with self.measuring(strategy):
            if self._pending is not None:
                start = time.perf_counter()
                record, before = self._pending["record"], self._pending["logits"]
                cal = self.calibration
                after = model_outputs(plain_model(strategy), cal["old_inputs"], cal["old_task_labels"], 1024)
                record["realised_shift"] = output_shift(before, after)
                record["ece_after"] = self._ece(after, cal["old_targets"])
                record["seconds"]["after"] = time.perf_counter() - start
                self.history.append(record)
                self._pending = None
                values = self._values(strategy, record, after=True)
            self._buffer.append(experience_tensors(strategy, n_samples=self.calibration_size,
                                                   seed=self.seed + exp_counter))
        return values

    def _values(self, strategy, record: dict, *, after: bool) -> list[MetricValue]:
        def num(value):
            return None if value is None else float(value)

        if after:
            return self.emit(strategy, {"ADSRealisedShift": num(record["realised_shift"]),
                                        "ADSOldECE": num(record["ece_after"])})
        return self.emit(strategy, {"ADS": num(record["ads"]), "ADSFirstStep": num(record["first_step"]),
                                    "ADSPathFactor": num(record["path_factor"]),
                                    "ADSLayerShift": dict(record["layer_shifts"]),
                                    "ADSOldECEBefore": num(record["ece_before"]),
                                    "ADSSamplesUsed": int(record["n_samples_used"])})


def _one_step_size(optimizer, *, fold_momentum: bool) -> float:
    """The one step size ADS models, read from ``optimizer``: the ``lr`` its parameter groups share
    (``lr / (1 − μ)`` with SGD momentum μ when ``fold_momentum``). Groups that step at different sizes
    (a backbone at a lower lr) are refused: reading the first group's would predict silently wrong.

    Example:
        >>> a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        >>> sgd = torch.optim.SGD([{"params": a.parameters()}, {"params": b.parameters()}], lr=0.1, momentum=0.5)
        >>> _one_step_size(sgd, fold_momentum=True), _one_step_size(sgd, fold_momentum=False)
        (0.2, 0.1)
        >>> sgd.param_groups[1]["lr"] = 0.01
        >>> _one_step_size(sgd, fold_momentum=True)
        Traceback (most recent call last):
        ...
        ValueError: ArchitectureDrivenShiftMetric: the optimizer's parameter groups step at different sizes (0.2, 0.02 ...
    """
    sizes = [float(g["lr"]) / ((1.0 - float(g.get("momentum", 0.0))) if fold_momentum else 1.0)
             for g in optimizer.param_groups if g["params"]] or [float(optimizer.param_groups[0]["lr"])]
    if len(set(sizes)) > 1:
        shown = ", ".join(f"{v:.3g}" for v in sizes)
        raise ValueError(f"ArchitectureDrivenShiftMetric: the optimizer's parameter groups step at different sizes "
                         f"({shown}{' (lr / (1 - momentum))' if fold_momentum else ''}); ADS models one step size "
                         "for the whole network: pass ArchitectureDrivenShiftMetric(lr=...), e.g. the rate of the "
                         "layers that move most")
    return sizes[0]


def _empty_experience(experience) -> str | None:
    if len(experience.dataset) == 0:
        return "has no samples to calibrate ADS on: give every experience samples"
    return None
