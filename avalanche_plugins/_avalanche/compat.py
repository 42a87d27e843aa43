"""Work-arounds for known Avalanche 0.6 defects that affect comparisons with this package.

``fix_synaptic_intelligence_on_cpu``: Avalanche 0.6's ``SynapticIntelligencePlugin`` stores
parameter snapshots with ``param.detach().cpu().flatten()``. On CPU that is a *view* of the live
parameter, so every "old" snapshot moves with the weights: importances and the penalty stay
exactly 0 for any ``si_lambda`` (SI silently degenerates to Naive). Its helpers are called as
``SynapticIntelligencePlugin.extract_weights(...)``, so a subclass cannot override them; the fix
replaces the static method on the class with one that stores copies.

``fix_checkpoint_pickling``: Avalanche's ``save_checkpoint`` pickles the whole strategy with
``dill``. torch 2.14 removes the submodule attributes of ``torch.optim`` (``torch.optim.sgd`` is in
``sys.modules`` but not an attribute), so dill cannot find ``torch.optim.sgd.SGD`` by reference,
falls back to pickling the class by value and fails (``Can't pickle sentinel``). Re-exposing the
loaded submodules as attributes restores pickling by reference; nothing else changes.

``save_checkpoint``: Avalanche's ``save_checkpoint`` writes straight into the target, so a strategy
that cannot be pickled leaves a truncated file (and has already destroyed the previous checkpoint),
with dill's error only. This wrapper writes a temporary file next to the target and renames it
over the target only when the save succeeded; a pickling failure removes the temporary file and
raises a ``pickle.PicklingError`` that names the fix (``fix_checkpoint_pickling()`` when it has not
been applied, ``exclude=`` otherwise).

``fix_wandb_logger``: Avalanche 0.6's ``WandBLogger`` calls ``wandb.util.generate_id`` (gone in
wandb 0.31) when it starts a run and builds its type checks from ``wandb.viz.CustomChart`` (gone:
it is ``wandb.plot.CustomChart``) for every value, so it fails at construction and, once shimmed, at
the first value. It then hands ``matplotlib`` figures to ``wandb.log``, which converts them with
plotly (an error without plotly, aborting training), and ``after_training_exp`` logs every value a
second time. The fix replaces those three methods: ids from ``wandb.sdk.lib.runid``, figures and
``TensorImage`` values sent as ``wandb.Image`` PNGs, each value logged once.

``fix_text_loggers``: ``TextLogger`` buffers every value it receives and prints the buffer only at
``after_training_epoch``, ``after_eval_exp`` and ``after_eval``. Values emitted at
``after_training_exp`` (most of this package's metrics, which measure a trained experience) are
therefore printed under the *next* experience's first epoch, or in the next eval block; after the
last experience of a train-only loop they are never printed. ``InteractiveLogger`` overrides
``after_training_exp`` for online streams only. The fix prints the buffer at the end of each
training experience (under "> Training on experience N ... ended.") and at the end of training.

``fix_replaced_model_optimizer``: Avalanche 0.6's ``BatchObservation.check_model_and_optimizer``
(``templates/observation_type/batch_observation.py``) points the optimizer at the strategy's
current model (``make_optimizer``) only when ``_at_task_boundary(self.experience, before=True)``,
which on an online stream with ``access_task_boundaries=True`` is the *first* sub-experience of an
original experience only. A strategy that replaces ``strategy.model`` at every experience it is
given (``GDumbPlugin.before_train_dataset_adaptation``: ``strategy.model =
copy.deepcopy(self.init_model)``) therefore trains nothing on the other sub-experiences: the
optimizer keeps stepping the discarded model and the evaluated model is an untrained copy (online
GDumb scores chance). The fix wraps the method: after Avalanche's own checks, when the model's
parameters are no longer the ones the optimizer was last pointed at (``optimized_param_id``: the
model object or its parameters were replaced), it calls ``make_optimizer`` as a boundary would
(same optimizer object, type, parameter groups and hyper-parameters: Avalanche's
``update_optimizer`` matches parameters by name and puts each new parameter in its predecessor's
place, so a user's groups — a head and a body at different rates, say — keep their settings and
hold the new model's parameters; the replaced parameters start with fresh optimizer state). When
the model was not replaced nothing is called: no-op.
"""

