"""Grow vs Prune: unit-level structural plasticity on a class-incremental stream with tiny replay.

"On the Stability of Growth in Structural Plasticity" (arXiv 2605.15435). Dense vs
Prune (IMP with rewinding to init) vs Grow (activation-scored recruitment) vs Grow with each
insertion intervention, at target compactness c (fraction of hidden units kept), on:

* an MLP with two masked hidden layers and an unmasked 10-way head, Split digits / Split MNIST
  (class-incremental, shared head, ``ReplayPlugin`` with a few samples per class), SGD lr 0.01
  with momentum 0.9 (``--optimizer adam``: Adam lr 1e-3). A masked unit receives no gradient, so
  without weight decay its momentum / Adam moments are exactly 0 and ``keep`` / ``zero``
  coincide; ``fresh`` differs only under Adam (the unit's own step count in the bias correction
  instead of the tensor's);
* the same MLP on IID data (one experience; cycles within it, ``cycle_scope="experience"``);
* a small CNN (masked conv channels, BatchNorm) on the split stream.

Per run: final ACC (cumulative test accuracy after the last experience), TAA (mean cycle accuracy,
one cycle per epoch), the retrained ticket's ACC and TAA (:func:`retrain_ticket`: final mask,
fresh init, same stream) and, for Grow, the newborn/incumbent gradient ratio (mean over growth
cycles). Cost: time per training epoch of the masked model (fixed mask at c) over the same dense
model, measured in the same process. ``--quick``: one seed, c = 30 %, fewer methods.

Every (setting, method, compactness, seed) run and every timing measurement is one job of
:func:`avalanche_plugins.study.harness.jobs.run_jobs`: finished jobs are appended to ``OUT/jobs.jsonl`` and reused
when the same command is run again, so an interrupted run resumes where it stopped. To fit a
budget: ``--settings`` (a subset of the settings by name), ``--epochs`` / ``--iid-epochs`` (epochs
per experience of the split / IID settings), ``--cnn-methods`` / ``--iid-methods`` (fewer methods
on the CNN / IID settings).

Run ``python -m benchmarks.grow_prune --help``.
"""

from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
from torch import nn

from avalanche_plugins import (
    CycleAccuracyMetric,
    FixedMaskPlugin,
    GrowPlugin,
    NewbornGradientMetric,
    PrunePlugin,
    retrain_ticket,
    stream_accuracy,
)
from avalanche_plugins.structural.cycles import CycleClock
from avalanche_plugins.study.harness.data import make_stream
from avalanche_plugins.study.harness.jobs import Timer, run_jobs, seed_everything
from avalanche_plugins.study.harness.models import build_model
from avalanche_plugins.study.harness.results import (
    format_table,
    print_report,
    rounded_floats,
    summarize,
    write_results,
)
from avalanche_plugins.study.harness.training import quiet_deprecations, quiet_evaluator
from benchmarks._cli import (
    benchmark_parser,
    is_skipped,
    make_executor,
    parse_args,
    split_list,
)

GROW_VARIANTS = {  # method -> GrowPlugin interventions
    "grow": {},
    "grow+zero_out": {"outgoing": "zero"},
    "grow+zero_state": {"optimizer_state": "zero"},
    "grow+fresh_state": {"optimizer_state": "fresh"},
    "grow+reinit_in": {"incoming": "reinit"},
    "grow+newborn_lr": {"newborn_lr": 3.0, "newborn_lr_halflife": 200.0},
    "grow+leaky": {},  # leaky ReLU model (plasticity-preserving activation; MLP only)
}
METHODS = ("dense", "prune", "prune+norewind", *GROW_VARIANTS)  # prune+norewind: IMP without rewinding


@dataclass
class Setting:
    """One data/model setting; every method and compactness runs on it."""

    name: str
    dataset: str = "digits"
    scenario: str = "split"
    n_experiences: int = 5
    model: str = "mlp"
    hidden: tuple[int, ...] = (128, 128)
    widths: tuple[int, ...] = (16, 32)
    epochs: int = 4  # per experience; one cycle per epoch
    edits: int = 3  # edit cycles to reach the target
    lr: float = 0.01
    momentum: float = 0.9
    optimizer: str = "sgd"  # or "adam" (lr 1e-3), where the optimizer-state interventions differ
    batch_size: int = 32
    replay_per_class: int = 5
    data_root: str | None = None
    epochs_per_cycle: int = 1  # > 1 on the plasticity stream: one edit per experience, E epochs to integrate
    ticket: bool = True  # retrain the final mask as a ticket (off on the plasticity stream)
    subset: int | None = None  # MNIST only: the first N train / N // 2 test images (every experience)
    edit_epoch: int = 0  # epochs into each cycle at which its edit happens (0: at its start; DelayedEditClock)
    leaky: bool = False  # leaky ReLU (slope 0.01) for every method: a plasticity-preserving activation


_LEAKY = functools.partial(nn.functional.leaky_relu, negative_slope=0.01)


def uses_leaky(setting: Setting, method: str) -> bool:
    """Leaky ReLU for this run: the setting's activation for every method, or ``grow+leaky``."""
    return setting.leaky or method == "grow+leaky"


def make_model(setting: Setting, n_classes: int, input_shape, leaky: bool = False) -> nn.Module:
    if setting.model == "mlp":
        return build_model("mlp", input_shape, n_classes, hidden=setting.hidden,
                           activation=nn.LeakyReLU if leaky else nn.ReLU)
    return build_model("cnn", input_shape, n_classes, widths=setting.widths)


def make_optimizer(setting: Setting, params):
    if setting.optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    return torch.optim.SGD(params, lr=setting.lr, momentum=setting.momentum)


