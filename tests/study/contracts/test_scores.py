"""``contracts.scores``: average forgetting counts only after learning."""

from __future__ import annotations

import pytest
import torch

from avalanche_plugins.study.contracts.scores import average_forgetting


def test_forgetting_counts_only_after_learning():
    acc = torch.tensor([[0.9, 0.05], [0.4, 0.95]]).numpy()
    assert average_forgetting(acc) == pytest.approx(0.5)
