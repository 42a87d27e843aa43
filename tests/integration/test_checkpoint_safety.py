"""Checkpoint safety: the tidy CSV across an Avalanche checkpoint/resume in a fresh process, and
``save_checkpoint`` failing cleanly (an error naming the fix, no partial file).

The resume test runs this file as a script (one fresh Python process per run): ``straight`` trains
three Split-digits experiences with a checkpoint after each; ``interrupted`` does the same but the
process dies (``os._exit``) in the middle of the third experience, after some of its rows reached
the CSV; ``resume`` is the restarted process: it builds the same strategy and logger, as
Avalanche's ``examples/checkpointing.py`` does, loads the checkpoint and trains the rest.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO_ROOT

ROOT = REPO_ROOT
N_EXPERIENCES = 3
DIE_AT = (2, 4)  # (experience, training iteration) where the interrupted run dies


def _run(out: Path) -> None:
    """One process of the resume test (``python tests/integration/test_checkpoint_safety.py MODE OUT``)."""
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    from avalanche.checkpointing import maybe_load_checkpoint, save_checkpoint
    from avalanche.core import SupervisedPlugin
    from avalanche.evaluation.metrics import accuracy_metrics, loss_metrics
    from avalanche.training.plugins import EvaluationPlugin
    from avalanche.training.supervised import Naive
    from torch import nn

    from avalanche_plugins import LayerSensitivityMetric, TidyCSVLogger, fix_checkpoint_pickling
    from tests.cases import build_model
    from tests.fixtures import digits_stream

    class DieAt(SupervisedPlugin):
        def after_training_iteration(self, strategy, **kwargs):
            # restored with the checkpoint, so the mode comes from the process, not the plugin
            if os.environ["CHECKPOINT_TEST_MODE"] == "interrupted" and (strategy.experience.current_experience,
                                          strategy.clock.train_epoch_iterations) == DIE_AT:
                os._exit(17)  # no cleanup, no flush: a killed process

    mode = os.environ["CHECKPOINT_TEST_MODE"]
    fix_checkpoint_pickling()
    torch.manual_seed(0)
    stream = digits_stream()
    model = build_model("mlp", stream.input_shape, stream.n_classes, hidden=(32, 16))
    tidy = TidyCSVLogger(out / "metrics.csv", context={"seed": 0})  # a fresh logger, append=False
    evaluator = EvaluationPlugin(accuracy_metrics(experience=True, stream=True), loss_metrics(minibatch=True),
                                 LayerSensitivityMetric(n_samples=32), loggers=[tidy])
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                     criterion=nn.CrossEntropyLoss(), train_mb_size=32, train_epochs=1, eval_mb_size=256,
                     evaluator=evaluator, plugins=[DieAt()])
    checkpoint = out / "checkpoint.pkl"
    strategy, start = maybe_load_checkpoint(strategy, checkpoint) if mode == "resume" else (strategy, 0)
    assert start == (2 if mode == "resume" else 0), start
    for experience in stream.benchmark.train_stream[start:N_EXPERIENCES]:
        strategy.train(experience)
        strategy.eval(stream.benchmark.test_stream[:N_EXPERIENCES])
        save_checkpoint(strategy, checkpoint)
    tidy.close()  # after a resume this is the orphaned fresh logger: it wrote nothing and must not truncate
    strategy.evaluator.loggers[0].close()


def _process(mode: str, out: Path) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CHECKPOINT_TEST_MODE": mode}
    done = subprocess.run([sys.executable, __file__, mode, str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    if done.returncode not in (0, 17):
        raise AssertionError(f"{mode} run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.returncode


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_tidy_csv_resumed_in_a_fresh_process_equals_the_uninterrupted_run(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert _process("straight", straight) == 0
    assert _process("interrupted", resumed) == 17
    written = _rows(resumed / "metrics.csv")
    # the dead process left rows of the third experience after the last checkpoint
    assert any(r["training_experience"] == "2" for r in written)
    assert _process("resume", resumed) == 0

    expected, got = _rows(straight / "metrics.csv"), _rows(resumed / "metrics.csv")
    assert {r["training_experience"] for r in got} == {"0", "1", "2"}
    assert len(got) == len(expected) > 40
    assert got == expected  # every row once, in order, same values, same image file names
    images = sorted(p.name for p in (resumed / "metrics_images").iterdir())
    assert images == sorted(p.name for p in (straight / "metrics_images").iterdir())
    assert images == sorted(Path(r["file"]).name for r in got if r["file"])


# --------------------------------------------------------------------------------------------
# save_checkpoint


def _small_strategy(plugins=()):
    import torch
    from avalanche.training.supervised import Naive
    from torch import nn

    from tests.cases import build_model
    from tests.fixtures import evaluator

    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10, hidden=(8,))
    return Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), criterion=nn.CrossEntropyLoss(),
                 evaluator=evaluator(), plugins=list(plugins))


def _unfix_pickling(monkeypatch):
    """Undo ``fix_checkpoint_pickling`` (process-wide, maybe applied by an earlier test) for one test."""
    import torch.optim

    for name in list(sys.modules):
        if name.startswith("torch.optim.") and name.count(".") == 2:
            monkeypatch.delattr(torch.optim, name.split(".")[2], raising=False)


def test_save_checkpoint_without_the_pickling_fix_names_it_and_leaves_no_file(tmp_path, monkeypatch):
    import pickle

    from avalanche_plugins import fix_checkpoint_pickling, save_checkpoint

    _unfix_pickling(monkeypatch)
    strategy, target = _small_strategy(), tmp_path / "ckpt.pkl"
    with pytest.raises(pickle.PicklingError, match=r"call avalanche_plugins\.fix_checkpoint_pickling\(\).*"
                                                   r"No file was written"):
        save_checkpoint(strategy, target)
    assert list(tmp_path.iterdir()) == []  # neither the target nor a temporary file

    fix_checkpoint_pickling()
    save_checkpoint(strategy, target)  # now it saves
    good = target.read_bytes()
    _unfix_pickling(monkeypatch)
    with pytest.raises(pickle.PicklingError, match="previous checkpoint is unchanged"):
        save_checkpoint(strategy, target)
    assert target.read_bytes() == good and list(tmp_path.iterdir()) == [target]


def test_save_checkpoint_names_exclude_when_an_attribute_cannot_be_pickled(tmp_path):
    import pickle

    from avalanche.checkpointing import maybe_load_checkpoint
    from avalanche.core import SupervisedPlugin

    from avalanche_plugins import fix_checkpoint_pickling, save_checkpoint

    class Unpicklable(SupervisedPlugin):
        def __init__(self):
            super().__init__()
            self.pending = (i for i in range(3))  # generators cannot be pickled, even by dill

    fix_checkpoint_pickling()
    with pytest.raises(pickle.PicklingError, match=r"fix_checkpoint_pickling\(\) is applied.*exclude="):
        save_checkpoint(_small_strategy([Unpicklable()]), tmp_path / "ckpt.pkl")
    assert list(tmp_path.iterdir()) == []
    save_checkpoint(_small_strategy(), tmp_path / "ckpt.pkl")
    _, start = maybe_load_checkpoint(_small_strategy(), tmp_path / "ckpt.pkl")  # a normal Avalanche checkpoint
    assert start == 0 and list(tmp_path.iterdir()) == [tmp_path / "ckpt.pkl"]


if __name__ == "__main__":
    _run(Path(sys.argv[2]))