class DelayedEditClock(CycleClock):
    """Stream-scope cycles whose edit comes ``edit_epoch`` epochs into the cycle instead of at its
    start (every cycle but the first): with one cycle per experience of T epochs, the edited network
    trains T − ``edit_epoch`` epochs before the next task while every method trains T epochs in all.

    Example:
        >>> clock = DelayedEditClock(epochs_per_cycle=4, edit_epoch=3)
        >>> [epoch for epoch in range(12) if (clock.edit_due(), clock.end_epoch())[0]]
        [7, 11]
    """

    def __init__(self, epochs_per_cycle: int, edit_epoch: int):
        super().__init__(epochs_per_cycle, "stream")
        if not 0 <= edit_epoch < epochs_per_cycle:
            raise ValueError(f"edit_epoch must be in [0, {epochs_per_cycle}), got {edit_epoch}")
        self.edit_epoch = edit_epoch

    def edit_due(self) -> bool:
        return self.epoch >= self.epochs_per_cycle and self.epoch % self.epochs_per_cycle == self.edit_epoch


def make_plugin(method: str, setting: Setting, c: float, seed: int):
    plugin = _make_plugin(method, setting, c, seed)
    if plugin is not None and setting.edit_epoch:
        plugin.clock = DelayedEditClock(setting.epochs_per_cycle, setting.edit_epoch)
    return plugin


def _make_plugin(method: str, setting: Setting, c: float, seed: int):
    scope = "experience" if setting.n_experiences == 1 else "stream"
    if method == "dense":
        return None
    if method in ("prune", "prune+norewind"):
        fraction = 1 - c ** (1 / setting.edits)  # IMP: (1 - f)^edits = c
        return PrunePlugin(c, prune_fraction_per_cycle=min(1.0, fraction + 1e-9),
                           epochs_per_cycle=setting.epochs_per_cycle,
                           rewind_to="init" if method == "prune" else None, cycle_scope=scope, seed=seed,
                           activation=_LEAKY if setting.leaky else torch.relu)
    seed_c = c / 2
    activation = _LEAKY if uses_leaky(setting, method) else torch.relu
    return GrowPlugin(c, seed_compactness=seed_c, grow_fraction_per_cycle=(c - seed_c) / setting.edits + 1e-9,
                      epochs_per_cycle=setting.epochs_per_cycle, score="activation", threshold=0.0, cycle_scope=scope, seed=seed,
                      activation=activation, track_newborn=True, **GROW_VARIANTS[method])


class NewbornCourse:
    """Per-iteration newborn/incumbent gradient ratio after every growth event of a
    :class:`GrowPlugin` (an Avalanche plugin placed after it): the time course of integration.

    ``events``: per growth, ``{"edit", "iteration", "ratio"}`` with ``ratio`` the mean per-unit
    gradient norm of the newborn units over the incumbents' (pooled over the masked layers), one
    value per ``bin`` training iterations, until the next growth or the end of training.
    :func:`steps_to_parity` reads from it how many iterations the newborns need to reach the
    incumbents' gradient norm."""

    def __init__(self, grow: GrowPlugin, bin: int = 10):
        from avalanche.core import SupervisedPlugin

        self.grow, self.bin, self.events, self._seen = grow, bin, [], 0
        self._new = self._old = 0.0
        self._n = 0
        self.plugin = type("NewbornCoursePlugin", (SupervisedPlugin,), {"after_backward": self._after_backward})()

    def _after_backward(self, strategy, **kwargs):
        masks = self.grow.masks
        if masks is None or not self.grow.history:
            return
        if len(self.grow.history) != self._seen:
            self._seen = len(self.grow.history)
            self.events.append({"edit": self._seen, "iteration": strategy.clock.train_iterations, "ratio": []})
            self._new = self._old = 0.0
            self._n = 0
        newborn, active = masks.newborn(), masks.masks
        grads = masks.unit_grad_norms()
        new = torch.cat([g[newborn[k]] for k, g in grads.items()])
        old = torch.cat([g[active[k] & ~newborn[k]] for k, g in grads.items()])
        if not new.numel() or not old.numel():
            return
        self._new += float(new.mean())
        self._old += float(old.mean())
        self._n += 1
        if self._n == self.bin:
            self.events[-1]["ratio"].append(self._new / self._old if self._old > 0 else float("nan"))
            self._new = self._old = 0.0
            self._n = 0


def steps_to_parity(ratios, bin: int = 10, window: int = 3) -> tuple[int | None, int]:
    """Iterations after insertion until the newborn gradient ratio first reaches 1 (a moving
    average over ``window`` bins of ``bin`` iterations): ``(steps or None when never, steps observed)``.

    Example:
        >>> steps_to_parity([0.2, 0.5, 0.9, 1.2, 1.3, 1.1], bin=10, window=2)
        (40, 60)
    """
    r = np.asarray(ratios, dtype=float)
    for i in range(window - 1, len(r)):
        if np.nanmean(r[i - window + 1:i + 1]) >= 1.0:
            return (i + 1) * bin, len(r) * bin
    return None, len(r) * bin


class CurrentTaskAccuracy:
    """Test accuracy on each experience right after training on it (plasticity: how well a new task
    is still learned), as an Avalanche plugin."""

    def __init__(self, test_stream):
        from avalanche.core import SupervisedPlugin

        self.test, self.values = list(test_stream), []
        self.plugin = type("CurrentTaskAccuracyPlugin", (SupervisedPlugin,),
                           {"after_training_exp": self._after_exp})()

    def _after_exp(self, strategy, **kwargs):
        i = strategy.experience.current_experience
        self.values.append(stream_accuracy(strategy, [self.test[i]], batch_size=512))


