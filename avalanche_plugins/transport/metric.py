"""``TransportKeyMetric``: stitched old-task accuracy and recovery inside an Avalanche run.

At ``after_training_exp`` the metric keeps a snapshot of the model (θ_A for that experience)
and a class-balanced anchor buffer of the experience's inputs. When an *earlier* experience is
evaluated after later training, it fits keys (:mod:`avalanche_plugins.transport.keys`) between the
current model's early layers and that snapshot's late layers at each stage, evaluates every
stitched model on the evaluation batches as they stream by (about ``eval_samples`` samples of the
experience, default 500, spread evenly), and logs at ``after_eval_exp``::

    TransportKeyAcc/eval_phase/test_stream/Task000/Exp000/stage=layer2/family=channel
    TransportKeyAcc/.../stage=layer2/family=channel/control=global_shuffle
    TransportKeyRecovery/.../stage=layer2/family=channel           (not logged when nothing was forgotten)
    TransportKeyAccCheckpoint/...  and  TransportKeyAccUpdated/...  (acc_A and acc_AB, same samples)
    TransportKeyProfile/...                                         (figure: recovery per stage,
                                                                     when a logger takes images)

Controls (``controls=True``), for each non-identity family: ``channel_permutation``,
``global_shuffle`` and ``within_class_shuffle`` (see :mod:`avalanche_plugins.transport.keys`).

The old task's predictions always come from the snapshot's head: for multi-head models the
evaluation batch's task label selects the snapshot's head for that task; class-incremental
models with one shared head use the snapshot's head as it was after that experience.

``stages="auto"`` chooses up to three stages on the model at the first training experience
(:func:`~avalanche_plugins.transport.stages.auto_stages`, on :mod:`avalanche_plugins.core.split`'s
cut points), probing a detached copy: the run's model, its BatchNorm statistics and the RNG are
untouched, so every other metric of the run is what it is with the same stages given explicitly.

A stage whose module returns a tuple or a dict (an LSTM's ``(output, (h, c))``) takes
``stage_transforms={stage: 0}`` (the element's index or key, or a function from the stage's output
to it, as ``split_model``'s ``output_transform`` is for a model's output): keys are fitted on that
element and the stitched model puts the keyed activations back in its place.

Before the first iteration (the first ``before_training_exp``) the metric refuses, naming itself,
the setting and the fix: a task-agnostic stream (``split_continuous_linear_decay_stream``: no
original experience to snapshot); ``n_anchors`` that an experience of the stream cannot fill
(fewer than one anchor per class, or a class with fewer samples than ``n_anchors // K``;
:meth:`TransportKeyMetric.check_experience`); and a stage it cannot stitch at (a non-tensor output
without ``stage_transforms``, a layout it cannot tell): the whole evaluation path (stage
activations, layout, a stitched forward) runs once on two samples.

Memory: one deep copy of the model plus ``n_anchors`` inputs per snapshotted experience. Pass
``experiences=[0]`` to keep only the first one (the usual "task A" question).
BatchNorm: keys are fitted and stitched models evaluated in eval mode (running statistics),
the mode Avalanche evaluates in; the mode is part of the result (it moves acc_AB a lot).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping

import torch
from avalanche.evaluation.metric_results import MetricValue

from avalanche_plugins._avalanche.boundaries import (
    at_experience_end,
    enter_boundary,
    evaluated_experience_id,
)
from avalanche_plugins._avalanche.data import metric_name
from avalanche_plugins._avalanche.distributed import check_distributed, plain_model, shared_samples
from avalanche_plugins._avalanche.figures import (
    DeferredFigure,
    fixed_margins,
    label_extent,
    wants_images,
)
from avalanche_plugins._avalanche.preflight import check_experiences, preflight
from avalanche_plugins._avalanche.recording import RecordingMetric
from avalanche_plugins.core.calls import eval_mode, iterate_batches, model_forward, sample_stride
from avalanche_plugins.core.checks import check_choice, check_int, check_positive
from avalanche_plugins.core.outputs import describe_output
from avalanche_plugins.core.parallel import rank, sum_over_ranks, world_size
from avalanche_plugins.transport import (
    FAMILIES,
    LAYOUTS,
    class_balanced_anchors,
    control_keys,
    fit_transport_key,
    gauss_newton_key,
    recovery,
    stage_activations,
    stage_layout,
    stitch,
)
from avalanche_plugins.transport.stages import AUTO, auto_stages, example_inputs
from avalanche_plugins.transport.stitch import (
    select_activations,
    stage_output,
    stages_activations,
    stitch_many,
)

__all__ = ["TransportKeyMetric", "evaluation_chunk"]

#: floats of stage activations one chunk of the stitched evaluation holds (4 MiB in float32): an
#: evaluation batch of a conv net (1,000 Fashion-MNIST images: 25 MB per activation) runs about
#: 1.7× slower on a 2-core CPU than the same images in cache-sized chunks (issue 41)
CHUNK_FLOATS = 1 << 20


def evaluation_chunk(stage_floats: int) -> int:
    """Samples per chunk of the stitched models' evaluation: ``CHUNK_FLOATS`` over the floats
    of one sample's largest stage activation, at least 16 (the counts do not depend on it).

    >>> evaluation_chunk(32 * 14 * 14), evaluation_chunk(100), evaluation_chunk(64 * 32 * 32)
    (167, 10485, 16)
    """
    return max(16, CHUNK_FLOATS // max(1, int(stage_floats)))



def _check_stage_transforms(stage_transforms) -> dict:
    if stage_transforms is None:
        return {}
    if not isinstance(stage_transforms, Mapping):
        raise TypeError(f"stage_transforms must be None or a {{stage: index, key or function}} mapping, got "
                        f"{type(stage_transforms).__name__}")
    for stage, select in stage_transforms.items():
        if isinstance(select, bool) or not (isinstance(select, (int, str)) or callable(select)):
            raise TypeError(f"stage_transforms[{stage!r}] must be an index, a key or a function from the stage's "
                            f"output to its activations, got {type(select).__name__}")
    return dict(stage_transforms)


def recovery_figure_size(stages) -> tuple[float, float]:
    """The size in inches of :func:`recovery_figure`'s chart of ``stages``."""
    return max(3.5, 0.9 * len(stages) + 2), 2.4 + label_extent(stages, 7, 30)


