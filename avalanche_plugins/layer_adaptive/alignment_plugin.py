"""``ClassifierAlignmentPlugin``: SLCA's classifier alignment as an Avalanche plugin.

With ``LayerAdaptiveLRPlugin(schedule="slca")`` (the slow learner) it makes full SLCA (Zhang et al.,
ICCV 2023); beside ``LayerAdaptiveLRPlugin(schedule="geometric")`` it makes the depth-weighted SLCA
of "Layers Matter". The math is :mod:`avalanche_plugins.layer_adaptive.alignment`; this adapter reads
the head's input features of the experience just trained, keeps each class's Gaussian and re-trains
the head at ``after_training_exp``, before Avalanche's evaluation of that experience.

On an online stream (``split_online_stream``) it acts once per original experience, after its last
sub-experience, on the original experience's data; that changes training at a boundary, so it needs
``access_task_boundaries=True`` and refuses before training without it
(:mod:`avalanche_plugins._avalanche.boundaries`), as it refuses ``JointTraining`` and task-agnostic
streams.
"""

from __future__ import annotations

import time
import warnings

import torch
from avalanche.core import SupervisedPlugin
from torch import nn

from avalanche_plugins._avalanche.boundaries import at_experience_end, enter_boundary
from avalanche_plugins._avalanche.data import experience_batches
from avalanche_plugins.core.calls import eval_mode, is_multitask, model_forward
from avalanche_plugins.core.checks import check_int, check_positive
from avalanche_plugins.core.parallel import unwrap_model
from avalanche_plugins.layer_adaptive.alignment import ClassStatistics, align_head, class_statistics

__all__ = ["ClassifierAlignmentPlugin"]


def _last_linear(model: nn.Module) -> str | None:
    names = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    return names[-1] if names else None