def replay(setting: Setting):
    from avalanche.training.plugins import ReplayPlugin

    return [ReplayPlugin(mem_size=10 * setting.replay_per_class)] \
        if setting.n_experiences > 1 and setting.replay_per_class else []


def run_one(setting: Setting, stream, method: str, c: float, seed: int, *, ticket: bool = True) -> dict:
    from avalanche.training.supervised import Naive

    seed_everything(seed)
    leaky = uses_leaky(setting, method)
    model = make_model(setting, stream.n_classes, stream.input_shape, leaky)
    plugin = make_plugin(method, setting, c, seed)
    cycles = CycleAccuracyMetric(stream.benchmark.test_stream, setting.epochs_per_cycle,
                                 cycle_scope="experience" if setting.n_experiences == 1 else "stream")
    metrics = [cycles] + ([NewbornGradientMetric(plugin)] if isinstance(plugin, GrowPlugin) else [])
    course = NewbornCourse(plugin) if isinstance(plugin, GrowPlugin) else None
    current = CurrentTaskAccuracy(stream.benchmark.test_stream) if setting.n_experiences > 1 else None
    extra = [x.plugin for x in (course, current) if x is not None]
    strategy = Naive(model=model, optimizer=make_optimizer(setting, model.parameters()),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=setting.batch_size,
                     train_epochs=setting.epochs, eval_mb_size=512, device="cpu",
                     plugins=[p for p in [plugin] if p is not None] + replay(setting) + extra,
                     evaluator=quiet_evaluator(*metrics))
    with Timer() as timer, quiet_deprecations():
        for experience in stream.benchmark.train_stream:
            strategy.train(experience, num_workers=0)
    row = {"setting": setting.name, "method": method, "compactness": c if plugin else 1.0, "seed": seed,
           "acc": stream_accuracy(strategy, list(stream.benchmark.test_stream), batch_size=512),
           "taa": cycles.taa, "trajectory": list(cycles.history), "wall_s": timer.seconds,
           "ticket_acc": None, "ticket_taa": None, "newborn_grad_ratio": None}
    if plugin is not None:
        row["final_compactness"] = plugin.masks.compactness()
        row["edits"] = plugin.history
    if isinstance(plugin, GrowPlugin):
        ratios = [r["grad_ratio"] for r in plugin.newborn_log if math.isfinite(r["grad_ratio"])]
        row["newborn_grad_ratio"] = float(np.mean(ratios)) if ratios else None
        row["newborn_log"] = plugin.newborn_log
        row["newborn_course"] = course.events
        parity = [steps_to_parity(e["ratio"], course.bin) for e in course.events]
        row["steps_to_parity"] = [p[0] for p in parity]
        row["steps_observed"] = [p[1] for p in parity]
    if current is not None:
        row["current_task_acc"] = current.values
        row["plasticity"] = float(np.mean(current.values))
    if plugin is not None and ticket and setting.ticket:
        with quiet_deprecations():
            result = retrain_ticket(
                plugin.masks.masks, lambda: make_model(setting, stream.n_classes, stream.input_shape, leaky),
                stream, optimizer_factory=lambda p: make_optimizer(setting, p),
                train_epochs=setting.epochs, train_mb_size=setting.batch_size,
                plugins_factory=lambda: replay(setting), seed=seed + 1000,
                epochs_per_cycle=setting.epochs_per_cycle,
                cycle_scope="experience" if setting.n_experiences == 1 else "stream",
                activation=plugin.activation)
        row["ticket_acc"], row["ticket_taa"] = result.acc, result.taa
    return row


def time_per_epoch(setting: Setting, stream, c: float | None, repeats: int = 3) -> float:
    """Seconds per training epoch on the first experience, dense (``c`` None) or with a fixed
    random mask at compactness ``c``; the minimum over ``repeats``."""
    from avalanche.training.supervised import Naive

    best = math.inf
    for r in range(repeats):
        seed_everything(r)
        model = make_model(setting, stream.n_classes, stream.input_shape)
        plugins = [] if c is None else [_RandomMaskPlugin(c, r)]
        strategy = Naive(model=model, optimizer=make_optimizer(setting, model.parameters()),
                         criterion=nn.CrossEntropyLoss(), train_mb_size=setting.batch_size, train_epochs=2,
                         device="cpu", plugins=plugins, evaluator=quiet_evaluator())
        start = time.perf_counter()
        strategy.train(stream.benchmark.train_stream[0], num_workers=0)
        best = min(best, (time.perf_counter() - start) / 2)
    return best


class _RandomMaskPlugin(FixedMaskPlugin):
    """A fixed random mask at compactness ``c`` (timing only)."""

    def __init__(self, c, seed):
        super().__init__({"_": torch.ones(1)})  # placeholder: the real mask is drawn below
        self.c, self.seed = c, seed

    def _masks_created(self, strategy):
        g = torch.Generator().manual_seed(self.seed)
        self.masks.set_masks({name: torch.randperm(n, generator=g) < max(1, round(self.c * n))
                              for name, n in self.masks.sizes().items()})