def recovery_figure(stages, curves: dict, title: str):
    """Recovery per stage, one line per variant (``curves``: variant -> one value per stage)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=recovery_figure_size(stages))
    ax = fig.subplots()
    for family, ys in curves.items():
        ax.plot(range(len(stages)), ys, marker="o", label=family)
    ax.set_xticks(range(len(stages)))
    ax.set_xticklabels(stages, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("recovery")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7)
    fixed_margins(fig, left=0.75, bottom=label_extent(stages, 7, 30))
    return fig


class TransportKeyMetric(RecordingMetric[dict]):
    """Stitched accuracy of earlier experiences per stage, key family and control (module docstring).

    :param stages: submodule names at which to stitch (e.g. ``["layer1", "layer2"]`` for a ResNet,
        ``["features.0", "features.1"]`` for a CNN whose ``features`` is an ``nn.Sequential`` of blocks),
        or ``"auto"``: up to three stages chosen on the model at the first training experience
        (module docstring; the choice is in :attr:`stages` afterwards).
    :param families: key families (``"identity"`` is the "no key" control).
    :param n_anchors: anchors per snapshot (class-balanced, from the experience's training data).
    :param controls: also evaluate the controls for every non-identity family.
    :param experiences: experience ids to snapshot (None: all).
    :param ridge: relative ridge of the key fits.
    :param seed: anchor selection and control shuffles.
    :param layouts: how each stage's activations are laid out: None (default: 2-D flat, 4-D
        channel maps, 3-D read from the modules that produce them, see
        :func:`~avalanche_plugins.transport.stitch.stage_layout`), one of ``"flat"``,
        ``"channels_first"``, ``"tokens"`` for every stage, or a ``{stage: layout}`` mapping.
    :param gauss_newton_iterations: when > 0, also log ``family=<f>+gauss_newton`` for every
        non-identity family: the closed-form key refined label-free by that many
        Levenberg–Marquardt steps on the checkpoint's own anchor logits
        (:func:`~avalanche_plugins.transport.refine.gauss_newton_key`). It recovers much more at deep
        stages (docs/RESULTS.md) for about ``K + 1`` backward passes of the late layers per step.
    :param eval_samples: how many samples of an evaluated experience the stitched models (and
        ``acc_A``, ``acc_AB``) are counted on: every ``⌈n / eval_samples⌉``-th sample in the
        evaluation order (:func:`~avalanche_plugins.core.calls.sample_stride`; under torchrun, of the whole experience over
        the ranks), all of them when ``n ≤ eval_samples`` or ``eval_samples=None``. Evaluating the
        stitched models is most of the metric's cost (stages × variants forwards of the late
        layers). The default 500 has an accuracy standard error of at most 2.2 points; on Split
        Fashion-MNIST (2,000-sample experiences, 3 seeds) the logged accuracies moved by 1.0 point
        on average (4.9 at most) and the recoveries by 0.008 (0.051 at most) from the whole
        experience's, at 28 % of the cost (docs/RESULTS.md, "What the diagnostics cost").
        ``history`` records the count (``"samples"``).
    :param stage_transforms: ``{stage: select}`` for stages whose module returns a tuple or a dict:
        the index / key of the element holding the activations (``{"rnn": 0}`` for an LSTM's
        ``(output, (h, c))``), or a function from the stage's output to that element (module
        docstring). Without it such a stage is refused before training, naming it.

    Example::

        tk = TransportKeyMetric(stages=["features.0", "features.1"], experiences=[0])
        evaluator = EvaluationPlugin(accuracy_metrics(experience=True), tk,
                                     loggers=[InteractiveLogger(), TensorboardLogger()])
        ...
        tk.history[-1]   # {"experience": 0, "after": 2, "samples": 500, "acc": {...}, "recovery": {...}}
    """

    supports_distributed = True  # under torchrun: counts summed over the ranks (_avalanche.distributed)

    def __init__(self, stages, families=("identity", "channel", "cross_channel"), n_anchors: int = 100,
                 controls: bool = True, experiences=None, ridge: float = 1e-4, seed: int = 0,
                 gauss_newton_iterations: int = 0, layouts=None, stage_transforms=None,
                 eval_samples: int | None = 500):
        super().__init__()
        self._auto = isinstance(stages, str) and stages == AUTO
        if not self._auto and (isinstance(stages, str) or not stages):
            raise ValueError(f"stages must be a non-empty list of submodule names or 'auto', got {stages!r}")
        families = tuple(families)
        if not families:
            raise ValueError("families must name at least one key family")
        for family in families:
            check_choice("families", family, FAMILIES)
        check_int("n_anchors", n_anchors)
        if not isinstance(controls, bool):
            raise ValueError(f"controls must be a bool, got {controls!r}")
        if experiences is not None:
            experiences = list(experiences)
            for e in experiences:
                check_int("experiences", e, minimum=0)
        check_positive("ridge", ridge, allow_zero=True)
        check_int("seed", seed, minimum=0)
        check_int("gauss_newton_iterations", gauss_newton_iterations, minimum=0)
        if eval_samples is not None:
            check_int("eval_samples", eval_samples)
        self.gauss_newton_iterations, self.eval_samples = gauss_newton_iterations, eval_samples
        self._layout = None  # one layout for every stage, when they are chosen later
        if isinstance(layouts, str):
            if self._auto:
                check_choice("layouts", layouts, LAYOUTS)
            self._layout = layouts
            layouts = None if self._auto else {stage: layouts for stage in stages}
        if layouts is not None:
            if not isinstance(layouts, Mapping):
                raise TypeError(f"layouts must be None, a layout name or a {{stage: layout}} mapping, got "
                                f"{type(layouts).__name__}")
            for stage, layout in layouts.items():
                check_choice(f"layouts[{stage!r}]", layout, LAYOUTS)
        self.layouts = dict(layouts or {})
        self.stage_transforms = _check_stage_transforms(stage_transforms)
        self.stages, self.families, self.n_anchors = [] if self._auto else list(stages), families, n_anchors
        self.controls, self.experiences, self.ridge, self.seed = controls, experiences, ridge, seed
        self.snapshots: dict[int, dict] = {}
        self._last_trained = -1
        self._active: dict | None = None

    def reset_state(self) -> None:
        self.snapshots, self._last_trained, self._active = {}, -1, None

    def __str__(self) -> str:
        return "TransportKey"

    # --- training side -------------------------------------------------------------------------

    def before_training(self, strategy):
        check_distributed(self, strategy)
        if self._auto:  # chosen at the first training experience, on its data
            return None
        modules = dict(plain_model(strategy).named_modules())
        unknown = [stage for stage in self.stages if stage not in modules]
        if unknown:  # before any training, not at the first evaluation
            names = [name for name in modules if name]
            raise ValueError(f"TransportKeyMetric: stages {unknown} name no submodule of {type(plain_model(strategy)).__name__}; "
                             f"submodules are {names[:25]}{' ...' if len(names) > 25 else ''}")
        return None

    def before_training_exp(self, strategy):
        boundary = enter_boundary(self, strategy, "TransportKeyMetric", needs_origin=True,
                                  needs="keeps a snapshot and anchors of each original experience, to stitch "
                                        "with when that experience is evaluated later")
        check_experiences(self, boundary, self.check_experience, "TransportKeyMetric")
        if self._auto and not self.stages:
            self._choose_stages(strategy)
        # before any training: a model whose forward returns a tuple or dict, or a stage the keys
        # cannot be fitted at, is refused now, not at the first evaluation after the second experience
        preflight(self, strategy, self._probe, layer_map=False, takes_output_transform=False)
        return None

    def check_experience(self, experience) -> str | None:
        """What an experience of the stream cannot give this metric (None: nothing): ``n_anchors``
        class-balanced anchors (``n_anchors // K`` of each of its ``K`` classes). Experiences
        outside ``experiences`` are not snapshotted, so not checked."""
        exp_id = getattr(experience, "current_experience", None)
        if self.experiences is not None and exp_id not in self.experiences:
            return None
        data = experience.dataset
        targets = torch.as_tensor([int(t) for t in data.targets]) if hasattr(data, "targets") else \
            torch.as_tensor([int(data[i][1]) for i in range(len(data))], dtype=torch.long)
        if targets.numel() == 0:
            return "has no samples to take anchors from: give every snapshotted experience samples"
        classes, counts = targets.unique(return_counts=True)
        k, per_class = len(classes), self.n_anchors // len(classes)
        if per_class == 0:
            return (f"has {k} classes, more than n_anchors={self.n_anchors}: the anchors are class-balanced "
                    f"(n_anchors // {k} of each class), so choose n_anchors >= {k}")
        fewest = int(counts.argmin())
        if int(counts[fewest]) < per_class:
            fits = k * int(counts[fewest])
            return (f"has {len(targets)} samples of {k} classes, so n_anchors={self.n_anchors} asks {per_class} anchors of each, but class "
                    f"{int(classes[fewest])} has {int(counts[fewest])} samples: choose n_anchors <= {fits}"
                    + ("" if self.experiences is not None else " (or leave this experience out with experiences=[...])"))
        return None

    def _select(self, stage: str):
        return self.__dict__.get("stage_transforms", {}).get(stage)

    def _probe(self, model, loss_fn, x, y, t) -> None:
        """The evaluation path on the pre-flight's samples, per stage: its activations (a tensor,
        samples first), their layout and a stitched forward through an identity key (eval mode, no
        graph: nothing of the model changes)."""
        with eval_mode(model), torch.no_grad():
            for stage in self.stages:
                self._probe_stage(model, stage, x, t)

    def _probe_stage(self, model, stage: str, x, t) -> None:
        output, select = stage_output(model, stage, x, t), self._select(stage)
        if select is None and not isinstance(output, torch.Tensor):
            raise ValueError(
                f"stage={stage!r} outputs {describe_output(output)}, not a tensor: pass stage_transforms="
                f"{{{stage!r}: 0}}, the index (or key) of the element holding the activations, or a function "
                f"from the stage's output to it (e.g. stage_transforms={{{stage!r}: lambda out: out[0]}}), or "
                "choose a stage whose output is a tensor")
        u = select_activations(output, select, stage)
        if u.dim() == 0 or u.shape[0] != x.shape[0]:
            raise ValueError(f"stage={stage!r}'s activations have shape {tuple(u.shape)} for {x.shape[0]} "
                             "samples: keys need the samples in the first dimension")
        layout = self.layouts.get(stage) or stage_layout(model, stage, x, t, select)
        key = fit_transport_key(u, u, "identity", layout=layout)
        stitch(model, model, stage, key, select).forward_from_stage(key(u), x, t)

    def _choose_stages(self, strategy):
        """``stages="auto"``: the stages of the run's model, probed on a detached copy with the
        experience's first inputs (loading them under :meth:`measuring`: the RNG stream stays)."""
        with self.measuring(strategy):
            x, t = example_inputs(strategy.experience.dataset)
        self.stages = auto_stages(plain_model(strategy), x.to(strategy.device), t.to(strategy.device))
        if self._layout is not None:
            self.layouts = {stage: self._layout for stage in self.stages}

    def after_training_exp(self, strategy):
        return at_experience_end(self, strategy, lambda boundary: self._snapshot(strategy))

    def _snapshot(self, strategy):
        exp_id = int(strategy.experience.current_experience)
        self._last_trained = max(self._last_trained, exp_id)
        if self.experiences is not None and exp_id not in self.experiences:
            return None
        data = strategy.experience.dataset
        data = data.eval() if hasattr(data, "eval") else data
        with self.measuring(strategy):  # loading anchors must not move the training RNG stream
            x, y = class_balanced_anchors(data, self.n_anchors, seed=self.seed + exp_id)
        try:
            task = int(strategy.experience.task_label)
        except (AttributeError, AssertionError, ValueError):  # no (or several) task labels: task 0
            task = 0
        snapshot = copy.deepcopy(plain_model(strategy)).eval()
        for p in snapshot.parameters():
            p.requires_grad_(False)
        self.snapshots[exp_id] = {"model": snapshot, "x": x.to(strategy.device), "y": y,
                                  "task": torch.full((len(y),), task, device=strategy.device)}
        return None

    # --- evaluation side -----------------------------------------------------------------------

    def before_eval_exp(self, strategy):
        exp_id = evaluated_experience_id(strategy.experience)
        self._active = None
        snap = None if exp_id is None else self.snapshots.get(int(exp_id))
        if snap is None or self._last_trained <= exp_id:
            return None
        model = plain_model(strategy)
        variants: dict[str, dict[str, torch.nn.Module]] = {}
        residuals: dict[str, float] = {}
        widest = 1  # the largest stage activation of one sample
        with torch.no_grad(), eval_mode(model):
            for stage in self.stages:
                select = self._select(stage)
                u = stage_activations(model, stage, snap["x"], snap["task"], select)
                v = stage_activations(snap["model"], stage, snap["x"], snap["task"], select)
                widest = max(widest, u[0].numel())
                layout = self.layouts.get(stage) or stage_layout(model, stage, snap["x"], snap["task"], select)
                keys = {}
                for family in self.families:
                    key = fit_transport_key(u, v, family, ridge=self.ridge, layout=layout)
                    keys[f"family={family}"] = key
                    residuals[f"stage={stage}/family={family}"] = key.residual
                    if self.gauss_newton_iterations and family != "identity":
                        refined = copy.deepcopy(key)
                        with torch.enable_grad():
                            gauss_newton_key(refined, stitch(model, snap["model"], stage, refined, select), snap["x"],
                                             snap["task"], iterations=self.gauss_newton_iterations)
                        keys[f"family={family}+gauss_newton"] = refined
                    if self.controls and family != "identity":
                        for name, control in control_keys(key, u, v, family, snap["y"].to(u.device),
                                                          seed=self.seed, ridge=self.ridge,
                                                          layout=layout).items():
                            keys[f"family={family}/control={name}"] = control
                variants[stage] = stitch_many(model, snap["model"], stage, keys, select)  # one cut per stage
        self._active = {"experience": int(exp_id), "variants": variants, "residuals": residuals,
                        "correct": {}, "n": 0, "correct_checkpoint": 0, "correct_updated": 0,
                        "chunk": evaluation_chunk(widest),
                        "stride": sample_stride(len(strategy.adapted_dataset), self.eval_samples)}
        return None

    @torch.no_grad()
    def after_eval_iteration(self, strategy):
        active = self._active
        if active is None:
            return None
        x, y = strategy.mb_x, strategy.mb_y
        # streams built from plain (x, y) datasets carry no task labels: every sample is task 0
        t = strategy.mbatch[2] if len(strategy.mbatch) >= 3 else torch.zeros_like(y)
        output, t = strategy.mb_output, torch.as_tensor(t)
        seen = active.setdefault("seen", 0)
        own = shared_samples(strategy, seen, int(y.shape[0]))
        if active["stride"] > 1:  # every stride-th sample of the experience (its position over all ranks)
            own &= (torch.arange(seen, seen + int(y.shape[0])) * world_size() + rank()) % active["stride"] == 0
        active["seen"] += int(y.shape[0])
        if not bool(own.all()):  # this rank's share (torchrun: the sampler's repeats left out), eval_samples
            x, y, output = x[own.to(x.device)], y[own.to(y.device)], output[own.to(output.device)]
            t = t[own.to(t.device)] if t.dim() else t
        active["n"] += int(y.shape[0])
        active["correct_updated"] += int((output.argmax(-1) == y).sum())
        for s in iterate_batches(int(y.shape[0]), active["chunk"]):  # cache-sized chunks
            self._count_correct(plain_model(strategy), active, x[s], y[s], t[s] if t.dim() else t)
        return None

    def _count_correct(self, model, active: dict, x, y, t) -> None:
        """Add the snapshot's and every stitched model's correct predictions on one chunk of an
        evaluation batch to ``active`` (per-sample forwards: a chunk's counts do not depend on the chunk)."""
        snapshot = self.snapshots[active["experience"]]["model"]
        active["correct_checkpoint"] += int((model_forward(snapshot, x, t).argmax(-1) == y).sum())
        with eval_mode(model):
            stages = list(active["variants"])  # one early forward for every stage, shared by its keys
            activations = stages_activations(model, stages, x, t, {stage: self._select(stage) for stage in stages})
            for stage, variants in active["variants"].items():
                u = activations[stage]
                for name, stitched in variants.items():
                    out = stitched.forward_from_stage(stitched.key(u), x, t)
                    full = f"stage={stage}/{name}"
                    active["correct"][full] = active["correct"].get(full, 0) + int((out.argmax(-1) == y).sum())

    def after_eval_exp(self, strategy):
        active, self._active = self._active, None
        if active is None:
            return None
        self._sum_over_ranks(active)
        if active["n"] == 0:
            return None
        n = active["n"]
        acc_a, acc_ab = active["correct_checkpoint"] / n, active["correct_updated"] / n
        acc = {name: c / n for name, c in active["correct"].items()}
        rec = {name: recovery(a, acc_ab, acc_a).value for name, a in acc.items()}
        record = {"experience": active["experience"], "after": self._last_trained, "samples": n, "acc_checkpoint": acc_a,
                  "acc_updated": acc_ab, "acc": acc, "recovery": rec, "residual": active["residuals"],
                  "bn_mode": "eval"}
        self.history.append(record)
        x_plot = strategy.clock.train_iterations
        values = [MetricValue(self, metric_name("TransportKeyAccCheckpoint", strategy), acc_a, x_plot),
                  MetricValue(self, metric_name("TransportKeyAccUpdated", strategy), acc_ab, x_plot)]
        acc_base, rec_base = metric_name("TransportKeyAcc", strategy), metric_name("TransportKeyRecovery", strategy)
        for name in acc:
            values.append(MetricValue(self, f"{acc_base}/{name}", acc[name], x_plot))
            if math.isfinite(rec[name]):  # NaN (nothing forgotten) stays in history, never reaches a logger
                values.append(MetricValue(self, f"{rec_base}/{name}", rec[name], x_plot))
        if wants_images(strategy):  # rendering costs more than the evaluation on a small model
            values.append(MetricValue(self, metric_name("TransportKeyProfile", strategy),
                                      self._figure(record), x_plot))
        return values

    @staticmethod
    def _sum_over_ranks(active: dict) -> None:
        """Under torchrun, every count of ``active`` summed over the ranks (their shares of the
        test experience; the names are the same on every rank); nothing in one process."""
        names = [f"stage={stage}/{name}" for stage, variants in active["variants"].items() for name in variants]
        counts = sum_over_ranks([active["n"], active["correct_checkpoint"], active["correct_updated"],
                                 *(active["correct"].get(name, 0) for name in names)])
        active["n"], active["correct_checkpoint"], active["correct_updated"] = counts[:3]
        active["correct"] = dict(zip(names, counts[3:]))

    def _figure(self, record):
        """The recovery of every variant per stage, drawn when a logger reads it."""
        refined = [f"{f}+gauss_newton" for f in self.families if f != "identity" and self.gauss_newton_iterations]
        curves = {family: [record["recovery"].get(f"stage={s}/family={family}", math.nan) for s in self.stages]
                  for family in (*self.families, *refined)}
        title = (f"exp {record['experience']} after exp {record['after']}: "
                 f"acc_A={record['acc_checkpoint']:.2f}, acc_AB={record['acc_updated']:.2f}")
        return DeferredFigure(recovery_figure, list(self.stages), curves, title,
                              figsize=recovery_figure_size(self.stages))