from __future__ import annotations

import numbers
import os
import pickle
import sys
import uuid
from pathlib import Path

import torch

__all__ = ["fix_synaptic_intelligence_on_cpu", "fix_checkpoint_pickling", "fix_replaced_model_optimizer",
           "fix_text_loggers", "fix_wandb_logger", "save_checkpoint"]


@torch.no_grad()
def _extract_weights_copy(model, target, excluded_parameters):
    from avalanche.training.plugins import SynapticIntelligencePlugin

    for name, param in SynapticIntelligencePlugin.allowed_parameters(model, excluded_parameters):
        target[name].data = param.detach().cpu().flatten().clone()


def fix_synaptic_intelligence_on_cpu() -> None:
    """Make ``SynapticIntelligencePlugin`` store weight copies (idempotent, process-wide).

    Call once before building SI strategies. Harmless on CUDA (``.cpu()`` already copies there).
    """
    from avalanche.training.plugins import SynapticIntelligencePlugin

    SynapticIntelligencePlugin.extract_weights = staticmethod(_extract_weights_copy)


def model_replaced(strategy) -> bool:
    """Whether ``strategy.model``'s parameters are not (by identity and name) the ones its optimizer
    was last pointed at (``strategy.optimized_param_id``); False before the first ``make_optimizer``."""
    optimized = getattr(strategy, "optimized_param_id", None)
    if optimized is None:
        return False
    current = dict(strategy.model.named_parameters())
    return current.keys() != optimized.keys() or any(current[n] is not p for n, p in optimized.items())


def _check_model_and_optimizer_following(self, reset_optimizer_state=False, **kwargs):
    _check_model_and_optimizer_following.original(self, reset_optimizer_state=reset_optimizer_state, **kwargs)
    if model_replaced(self):  # replaced off a boundary (online GDumb): what the boundary would have done
        self.make_optimizer(reset_optimizer_state=reset_optimizer_state, **kwargs)


def fix_replaced_model_optimizer() -> None:
    """Make the optimizer follow a model the strategy replaced between two sub-experiences of an
    online stream with ``access_task_boundaries=True`` (idempotent, process-wide; module docstring).

    Needed by online GDumb (its fresh model of every sub-experience but an original experience's
    first is otherwise never optimized); a no-op for strategies that keep their model and on
    ordinary streams (every experience is a boundary there). Call before training.

    Example::

        from avalanche_plugins import fix_replaced_model_optimizer

        fix_replaced_model_optimizer()
        strategy = GDumb(model=model, optimizer=SGD(model.parameters(), lr=0.1), ...)
        for sub in split_online_stream(benchmark.train_stream, 10, access_task_boundaries=True):
            strategy.train(sub)
    """
    from avalanche.training.templates.observation_type.batch_observation import BatchObservation

    if BatchObservation.check_model_and_optimizer is not _check_model_and_optimizer_following:
        _check_model_and_optimizer_following.original = BatchObservation.check_model_and_optimizer
        BatchObservation.check_model_and_optimizer = _check_model_and_optimizer_following


def fix_checkpoint_pickling() -> None:
    """Let ``dill`` (Avalanche's checkpoint pickler) find torch optimizers by reference (idempotent)."""
    import torch.optim

    for name, module in list(sys.modules.items()):
        parts = name.split(".")
        if len(parts) == 3 and name.startswith("torch.optim.") and not hasattr(torch.optim, parts[2]):
            setattr(torch.optim, parts[2], module)


def _checkpoint_pickling_fixed() -> bool:
    """Whether every loaded ``torch.optim`` submodule is reachable as an attribute (dill needs it)."""
    import torch.optim

    return all(hasattr(torch.optim, name.split(".")[2]) for name in list(sys.modules)
               if name.startswith("torch.optim.") and name.count(".") == 2)