def settings_for(args) -> list[Setting]:
    quick = args.quick
    common = dict(epochs=2 if quick else 4, edits=2 if quick else 3)
    out = [Setting("mlp split digits", hidden=(64, 64) if quick else (128, 128), **common),
           Setting("cnn split digits", model="cnn", widths=(8, 16) if quick else (16, 32), **common)]
    if not quick:
        out.append(Setting("mlp iid digits", n_experiences=1, epochs=8, edits=3))
    if args.data_root:
        mnist = dict(dataset="mnist", data_root=args.data_root, batch_size=64)
        out += [Setting("mlp split mnist", hidden=(256, 256), epochs=2 if quick else 3, edits=2, **mnist),
                Setting("cnn split mnist", model="cnn", widths=(32, 64), epochs=2 if quick else 3, edits=2,
                        **mnist)]
        if not quick:
            out.append(Setting("mlp iid mnist", n_experiences=1, hidden=(256, 256), epochs=6, edits=3, **mnist))
        # the i.i.d. CNN (issue 25): where the dense CNN learns (>= 0.97), beside the MLP at the same protocol
        out.append(Setting("cnn iid mnist", model="cnn", n_experiences=1, widths=tuple(args.cnn_widths),
                           epochs=6, edits=3, lr=args.cnn_lr, **mnist))
        # loss of plasticity: Permuted MNIST, one edit at the start of every experience, then E epochs
        # (the integration time) before the next task; no tickets
        for e in args.integration_epochs:
            out.append(Setting(f"mlp permuted mnist E{e}", scenario="permuted", n_experiences=args.permuted_experiences,
                               hidden=(256, 256), epochs=e, epochs_per_cycle=e, edits=args.permuted_experiences - 1,
                               ticket=False, subset=args.permuted_subset, **mnist))
        # the same stream at a fixed budget of T epochs per experience for every method: the edit comes
        # T − E epochs into each experience, so only the newborns' time before the next task varies
        t = args.fixed_budget_epochs
        for e in (e for e in args.integration_epochs if e <= t):
            out.append(Setting(f"mlp permuted mnist T{t} E{e}", scenario="permuted",
                               n_experiences=args.permuted_experiences, hidden=(256, 256), epochs=t,
                               epochs_per_cycle=t, edit_epoch=t - e, edits=args.permuted_experiences - 1,
                               ticket=False, subset=args.permuted_subset, **mnist))
            # the same with leaky ReLU for every method (a plasticity-preserving activation)
            out.append(replace(out[-1], name=f"mlp leaky permuted mnist T{t} E{e}", leaky=True))
            # random-label MNIST: memorise a new labelling of the same images per experience, no replay
            out.append(replace(out[-2], name=f"mlp random-label mnist T{t} E{e}", scenario="random_labels",
                               replay_per_class=0))
    return out


