"""``structural.interventions``: what Grow does to its newborn units."""

from __future__ import annotations

import torch
from torch import nn


def test_grow_leaves_the_default_interventions_alone_and_treats_its_newborns_with_its_own():
    from avalanche_plugins.structural import Interventions, UnitMasks

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 10), nn.ReLU(), nn.Linear(10, 2))
    masks = UnitMasks(net, torch.randn(2, 3))
    masks.set_masks({"0": torch.arange(10) < 5})
    default = masks.interventions
    assert masks.newborn_interventions is default
    iv = Interventions(newborn_lr=0.1)
    masks.grow({"0": torch.arange(10.0)}, {"0": 7}, interventions=iv)
    assert masks.interventions is default and masks.newborn_interventions is iv
