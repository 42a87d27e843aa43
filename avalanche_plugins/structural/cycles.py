"""Edit cycles of Grow / Prune: counting training epochs into cycles, and the trajectory-average
accuracy over the cycles (plain Python; shared by the plugins and the metrics).
"""

from __future__ import annotations

from avalanche_plugins.core.checks import check_choice, check_int

__all__ = ["CYCLE_SCOPES", "CycleClock", "trajectory_average"]


CYCLE_SCOPES = ("stream", "experience")



class CycleClock:
    """Counts training epochs into edit cycles (module docstring).

    Example:
        >>> clock = CycleClock(epochs_per_cycle=2, scope="stream")
        >>> events = []
        >>> for epoch in range(5):
        ...     events.append((clock.edit_due(), clock.end_epoch()))
        >>> events  # (edit at the start of the epoch, cycle ends after it)
        [(False, False), (False, True), (True, False), (False, True), (True, False)]
    """

    def __init__(self, epochs_per_cycle: int, scope: str = "stream"):
        check_int("epochs_per_cycle", epochs_per_cycle)
        check_choice("cycle_scope", scope, CYCLE_SCOPES)
        self.epochs_per_cycle, self.scope = epochs_per_cycle, scope
        self.epoch = 0  # epochs done in the current scope
        self.cycle = 0  # cycles completed (all scopes)

    def start_experience(self) -> None:
        if self.scope == "experience":
            self.epoch = 0

    def edit_due(self) -> bool:
        """True at the start of the first epoch of every cycle but the first."""
        return self.epoch > 0 and self.epoch % self.epochs_per_cycle == 0

    def end_epoch(self) -> bool:
        """Count one epoch; True if it completed a cycle."""
        self.epoch += 1
        ended = self.epoch % self.epochs_per_cycle == 0
        self.cycle += int(ended)
        return ended


def trajectory_average(accuracies) -> float:
    """TAA: the mean of the accuracies evaluated along the trajectory.

    Example:
        >>> round(trajectory_average([0.5, 0.7, 0.9]), 6)
        0.7
    """
    values = [float(a) for a in accuracies]
    if not values:
        raise ValueError("accuracies is empty: TAA needs at least one evaluation")
    return sum(values) / len(values)