class ClassifierAlignmentPlugin(SupervisedPlugin):
    """Re-train the classifier head after every experience on features sampled from per-class
    Gaussians (SLCA's classifier alignment; formula in :mod:`~avalanche_plugins.layer_adaptive.alignment`).

    :param head: name of the head module (an ``nn.Linear`` whose input are the features); default
        None: the model's last ``nn.Linear``. Refused before training when missing or not linear.
    :param n_per_class: features sampled per seen class (SLCA: 256).
    :param epochs, lr, momentum, batch_size: the head's SGD re-training (SLCA: 5 epochs, lr 0.01).
    :param temperature: logit normalisation ``τ`` (SLCA: 0.1); None: plain cross-entropy.
    :param ridge: relative ridge added to every class covariance (a few hundred samples of a wide
        feature give a singular one).
    :param seed: seeds the sampling and the minibatch order (the ``e``-th experience trained uses ``seed + e``).

    ``history[i]``: ``experience``, ``classes`` (the classes whose statistics it measured),
    ``seen`` (all classes aligned), ``losses`` (mean loss per epoch) and ``seconds``; a head whose
    parameters a strategy froze (LFL after its first experience) is left alone with a warning
    (``skipped: "frozen head"``, no losses).

    Example::

        strategy = Naive(model, SGD(model.parameters(), lr=0.01, momentum=0.9), criterion,
                         plugins=[LayerAdaptiveLRPlugin("slca"), ClassifierAlignmentPlugin()])  # full SLCA
    """

    def __init__(self, head: str | None = None, *, n_per_class: int = 256, epochs: int = 5, lr: float = 0.01,
                 momentum: float = 0.9, batch_size: int = 64, temperature: float | None = 0.1,
                 ridge: float = 1e-4, seed: int = 0):
        super().__init__()
        check_int("n_per_class", n_per_class)
        check_int("epochs", epochs)
        check_int("batch_size", batch_size)
        check_positive("lr", lr)
        check_positive("momentum", momentum, allow_zero=True)
        check_positive("ridge", ridge, allow_zero=True)
        if temperature is not None:
            check_positive("temperature", temperature)
        self.head, self.n_per_class, self.epochs, self.lr = head, n_per_class, epochs, lr
        self.momentum, self.batch_size, self.temperature, self.ridge, self.seed = momentum, batch_size, temperature, ridge, seed
        self.statistics: ClassStatistics | None = None
        self.history: list[dict] = []

    def _head_module(self, model: nn.Module) -> nn.Linear:
        name = self.head if self.head is not None else _last_linear(model)
        where = "ClassifierAlignmentPlugin"
        if name is None:
            raise ValueError(f"{where}: the model has no nn.Linear to align; pass head='<module name>'")
        try:
            module = model.get_submodule(name)
        except AttributeError:
            raise ValueError(f"{where}: head={name!r} is not a module of the model") from None
        if not isinstance(module, nn.Linear):
            raise ValueError(f"{where}: head={name!r} is a {type(module).__name__}, not an nn.Linear: "
                             "classifier alignment re-trains a linear head on its input features")
        return module

    def before_training_exp(self, strategy, *args, **kwargs):
        """Refuse an unsupported strategy, model or stream before any training: ICaRL (a
        nearest-mean classifier), a multi-task model, no linear head, a stream without the original
        experiences' boundaries."""
        from avalanche.training.supervised import ICaRL

        if isinstance(strategy, ICaRL):
            raise ValueError("ClassifierAlignmentPlugin: ICaRL classifies by the nearest class mean of its exemplars, "
                             "not by a linear head; classifier alignment has nothing to re-train there")
        enter_boundary(self, strategy, needs_access=True,
                       needs="re-trains the head on every class's features at the end of every original experience")
        model = unwrap_model(strategy.model)
        if is_multitask(model):
            raise ValueError("ClassifierAlignmentPlugin: a multi-task (multi-head) model has no one class-incremental "
                             "head to align; use a single-head model")
        self._head_module(model)

    def _features(self, strategy, head: nn.Module):
        """The head's input features and the labels of the experience's training data (eval mode,
        evaluation transforms, no gradient)."""
        captured = []
        handle = head.register_forward_hook(lambda module, inputs, output: captured.append(inputs[0].detach()))
        data = strategy.experience.dataset
        data = data.eval() if hasattr(data, "eval") else data
        labels = []
        try:
            with eval_mode(strategy.model), torch.no_grad():
                for x, y, t in experience_batches(strategy, dataset=data, batch_size=strategy.eval_mb_size):
                    model_forward(strategy.model, x, torch.as_tensor(t))
                    labels.append(y)
        finally:
            handle.remove()
        return torch.cat(captured).flatten(1), torch.cat(labels)

    def after_training_exp(self, strategy, *args, **kwargs):
        at_experience_end(self, strategy, lambda boundary: self._align(strategy, boundary.index))

    def _align(self, strategy, exp_index: int) -> None:
        start = time.perf_counter()
        head = self._head_module(unwrap_model(strategy.model))
        features, labels = self._features(strategy, head)
        measured = class_statistics(features, labels, ridge=self.ridge)
        self.statistics = measured if self.statistics is None else self.statistics.merged(measured)
        exp_id = int(strategy.experience.current_experience)
        frozen = not any(p.requires_grad for p in head.parameters())
        if frozen:
            # a strategy froze the head (LFL after its first experience): re-training it would undo
            # that strategy's choice, so the statistics are kept and the head is left alone
            warnings.warn(f"ClassifierAlignmentPlugin: the head's parameters are frozen (requires_grad=False) after "
                          f"experience {exp_id}; its alignment is skipped (history[-1]['skipped'])", stacklevel=2)
        losses = [] if frozen else align_head(
            head, self.statistics, n_per_class=self.n_per_class, epochs=self.epochs, lr=self.lr, momentum=self.momentum,
            batch_size=self.batch_size, temperature=self.temperature, seed=self.seed + exp_index)
        self.history.append({"experience": exp_id, "classes": measured.classes.tolist(),
                             "seen": self.statistics.classes.tolist(), "losses": losses,
                             **({"skipped": "frozen head"} if frozen else {}), "seconds": time.perf_counter() - start})