def plot_course(rows, path) -> None:
    """Newborn/incumbent gradient ratio against iterations since the last growth (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    keys = dict.fromkeys((r["setting"], r["method"], r["compactness"]) for r in rows if r.get("newborn_course"))
    for st, m, c in keys:
        curves = [r["newborn_course"][-1]["ratio"] for r in rows
                  if (r["setting"], r["method"], r["compactness"]) == (st, m, c) and r["newborn_course"]]
        n = min(len(x) for x in curves)
        if n:
            ax.plot(10 * np.arange(1, n + 1), np.mean([x[:n] for x in curves], axis=0), label=f"{st} {m} c={c:.0%}")
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set(xlabel="iterations since the last growth", ylabel="newborn / incumbent gradient norm", yscale="log")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_trajectories(rows, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys((r["setting"], r["compactness"]) for r in rows if r["method"] != "dense"))
    fig, axes = plt.subplots(1, max(1, len(keys)), figsize=(5 * max(1, len(keys)), 3.6), squeeze=False)
    for ax, (setting, c) in zip(axes[0], keys):
        for method in dict.fromkeys(r["method"] for r in rows):
            runs = [r for r in rows if r["setting"] == setting and r["method"] == method
                    and (r["compactness"] == c or method == "dense")]
            if runs:
                curve = np.mean([[a for _, a in r["trajectory"]] for r in runs], axis=0)
                ax.plot(range(1, len(curve) + 1), curve, marker=".", label=method)
        ax.set(xlabel="cycle (epoch)", ylabel="cumulative test accuracy", title=f"{setting}, c={c:.0%}",
               ylim=(0, 1))
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@dataclass(frozen=True)
class Job:
    """One run (``kind="run"``) or the masked/dense timing of a setting (``kind="timing"``)."""

    kind: str
    setting: Setting
    method: str = ""
    c: float = 1.0
    seed: int = 0


@functools.lru_cache(maxsize=4)
def _stream(dataset: str, scenario: str, n_experiences: int, data_root, subset: int | None = None):
    if subset is None:
        return make_stream(dataset, scenario, n_experiences=n_experiences, data_root=data_root, seed=0)
    from avalanche_plugins.study.harness import data

    full = make_stream(dataset, "permuted" if scenario == "random_labels" else scenario, n_experiences=1,
                       data_root=data_root, seed=0)
    xtr, ytr, xte, yte = data.load_mnist_arrays(data_root)
    if scenario == "random_labels":
        return replace(full, benchmark=_random_label_benchmark(xtr[:subset], n_experiences),
                       description=f"random-label MNIST ({n_experiences} experiences, first {subset} train images)")
    arrays = (xtr[:subset], ytr[:subset], xte[:subset // 2], yte[:subset // 2])
    bench = data._from_arrays(arrays, scenario, n_experiences, False, 0)
    return replace(full, benchmark=bench, description=f"{scenario} {dataset} ({n_experiences} experiences, "
                                                      f"first {subset} train / {subset // 2} test images)")


def _random_label_benchmark(x: torch.Tensor, n_experiences: int):
    """Random-label MNIST (loss-of-plasticity literature): every experience is the same images with
    fresh uniformly random labels, and its test set is its own training set, so accuracy measures how
    well the network can still memorise a new labelling."""
    from avalanche.benchmarks import tensors_benchmark

    g = torch.Generator().manual_seed(0)
    labels = [torch.randint(0, 10, (len(x),), generator=g) for _ in range(n_experiences)]
    return tensors_benchmark(train_tensors=[[x, y] for y in labels], test_tensors=[[x, y] for y in labels],
                             task_labels=[0] * n_experiences)


def run_job(job: Job) -> dict:
    setting = job.setting
    stream = _stream(setting.dataset, setting.scenario, setting.n_experiences, setting.data_root, setting.subset)
    if job.kind == "timing":
        dense_s = time_per_epoch(setting, stream, None)
        masked_s = time_per_epoch(setting, stream, job.c)
        print(f"{setting.name}: masked/dense time per epoch {masked_s / dense_s:.2f}", flush=True)
        return {"kind": "timing", "setting": setting.name, "dense_s_per_epoch": dense_s,
                "masked_s_per_epoch": masked_s, "masked_over_dense": masked_s / dense_s, "compactness": job.c}
    row = run_one(setting, stream, job.method, job.c, job.seed)
    row["config"] = asdict(setting)
    ticket = f" ticket {row['ticket_acc']:.3f}/{row['ticket_taa']:.3f}" if row["ticket_acc"] is not None else ""
    ratio = f" ratio {row['newborn_grad_ratio']:.2f}" if row["newborn_grad_ratio"] else ""
    print(f"{setting.name:<18} {job.method:<17} c={job.c:.2f} seed {job.seed}: ACC {row['acc']:.3f} "
          f"TAA {row['taa']:.3f}{ticket}{ratio} ({row['wall_s']:.1f}s)", flush=True)
    return row


def _methods(value: str | None, default, parser, flag: str) -> list[str]:
    methods = split_list(value or ",".join(default))
    unknown = set(methods) - set(METHODS)
    if unknown:
        parser.error(f"{flag}: unknown {sorted(unknown)}; choose from {METHODS}")
    return methods


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None and x == x]
    return float(np.mean(xs)) if xs else float("nan")


INTERVENTIONS = ("zero_out", "zero_state", "fresh_state", "reinit_in", "newborn_lr", "leaky")


def analysis(rows: list[dict]) -> str:
    """The docs' reading tables from the run rows: paired Grow − Prune differences per compactness
    (and in how many seeds Grow is higher), each intervention's paired change of the newborn
    gradient ratio against plain Grow, and Grow's newborn/incumbent activation ratio."""
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    by = {(r["setting"], r["method"], r["compactness"], r["seed"]): r for r in rows}
    out = ["Paired Grow − Prune (mean over seeds; seeds where Grow is higher)",
           "| setting | c | ΔACC | ΔTAA | Δticket ACC | Δticket TAA |", "|---|---|---|---|---|---|"]
    for s in settings:
        for c in sorted({r["compactness"] for r in rows if r["setting"] == s and r["method"] == "grow"}):
            seeds = sorted(k[3] for k in by if k[:3] == (s, "grow", c) and (s, "prune", c, k[3]) in by)
            cells = []
            for key in ("acc", "taa", "ticket_acc", "ticket_taa"):
                d = [by[(s, "grow", c, x)][key] - by[(s, "prune", c, x)][key] for x in seeds
                     if by[(s, "grow", c, x)][key] is not None and by[(s, "prune", c, x)][key] is not None]
                cells.append(f"{np.mean(d):+.3f} ({sum(v > 0 for v in d)}/{len(d)})" if d else "–")
            out.append(f"| {s} | {c:.0%} | " + " | ".join(cells) + " |")
    out += ["", "Newborn gradient ratio: intervention − plain Grow (paired over compactness × seed); "
            "Grow's newborn/incumbent activation ratio",
            "| setting | grow grad ratio | grow act ratio | " + " | ".join(INTERVENTIONS) + " |",
            "|---|---|---|" + "---|" * len(INTERVENTIONS)]
    for s in settings:
        base = {k[2:]: r["newborn_grad_ratio"] for k, r in by.items() if k[:2] == (s, "grow")}
        act = _mean([e["newborn_act"] / e["incumbent_act"] for k, r in by.items() if k[:2] == (s, "grow")
                     for e in r.get("newborn_log") or [] if e["incumbent_act"] > 0])
        cells = [f"{_mean(base.values()):.2f}", f"{act:.2f}"]
        for iv in INTERVENTIONS:
            other = {k[2:]: r["newborn_grad_ratio"] for k, r in by.items() if k[:2] == (s, f"grow+{iv}")}
            d = [other[k] - base[k] for k in sorted(set(base) & set(other))]
            cells.append(f"{np.mean(d):+.2f} ({sum(v > 0 for v in d)}/{len(d)} up)" if d else "–")
        out.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _paired(a, b) -> str:
    """``mean(a − b) [sd] d_z, seeds a > b, paired t-test p`` over aligned per-seed values
    ("identical" when a equals b in every seed, e.g. an intervention that is a no-op).

    Example:
        >>> _paired([0.5, 0.6], [0.5, 0.6])
        'identical (2/2 seeds)'
    """
    from scipy import stats

    a, b = np.asarray(a, float), np.asarray(b, float)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if len(a) < 2:
        return "–"
    d = a - b
    if not d.any():
        return f"identical ({len(d)}/{len(d)} seeds)"
    sd = d.std(ddof=1)
    p = stats.ttest_rel(a, b).pvalue if sd > 0 else float("nan")
    dz = d.mean() / sd if sd > 0 else float("nan")
    return f"{d.mean():+.3f} (d_z {dz:+.1f}; {int((d > 0).sum())}/{len(d)} up; p {p:.3f})"