def save_checkpoint(strategy, fname, exclude=None) -> None:
    """Avalanche's ``save_checkpoint(strategy, fname, exclude)``, atomic and with a clear error.

    The checkpoint is written to a temporary file in ``fname``'s folder and renamed over ``fname``
    once complete, so ``fname`` is always either the previous checkpoint or the new one, never a
    partial file. When the strategy cannot be pickled, the temporary file is removed and a
    ``pickle.PicklingError`` names the fix: ``fix_checkpoint_pickling()`` if it has not been called
    in this process (torch 2.14 optimizers cannot be pickled by dill without it), else the attribute
    to leave out with ``exclude=`` or to make picklable. Other errors (e.g. a full disk) propagate
    unchanged, also without leaving a partial file. Load with Avalanche's ``maybe_load_checkpoint``.

    Example::

        from avalanche.checkpointing import maybe_load_checkpoint
        from avalanche_plugins import fix_checkpoint_pickling, save_checkpoint

        fix_checkpoint_pickling()
        strategy, start = maybe_load_checkpoint(strategy, "ckpt.pkl")
        for experience in benchmark.train_stream[start:]:
            strategy.train(experience)
            save_checkpoint(strategy, "ckpt.pkl")
    """
    from avalanche.checkpointing import save_checkpoint as avalanche_save_checkpoint

    if not isinstance(fname, (str, os.PathLike)):
        raise TypeError(f"fname: expected a file path, got {type(fname).__name__}")
    target = Path(fname)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        avalanche_save_checkpoint(strategy, temporary, exclude)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if not isinstance(error, (pickle.PicklingError, TypeError, AttributeError, RecursionError)):
            raise
        kept = "the previous checkpoint is unchanged" if target.exists() else "no file was written"
        if not _checkpoint_pickling_fixed():
            fix = ("call avalanche_plugins.fix_checkpoint_pickling() once in this process before saving: "
                   "torch 2.14 optimizers cannot be pickled by dill (Avalanche's checkpoint pickler) without it")
        else:
            fix = ("fix_checkpoint_pickling() is applied, so an attribute of the strategy (a plugin, a logger, "
                   "the model) holds something dill cannot pickle: leave it out with "
                   "save_checkpoint(..., exclude=[name]) or give its class __getstate__/__setstate__")
        raise pickle.PicklingError(f"save_checkpoint: cannot pickle the strategy for {target} "
                                   f"({type(error).__name__}: {error}); {fix}. {kept.capitalize()}.") from error
    os.replace(temporary, target)


# --------------------------------------------------------------------------------------------
# W&B


def _generate_run_id(wandb) -> str:
    generate = getattr(wandb.util, "generate_id", None)  # wandb < 0.19
    if generate is None:
        try:
            from wandb.sdk.lib.runid import generate_id as generate
        except ImportError:  # a later move: any short unique id will do
            return uuid.uuid4().hex[:8]
    return generate()


def _wandb_before_run(self):
    if self.wandb is None:
        self.import_wandb()
    if self.init_kwargs is None:
        self.init_kwargs = {}
    run_id = self.init_kwargs.get("id") or os.environ.get("WANDB_RUN_ID") or _generate_run_id(self.wandb)
    self.init_kwargs["id"] = run_id
    self.wandb.init(**self.init_kwargs)
    label = getattr(self.wandb.run, "_label", None)
    if label is not None:
        label(repo="Avalanche")


def _wandb_payload(wandb, value):
    """What ``wandb.log`` gets for a metric value, or None for types the logger skips."""
    from avalanche.evaluation.metric_results import AlternativeValues, TensorImage
    from matplotlib.figure import Figure
    from PIL.Image import Image

    from avalanche_plugins._avalanche.figures import as_image

    chart = getattr(getattr(wandb, "plot", None), "CustomChart", None)
    if isinstance(value, AlternativeValues):
        value = value.best_supported_value(Image, torch.Tensor, TensorImage, Figure, numbers.Real,
                                           *(() if chart is None else (chart,)))
    if chart is not None and isinstance(value, chart):
        return value
    if isinstance(value, numbers.Real):  # numpy scalars too
        return value.item() if hasattr(value, "item") else value
    if isinstance(value, torch.Tensor):
        import numpy as np

        return wandb.Histogram(np_histogram=np.histogram(value.detach().cpu().flatten().numpy()))
    image = as_image(value)  # figures as PNG images: no plotly
    return None if image is None else wandb.Image(image)


