"""Task-incremental accuracy from a class-incremental run (Mammoth's Task-IL column).

With one shared head, class-incremental accuracy takes the argmax over every class; the
task-incremental accuracy of the same predictions masks the logits to the classes of the
evaluated experience first (the task identity is given at test time):

    acc_TIL(j) = mean_{(x, y) in exp_j} [ argmax_{c in C_j} f(x)_c == y ]

Logged as ``Top1_TaskIL_Acc_Exp/eval_phase/<stream>/TaskNNN/ExpNNN`` after each evaluated
experience, so a study reads a second accuracy matrix ``R_TIL[i, j]`` from the same run (the
study runner attaches it to every run whose experiences have disjoint classes and one shared head).

Under Avalanche's distributed training each rank evaluates its share of the experience: the counts
are summed over the ranks (the ``DistributedSampler``'s repeats left out), so every rank logs the
accuracy over the whole experience.
"""

from __future__ import annotations

import torch
from avalanche.evaluation import PluginMetric
from avalanche.evaluation.metric_results import MetricValue
from avalanche.evaluation.metric_utils import get_metric_name

from avalanche_plugins._avalanche.distributed import check_distributed, shared_samples
from avalanche_plugins.core.parallel import sum_over_ranks

__all__ = ["TaskILAccuracyMetric"]


class TaskILAccuracyMetric(PluginMetric[float]):
    """Accuracy with logits masked to the evaluated experience's classes (module docstring).

    Example:
        >>> metric = TaskILAccuracyMetric()
        >>> metric.update(torch.tensor([[5.0, 1.0, 2.0], [0.0, 3.0, 1.0]]), torch.tensor([2, 1]), [1, 2])
        >>> metric.result()
        1.0
    """

    supports_distributed = True  # the ranks' counts summed (module docstring)

    def __init__(self):
        super().__init__()
        self.correct = self.total = 0
        self._seen = 0

    def reset(self) -> None:
        self.correct = self.total = 0

    def result(self) -> float | None:
        return self.correct / self.total if self.total else None

    def update(self, logits: torch.Tensor, targets: torch.Tensor, classes) -> None:
        mask = torch.full((logits.shape[1],), float("-inf"), device=logits.device)
        mask[torch.as_tensor(sorted(classes), device=logits.device)] = 0.0
        predictions = (logits.detach() + mask).argmax(1)
        self.correct += int((predictions == targets).sum())
        self.total += int(targets.numel())

    def __str__(self) -> str:
        return "Top1_TaskIL_Acc_Exp"

    def before_training(self, strategy) -> None:
        check_distributed(self, strategy)

    def before_eval(self, strategy) -> None:
        check_distributed(self, strategy)

    def before_eval_exp(self, strategy) -> None:
        self.reset()
        self._seen = 0

    def after_eval_iteration(self, strategy) -> None:
        classes = strategy.experience.classes_in_this_experience
        own = shared_samples(strategy, self._seen, len(strategy.mb_y))  # all True in one process
        self._seen += len(strategy.mb_y)
        self.update(strategy.mb_output[own.to(strategy.mb_output.device)], strategy.mb_y[own.to(strategy.mb_y.device)],
                    classes)

    def after_eval_exp(self, strategy):
        self.correct, self.total = sum_over_ranks([self.correct, self.total])
        value = self.result()
        if value is None:
            return None
        name = get_metric_name(self, strategy, add_experience=True, add_task=True)
        return [MetricValue(self, name, value, strategy.clock.train_iterations)]