def verdict_tables(rows: list[dict]) -> str:
    """The tests behind the verdicts of issue 25 (paired over seeds; scipy):

    1. newborn/incumbent gradient and activation ratio per growth cycle, one-sample t-test of
       log(grad ratio) against 0, and iterations until the newborns' gradient norm reaches the
       incumbents' (:func:`steps_to_parity`) after the last growth;
    2. Grow − Prune on ACC, TAA, ticket ACC, ticket TAA per setting and compactness;
    3. each intervention − plain Grow on the grad ratio, ACC, TAA and ticket ACC;
    4. on the plasticity settings, Grow − Prune (ACC, TAA, current-task accuracy) per integration time.
    """
    from scipy import stats

    by = {(r["setting"], r["method"], r["compactness"], r["seed"]): r for r in rows}
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    out = ["Claim 1: newborn units (plain Grow; per seed the mean over growth cycles)",
           "| setting | c | grad ratio | log-ratio t-test p (ratio < 1) | act ratio | after the last growth: ratio first → last "
           "50 iterations; iterations to parity |",
           "|---|---|---|---|---|---|"]
    for st in settings:
        for c in sorted({k[2] for k in by if k[:2] == (st, "grow")}):
            rs = [by[k] for k in sorted(by) if k[:3] == (st, "grow", c)]
            g = np.array([np.mean([e["grad_ratio"] for e in r["newborn_log"]]) for r in rs])
            a = np.array([np.mean([e["newborn_act"] / e["incumbent_act"] for e in r["newborn_log"]
                                   if e["incumbent_act"] > 0]) for r in rs])
            p = stats.ttest_1samp(np.log(g), 0.0, alternative="less").pvalue if len(g) > 1 else float("nan")
            last = [(r.get("steps_to_parity") or [None])[-1] for r in rs]
            observed = [(r.get("steps_observed") or [0])[-1] for r in rs]
            reached = [x for x in last if x is not None]
            course = [r["newborn_course"][-1]["ratio"] for r in rs if r.get("newborn_course")]
            start_end = [(np.mean(x[:5]), np.mean(x[-5:])) for x in course if len(x) >= 5]
            parity = ((f"ratio {np.mean([a for a, _ in start_end]):.2f} → {np.mean([b for _, b in start_end]):.2f}; "
                       if start_end else "") + f"{len(reached)}/{len(last)} seeds reach it"
                      + (f" (median {np.median(reached):.0f})" if reached else "")
                      + f"; {int(np.median(observed))} observed")
            out.append(f"| {st} | {c:.0%} | {g.mean():.3f} ± {g.std(ddof=1) if len(g) > 1 else 0:.3f} | {p:.2g} | "
                       f"{a.mean():.2f} | {parity} |")
    out += ["", "Claim 2: Grow − Prune, paired over seeds: mean (d_z; seeds where Grow is higher; paired t-test p)",
            "| setting | c | ACC | TAA | ticket ACC | ticket TAA | current-task acc |", "|---|---|---|---|---|---|---|"]
    for st in settings:
        for c in sorted({k[2] for k in by if k[:2] == (st, "grow")}):
            seeds = sorted(k[3] for k in by if k[:3] == (st, "grow", c) and (st, "prune", c, k[3]) in by)
            if not seeds:
                continue
            cells = []
            for key in ("acc", "taa", "ticket_acc", "ticket_taa", "plasticity"):
                g = [by[(st, "grow", c, x)].get(key) for x in seeds]
                q = [by[(st, "prune", c, x)].get(key) for x in seeds]
                cells.append("–" if None in g + q else _paired(g, q))
            out.append(f"| {st} | {c:.0%} | " + " | ".join(cells) + " |")
    pair = ("mlp iid mnist", "cnn iid mnist")  # claim 2: is the Grow − Prune gap larger with the conv trunk?
    if all((st, "grow") in {k[:2] for k in by} for st in pair):
        out += ["", "Claim 2, MLP vs CNN: (Grow − Prune on the CNN) − (Grow − Prune on the MLP), paired by seed",
                "| c | ACC | TAA | ticket ACC | ticket TAA |", "|---|---|---|---|---|"]
        for c in sorted({k[2] for k in by if k[:2] == (pair[1], "grow")}):
            seeds = sorted(x for x in {k[3] for k in by}
                           if all((st, m, c, x) in by for st in pair for m in ("grow", "prune")))
            cells = []
            for key in ("acc", "taa", "ticket_acc", "ticket_taa"):
                d = [[by[(st, "grow", c, x)][key] - by[(st, "prune", c, x)][key] for x in seeds] for st in pair]
                cells.append(_paired(d[1], d[0]))
            out.append(f"| {c:.0%} | " + " | ".join(cells) + " |")
    out += ["", "Claim 3: intervention − plain Grow, paired over seeds (same c)",
            "| setting | c | intervention | grad ratio | ACC | TAA | ticket ACC | ticket TAA |",
            "|---|---|---|---|---|---|---|---|"]
    for st in settings:
        for iv in INTERVENTIONS:
            for c in sorted({k[2] for k in by if k[:2] == (st, f"grow+{iv}")}):
                seeds = sorted(k[3] for k in by if k[:3] == (st, f"grow+{iv}", c) and (st, "grow", c, k[3]) in by)
                cells = []
                for key in ("newborn_grad_ratio", "acc", "taa", "ticket_acc", "ticket_taa"):
                    v = [by[(st, f"grow+{iv}", c, x)].get(key) for x in seeds]
                    b = [by[(st, "grow", c, x)].get(key) for x in seeds]
                    cells.append("–" if None in v + b else _paired(v, b))
                out.append(f"| {st} | {c:.0%} | {iv} | " + " | ".join(cells) + " |")
    out += claim4_table(by)
    return "\n".join(out)