def _wandb_log_single_metric(self, name, value, x_plot):
    self.step = x_plot
    if name.startswith("WeightCheckpoint"):
        if self.log_artifacts:
            self._log_checkpoint(name, value, x_plot)
        return
    payload = _wandb_payload(self.wandb, value)
    if payload is not None:
        self.wandb.log({name: payload}, step=self.step)


def _wandb_after_training_exp(self, strategy, metric_values, **kwargs):
    # EvaluationPlugin has already passed metric_values to log_metrics; log only the counter.
    self.wandb.log({"TrainingExperience": self.exp_count}, step=self.step)
    self.exp_count += 1


def fix_wandb_logger() -> None:
    """Make Avalanche 0.6's ``WandBLogger`` work with wandb >= 0.19 (idempotent, process-wide;
    module docstring). Call before creating the logger; offline runs need ``WANDB_MODE=offline``
    (or ``params={"mode": "offline"}``), and ``wandb.finish()`` ends the run.

    Example::

        import os
        from avalanche.logging import WandBLogger
        from avalanche_plugins import fix_wandb_logger

        os.environ.setdefault("WANDB_MODE", "offline")
        fix_wandb_logger()
        evaluator = EvaluationPlugin(..., loggers=[WandBLogger(project_name="study", dir="runs")])
    """
    from avalanche.logging import WandBLogger

    WandBLogger.before_run = _wandb_before_run
    WandBLogger.log_single_metric = _wandb_log_single_metric
    WandBLogger.after_training_exp = _wandb_after_training_exp


# --------------------------------------------------------------------------------------------
# Text / Interactive


def _print_training_values(self, strategy, header: str) -> None:
    """Print and clear the values buffered since the last printout (nothing when none are)."""
    if not self.metric_vals:
        return
    print(header, file=self.file)
    self.print_current_metrics()
    self.metric_vals = {}


def _training_exp_header(strategy) -> str:
    from avalanche.evaluation.metric_utils import phase_and_task, stream_type

    task = phase_and_task(strategy)[1]
    task = "" if task is None else f" (Task {task})"
    return (f"> Training on experience {strategy.experience.current_experience}{task} "
            f"from {stream_type(strategy.experience)} stream ended.")


def _text_after_training_exp(self, strategy, metric_values, **kwargs):
    _print_training_values(self, strategy, _training_exp_header(strategy))


def _text_after_training(self, strategy, metric_values, **kwargs):
    _text_after_training.original(self, strategy, metric_values, **kwargs)
    _print_training_values(self, strategy, "> Values emitted at the end of training:")


def _interactive_after_training_exp(self, strategy, metric_values, **kwargs):
    from avalanche.benchmarks.scenarios import OnlineCLExperience

    if isinstance(strategy.experience, OnlineCLExperience):  # the original prints at the last sub-experience
        _interactive_after_training_exp.original(self, strategy, metric_values, **kwargs)
    else:
        _text_after_training_exp(self, strategy, metric_values, **kwargs)


def fix_text_loggers() -> None:
    """Make ``TextLogger`` and ``InteractiveLogger`` print each training experience's values under
    that experience, the last one included (idempotent, process-wide; module docstring).

    Example::

        from avalanche_plugins import fix_text_loggers

        fix_text_loggers()
        evaluator = EvaluationPlugin(..., loggers=[InteractiveLogger(), TextLogger(open("log.txt", "w"))])
    """
    from avalanche.logging import InteractiveLogger, TextLogger

    if TextLogger.after_training is not _text_after_training:
        _text_after_training.original = TextLogger.after_training
        TextLogger.after_training = _text_after_training
    TextLogger.after_training_exp = _text_after_training_exp
    if InteractiveLogger.after_training_exp is not _interactive_after_training_exp:
        _interactive_after_training_exp.original = InteractiveLogger.after_training_exp
        InteractiveLogger.after_training_exp = _interactive_after_training_exp
