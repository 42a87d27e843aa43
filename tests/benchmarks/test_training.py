"""``benchmarks._training``: minibatch training and the accuracies."""

import torch
from torch import nn

from benchmarks._training import accuracy, batched_accuracy, train_minibatches


def test_train_minibatches_counts_its_steps():
    steps = train_minibatches(nn.Linear(3, 2), torch.randn(10, 3), torch.randint(0, 2, (10,)), epochs=2, lr=0.1,
                              batch_size=4, generator=torch.Generator().manual_seed(0), optimizer="sgd")
    assert steps == 6


def test_accuracy_of_logits_and_over_chunks():
    assert accuracy(torch.tensor([[2.0, 1.0], [0.0, 1.0]]), torch.tensor([0, 0])) == 0.5
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    assert batched_accuracy(lambda a: a, x, targets=torch.tensor([0, 1, 1]), batch_size=2) == 2 / 3