def claim4_table(by: dict) -> list[str]:
    """Plasticity settings (names ending in `` E<epochs>``): Grow − each baseline per integration
    time E, and the trend (the Grow − baseline difference at the largest E minus at the smallest,
    paired over seeds)."""
    import re

    groups: dict = {}
    for (st, _, _, _) in by:
        m = re.match(r"(.*) E(\d+)$", st)
        if m:
            groups.setdefault(m.group(1), set()).add(int(m.group(2)))
    if not groups:
        return []
    out = ["", "Claim 4: Grow − baseline on the plasticity stream per integration time E (epochs per experience), "
           "paired over seeds", "| stream | E | baseline | ACC | TAA | current-task acc |", "|---|---|---|---|---|---|"]
    for base_name, es in groups.items():
        es = sorted(es)
        for base in ("prune", "prune+norewind", "dense"):
            diffs = {}
            for e in es:
                st = f"{base_name} E{e}"
                grow = {k[3]: by[k] for k in by if k[:2] == (st, "grow")}
                other = {k[3]: by[k] for k in by if k[:2] == (st, base)}
                seeds = sorted(set(grow) & set(other))
                if not seeds:
                    continue
                cells = []
                for key in ("acc", "taa", "plasticity"):
                    g, b = [grow[x][key] for x in seeds], [other[x][key] for x in seeds]
                    diffs.setdefault(key, {})[e] = dict(zip(seeds, np.subtract(g, b)))
                    cells.append(_paired(g, b))
                out.append(f"| {base_name} | {e} | {base} | " + " | ".join(cells) + " |")
            if len(diffs.get("acc", {})) >= 2:
                lo, hi = min(diffs["acc"]), max(diffs["acc"])
                cells = []
                for key in ("acc", "taa", "plasticity"):
                    seeds = sorted(set(diffs[key][lo]) & set(diffs[key][hi]))
                    cells.append(_paired([diffs[key][hi][x] for x in seeds], [diffs[key][lo][x] for x in seeds]))
                out.append(f"| {base_name} | E{hi} − E{lo} | {base} | " + " | ".join(cells) + " |")
    return out


def compact_row(row: dict) -> dict:
    """A row as a kept run stores it (``--merge``): without the unit indices of every edit and with
    every float at 6 significant digits (the report prints 3 decimals); ``--report`` reads it unchanged.

    Example:
        >>> compact_row({"edits": [{"cycle": 1, "units": {"fc": [3, 7]}}], "acc": 0.91234567891})
        {'edits': [{'cycle': 1}], 'acc': 0.912346}
    """
    out = dict(row)
    if row.get("edits"):
        out["edits"] = [{k: v for k, v in e.items() if k != "units"} for e in row["edits"]]
    return rounded_floats(out)


def share_run_configs(saved: dict) -> dict:
    """A kept run with every distinct per-run ``config`` stored once, in ``saved["run_configs"]``,
    and each run's ``config`` the index of its entry there (a setting's runs share one, so this
    takes the repetition out of the kept files; ``report`` does not read it).

    Example:
        >>> share_run_configs({"runs": [{"acc": 1, "config": {"lr": 0.1}}, {"acc": 2, "config": {"lr": 0.1}}]})
        {'runs': [{'acc': 1, 'config': 0}, {'acc': 2, 'config': 0}], 'run_configs': [{'lr': 0.1}]}
    """
    configs = list(saved.get("run_configs", []))  # a file shared before keeps its indices
    index = {json.dumps(c, sort_keys=True): i for i, c in enumerate(configs)}
    runs = []
    for run in saved["runs"]:
        if isinstance(run.get("config"), dict):
            key = json.dumps(run["config"], sort_keys=True)
            if key not in index:
                index[key] = len(configs)
                configs.append(run["config"])
            run = {**run, "config": index[key]}
        runs.append(run)
    return {**saved, "runs": runs, "run_configs": configs}


VALUES = ("acc", "taa", "ticket_acc", "ticket_taa", "newborn_grad_ratio", "plasticity")


