"""``avalanche-study run``'s exit status tells the truth, and a rerun retries what failed outside the
method (issue 43, "Exit codes that tell the truth"): a study whose runs failed for a reason outside the
method (here: the config's own stream factory raising in every job) exits 1 and names the cause once;
a diverged run stays a cached result; after the cause is fixed, a rerun reruns exactly the failed
rows."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from avalanche_plugins.study.cli import run_command

BROKEN = '''
def streams(seed=0, validation=False):
    raise RuntimeError("the data server is down")
'''

FIXED = '''
from avalanche_plugins.study.harness.data import make_stream


def streams(seed=0, validation=False):
    return make_stream("digits", "split", n_experiences=2, seed=seed, validation=validation)
'''


@pytest.fixture()
def study_folder(tmp_path):
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "exit_status_streams.py").write_text(BROKEN)
    config = {"name": "exit", "seeds": 2, "scenarios": [{"name": "s", "benchmark": "exit_status_streams:streams"}],
              "model": {"name": "mlp", "kwargs": {"hidden": [8]}},
              "training": {"epochs": 1, "batch_size": 64}, "strategies": ["Naive"]}
    (folder / "study.yaml").write_text(yaml.safe_dump(config))
    yield folder
    sys.modules.pop("exit_status_streams", None)


def _statuses(out):
    return [json.loads(line)["row"]["status"] for line in (out / "jobs.jsonl").read_text().splitlines()]


def test_runs_failed_outside_the_method_exit_1_naming_the_cause_once_and_rerun(study_folder, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["run", str(study_folder / "study.yaml"), "--out", str(out), "--no-progress"]
    with pytest.raises(SystemExit) as stop:
        run_command(argv)
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "2 of 2 runs failed outside the method: 2 × RuntimeError: the data server is down" in err
    assert err.count("the data server is down") == 1  # once, not once per row
    assert (out / "report.md").is_file()  # the outputs are written all the same
    assert _statuses(out) == ["error", "error"]

    (study_folder / "exit_status_streams.py").write_text(FIXED)
    sys.modules.pop("exit_status_streams", None)
    result = run_command(argv)  # exit 0: returns
    assert [r["status"] for r in result.rows] == ["ok", "ok"]
    assert _statuses(out) == ["error", "error", "ok", "ok"]  # both failed rows ran again, appended
    again = run_command(argv)
    assert _statuses(out) == ["error", "error", "ok", "ok"]  # finished rows are reused, none repeated
    assert [r["acc"] for r in again.rows] == [r["acc"] for r in result.rows]


def test_a_diverged_run_is_a_cached_result_and_fails_the_study_only_when_nothing_finished(tmp_path, capsys):
    from avalanche_plugins.study.api import failure_summary
    from avalanche_plugins.study.harness.jobs import run_jobs

    def diverge(job):
        return {"status": "diverged" if job == 1 else "ok", "error": "gradient norm = inf" if job == 1 else None}

    cache = tmp_path / "jobs.jsonl"
    rows = run_jobs(diverge, [0, 1], cache=cache, progress=False,
                    retry=lambda r: r["status"] in ("error", "callback"))
    assert failure_summary(rows) is None  # one run finished; the diverged one is the method's result
    calls = []
    run_jobs(lambda job: calls.append(job), [0, 1], cache=cache, progress=False,
             retry=lambda r: r["status"] in ("error", "callback"))
    assert calls == []  # the diverged row is cached like any result
    assert failure_summary([rows[1]]) == "none of the 1 test runs finished: 1 × gradient norm = inf"
    assert failure_summary([{"status": "callback", "error": "OR: after_training_exp: boom"}],
                           [{"status": "ok"}]).startswith("1 of 2 runs failed outside the method")


def test_workers_with_an_address_is_said_to_have_no_effect(tmp_path, capsys):
    missing = tmp_path / "no_such_study.yaml"  # the note comes before anything is read or joined
    with pytest.raises(SystemExit) as stop:
        run_command(["run", str(missing), "--executor", "ray", "--address", "HEAD:6379", "--workers", "3"])
    assert stop.value.code == 2
    assert "--workers 3 has no effect with --address" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_command(["run", str(missing), "--executor", "ray", "--address", "HEAD:6379"])
    assert "has no effect" not in capsys.readouterr().err
