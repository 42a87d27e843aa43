"""The study's divergence and callback messages on an online stream name the original experience and
the sub-experience within it (issue 31).

The stream of :mod:`tests.structural.test_cycles`: two experiences of 40 digits images, streamed as
sub-experiences of 10 (4 per experience: stream sub-experiences 0-3 are experience 0, 4-7
experience 1). A plugin poisons one weight with NaN before a chosen sub-experience, so the first
forward pass of that sub-experience gives a non-finite output.
"""

from __future__ import annotations

import re

import pytest
import torch
from avalanche.core import SupervisedPlugin

from avalanche_plugins.study.run.watch import (
    CallbackFailed,
    Diverged,
    DivergenceWatch,
    time_callbacks,
)
from tests.structural.test_cycles import four_class_digits, naive, online_stream


class Poison(SupervisedPlugin):
    """Sets a weight to NaN before the ``at``-th experience given to ``train`` (counted from 0)."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at

    def before_training_exp(self, strategy, **kwargs):
        if strategy.clock.train_exp_counter == self.at:
            with torch.no_grad():
                strategy.model[1].weight[0, 0] = float("nan")


class Boom(SupervisedPlugin):
    def after_training_exp(self, strategy, **kwargs):
        if strategy.clock.train_exp_counter == 5:  # after the 6th sub-experience
            raise ValueError("boom")


def train(experiences, plugins):
    strategy = naive(plugins)
    for experience in experiences:
        strategy.train(experience, num_workers=0)
    return strategy


def test_divergence_on_an_online_stream_names_the_original_experience_and_the_sub_experience():
    with pytest.raises(Diverged) as caught:
        train(online_stream(), [DivergenceWatch(), Poison(at=6)])
    # the 7th sub-experience given to train (stream sub-experience 6) is the third of experience 1
    assert str(caught.value) == ("diverged at experience 1 (sub-experience 2 of 0..3, stream sub-experience 6), "
                                 "epoch 0, iteration 0 (model output = nan)")


def test_divergence_on_an_ordinary_stream_keeps_its_message():
    with pytest.raises(Diverged) as caught:
        train(four_class_digits().train_stream, [DivergenceWatch(), Poison(at=1)])
    assert str(caught.value) == "diverged at experience 1, epoch 0, iteration 0 (model output = nan)"


def test_divergence_in_evaluation_after_an_online_experience_names_what_was_trained():
    strategy = train(online_stream()[:4], [DivergenceWatch()])
    with torch.no_grad():
        strategy.model[1].weight[0, 0] = float("nan")
    with pytest.raises(Diverged, match=re.escape(
            "evaluation of experience 0 after training experience 0 (sub-experience 3 of 0..3, "
            "stream sub-experience 3) (model output = nan)")):
        strategy.eval(four_class_digits().test_stream[:1], num_workers=0)


def test_a_callback_failure_on_an_online_stream_names_the_original_experience():
    boom = Boom()
    time_callbacks([boom], {})
    with pytest.raises(CallbackFailed) as caught:
        train(online_stream(), [DivergenceWatch(), boom])
    assert str(caught.value) == "Boom.after_training_exp at experience 1: ValueError: boom"