def report(saved: dict) -> str:
    """The summary table, the paired analysis and the masked/dense time per epoch of a saved run."""
    lines = [format_table(saved["summary"], ["setting", "method", "compactness"], VALUES), analysis(saved["runs"]),
             "", verdict_tables(saved["runs"])]
    if saved.get("timing"):
        lines.append("masked/dense time per epoch: " + ", ".join(f"{t['setting']} {t['masked_over_dense']:.2f}"
                                                               for t in saved["timing"]))
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = benchmark_parser("grow_prune", __doc__.splitlines()[0],
                              skip_help="setting names (e.g. 'cnn split digits'); timing (the masked/dense cost)")
    parser.add_argument("--methods", default=None, help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--cnn-methods", default=None,
                        help="methods on the CNN settings (default: --methods; grow+leaky never runs there)")
    parser.add_argument("--iid-methods", default=None, help="methods on the IID settings (default: --methods)")
    parser.add_argument("--compactness", default=None, help="comma-separated targets (default 0.2,0.3,0.4,0.5)")
    parser.add_argument("--settings", default=None,
                        help="comma-separated subset of the setting names (default: all; see the docstring)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs per experience of the split settings (default: per setting)")
    parser.add_argument("--iid-epochs", type=int, default=None,
                        help="epochs of the IID settings (default: per setting; at least edits + 1)")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                        help="sgd: lr 0.01, momentum 0.9; adam: lr 1e-3")
    parser.add_argument("--iid-edits", type=int, default=None,
                        help="edit cycles of the IID settings (default: per setting)")
    parser.add_argument("--cnn-widths", default="8,16,32", help="channels of 'cnn iid mnist'")
    parser.add_argument("--cnn-lr", type=float, default=0.05, help="SGD lr of 'cnn iid mnist'")
    parser.add_argument("--variant-compactness", default=None,
                        help="compactness at which the grow+intervention methods run (default: every target)")
    parser.add_argument("--integration-epochs", default="1,2,4",
                        help="epochs per experience of the 'mlp permuted mnist E*' settings (integration time)")
    parser.add_argument("--fixed-budget-epochs", type=int, default=4, metavar="T",
                        help="epochs per experience of the 'mlp permuted mnist T<T> E*' settings (edit T − E epochs in)")
    parser.add_argument("--permuted-experiences", type=int, default=10, help="experiences of Permuted MNIST")
    parser.add_argument("--permuted-subset", type=int, default=None,
                        help="Permuted MNIST on the first N training (N // 2 test) images of the subset (cost)")
    parser.add_argument("--permuted-methods", default="dense,prune,grow",
                        help="methods on the 'mlp permuted mnist E*' settings")
    parser.add_argument("--seed-list", default=None, help="explicit seeds (comma-separated; overrides --seeds)")
    parser.add_argument("--merge", default=None, metavar="JOBS_JSONL",
                        help="comma-separated job caches: write results.json/report from their rows (runs nothing)")
    args = parse_args(parser, argv)
    args.cnn_widths = [int(v) for v in split_list(args.cnn_widths)]
    args.integration_epochs = [int(v) for v in split_list(args.integration_epochs)]
    if args.fixed_budget_epochs < 1 or min(args.integration_epochs, default=1) < 1:
        parser.error("--fixed-budget-epochs and --integration-epochs must be positive integers")
    if args.report:
        return {"report": print_report(args.report, report)}
    default_methods = ("dense", "prune", "grow", "grow+zero_out", "grow+fresh_state") if args.quick else METHODS
    methods = _methods(args.methods, default_methods, parser, "--methods")
    cnn_methods = _methods(args.cnn_methods, methods, parser, "--cnn-methods")
    iid_methods = _methods(args.iid_methods, methods, parser, "--iid-methods")
    permuted_methods = _methods(args.permuted_methods, (), parser, "--permuted-methods")
    variant_c = [float(v) for v in split_list(args.variant_compactness)] or None
    targets = [float(v) for v in split_list(args.compactness or ("0.3" if args.quick else "0.2,0.3,0.4,0.5"))]
    seeds = [int(v) for v in split_list(args.seed_list)] if args.seed_list else range(args.seeds)
    settings = settings_for(args)
    if args.settings:
        names = split_list(args.settings)
        known = [s.name for s in settings]
        if set(names) - set(known):
            parser.error(f"--settings: unknown {sorted(set(names) - set(known))}; choose from {known}")
        settings = [s for s in settings if s.name in names]
    settings = [s for s in settings if not is_skipped(args.skip, s.name)]
    for i, setting in enumerate(settings):
        if setting.n_experiences == 1 and args.iid_edits is not None:
            setting = settings[i] = replace(setting, edits=args.iid_edits)
        epochs = args.iid_epochs if setting.n_experiences == 1 else None if setting.ticket is False else args.epochs
        if epochs is not None:
            if setting.n_experiences == 1 and epochs <= setting.edits:
                parser.error(f"--iid-epochs must exceed the {setting.edits} edits of {setting.name!r}")
            settings[i] = replace(setting, epochs=epochs)
        settings[i] = replace(settings[i], optimizer=args.optimizer)
    jobs = [] if is_skipped(args.skip, "timing") else [Job("timing", s, c=targets[0]) for s in settings]
    for setting in settings:
        for seed in seeds:
            for method in (cnn_methods if setting.model == "cnn" else
                           iid_methods if setting.n_experiences == 1 else
                           permuted_methods if setting.scenario == "permuted" else methods):
                if method == "grow+leaky" and setting.model != "mlp":
                    continue
                cs = [1.0] if method == "dense" else \
                    [c for c in targets if variant_c is None or method in ("prune", "grow") or c in variant_c]
                jobs += [Job("run", setting, method, c, seed) for c in cs]
    start = time.perf_counter()
    if args.merge:  # the rows of earlier runs' caches (e.g. runs split over processes), last row per job
        merged = {}
        for cache in split_list(args.merge):
            for line in open(cache).read().splitlines():
                entry = json.loads(line)
                row = entry["row"]
                merged[(row.get("kind"), row["setting"], row.get("method"), row.get("compactness"), row.get("seed"))] = row
        done = [compact_row(r) for r in merged.values()]
    else:
        done = run_jobs(run_job, jobs, cache=f"{args.out}/jobs.jsonl", executor=make_executor(args),
                        desc="grow/prune", progress=not args.no_progress)
    wall = time.perf_counter() - start
    timing = [r for r in done if r.get("kind") == "timing"]
    rows = [r for r in done if r.get("kind") != "timing"]
    summary = summarize(rows, ["setting", "method", "compactness"], VALUES)
    out = write_results(args.out, args, config={"args": vars(args), "methods": methods, "cnn_methods": cnn_methods,
                                                "iid_methods": iid_methods,
                                                "compactness": targets, "settings": [asdict(s) for s in settings],
                                                "optimizer": args.optimizer},
                        rows=rows, summary=summary, wall_seconds=wall,
                        extra={"timing": timing, "masked_over_dense_time_per_epoch":
                               max((t["masked_over_dense"] for t in timing), default=None)})
    if args.merge:  # a kept run: one line of JSON, not indent=2 (a third of the size), configs once
        (out / "results.json").write_text(json.dumps(share_run_configs(json.loads((out / "results.json").read_text())),
                                                     separators=(",", ":")))
    plot_trajectories(rows, out / "trajectory.png")
    plot_course(rows, out / "newborn_course.png")
    text = print_report(out / "results.json", report, out_dir=out)
    print(f"wrote {out}/results.json, results.csv, report.md, trajectory.png, jobs.jsonl ({wall:.0f}s)")
    return {"rows": rows, "summary": summary, "timing": timing, "out": out, "report": text}


if __name__ == "__main__":
    main()
