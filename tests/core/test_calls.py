"""``core.calls``: task batches of multi-task and plain models."""

from __future__ import annotations

import torch
from torch import nn

from avalanche_plugins.core.calls import task_batches


class _TwoHeads(nn.Module):
    """Duck-typed multi-task model (``forward_single_task``): no avalanche import needed."""

    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(2, 1), nn.Linear(2, 1)])

    def forward_single_task(self, x, task_label):
        return self.heads[task_label](x)

    def forward(self, x, task_label):
        return self.forward_single_task(x, task_label)


def test_task_batches_cover_every_sample_once_with_its_own_label_and_share():
    x = torch.arange(14.0).reshape(7, 2)
    y = torch.arange(7)
    t = torch.tensor([1, 0, 1, 1, 0, 1, 1])
    chunks = list(task_batches(_TwoHeads(), x, y, t, chunk_size=2))
    # task 0: samples 1, 4 (one chunk); task 1: samples 0, 2, 3, 5, 6 (chunks of 2, 2, 1)
    assert [(label, ys.tolist()) for label, _, ys, _ in chunks] == [(0, [1, 4]), (1, [0, 2]), (1, [3, 5]), (1, [6])]
    for label, xs, ys, weight in chunks:
        assert torch.equal(xs, x[ys]) and bool((t[ys] == label).all())
        assert weight == len(ys) / 7
    assert sum(w for *_, w in chunks) == 1.0


def test_task_batches_of_a_plain_model_is_one_group_in_order_and_targets_may_be_absent():
    x = torch.randn(5, 2)
    chunks = list(task_batches(nn.Linear(2, 1), x, task_labels=torch.tensor([0, 1, 0, 1, 0])))
    assert len(chunks) == 1
    label, xs, ys, weight = chunks[0]
    assert label is None and ys is None and weight == 1.0 and torch.equal(xs, x)


def test_task_batches_reuse_precomputed_groups():
    x, y = torch.randn(4, 2), torch.arange(4)
    groups = [(3, torch.tensor([2, 0]))]
    assert [(label, ys.tolist(), w) for label, _, ys, w in task_batches(nn.Linear(2, 1), x, y, groups=groups)] \
        == [(3, [2, 0], 0.5)]
