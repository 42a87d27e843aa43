"""``--executor ray``: the same jobs through ``run_jobs`` on a local Ray instance give the rows the
local executor gives, run in Ray's worker processes, and resume from the same cache."""

import csv
import json
import os
import sys
from dataclasses import dataclass

import pytest
import torch

from avalanche_plugins.study import jobs
from avalanche_plugins.study.jobs import LocalExecutor, RayExecutor, run_jobs
from benchmarks._cli import benchmark_parser, make_executor, parse_args

ray = pytest.importorskip("ray")


@dataclass(frozen=True)
class Fit:
    seed: int
    width: int = 5


def fit(job: Fit) -> dict:
    """A seeded least-squares fit by SGD: the numbers depend on the seed only."""
    torch.manual_seed(job.seed)
    x = torch.randn(64, job.width)
    y = x @ torch.randn(job.width, 1) + 0.1 * torch.randn(64, 1)
    model = torch.nn.Linear(job.width, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return {"seed": job.seed, "loss": loss.item(), "weight": model.weight.detach().flatten().tolist(),
            "pid": os.getpid(), "threads": torch.get_num_threads()}


def unseeded(job: Fit) -> float:
    return torch.rand(1).item()  # the executor's global seed decides


def fails(job: Fit):
    raise ValueError(f"bad job {job.seed}")


def dies_on_seed_1(job: Fit) -> dict:
    """A worker process that dies (as under the out-of-memory killer) on seed 1's job."""
    if job.seed == 1:
        os._exit(3)
    return {"seed": job.seed, "status": "ok"}


def lost(job: Fit, cause: str) -> dict:
    return {"seed": job.seed, "status": "error", "error": cause}


JOBS = [Fit(s) for s in (3, 0, 2, 1)] + [Fit(0, width=3)]


def _numbers(rows):
    return [{k: v for k, v in r.items() if k not in ("pid", "node_ip")} for r in rows]  # where, not what


@pytest.fixture(scope="module")
def executor():
    ex = RayExecutor(num_cpus=2)
    yield ex
    ex.close()
    assert not ray.is_initialized()  # it shut down the instance it started


@pytest.mark.slow  # starting Ray here takes 20-40 s
def test_ray_rows_equal_local_rows_and_come_from_ray_workers(executor, tmp_path, monkeypatch):
    monkeypatch.setattr(jobs.cache, "code_version", lambda: "v1")
    local = run_jobs(fit, JOBS, executor=LocalExecutor(1), progress=False)
    remote = run_jobs(fit, JOBS, cache=tmp_path / "jobs.jsonl", executor=executor, progress=False)
    assert executor.started and ray.is_initialized()
    assert _numbers(remote) == _numbers(local)  # same seeds, same numbers, in job order
    assert {r["pid"] for r in remote}.isdisjoint({os.getpid()})  # ran in Ray's worker processes
    assert {r["threads"] for r in remote} == {1}
    assert [r["seed"] for r in remote] == [j.seed for j in JOBS]

    # resume: only the new job runs; cached rows come back unchanged
    more = JOBS + [Fit(7)]
    again = run_jobs(fit, more, cache=tmp_path / "jobs.jsonl", executor=executor, progress=False)
    assert again[:-1] == remote and again[-1]["seed"] == 7
    lines = [json.loads(line) for line in (tmp_path / "jobs.jsonl").read_text().splitlines()]
    assert len(lines) == len(more)
    # a cache written by Ray is reused by the local executor (keys do not depend on the backend)
    assert run_jobs(fails, more, cache=tmp_path / "jobs.jsonl", progress=False) == again


@pytest.mark.slow
def test_every_ray_task_is_seeded_and_errors_reach_the_caller(executor):
    torch.manual_seed(0)
    expected = torch.rand(1).item()
    values = run_jobs(unseeded, [Fit(s) for s in range(4)], executor=executor, progress=False)
    assert values == [expected] * 4  # each task starts from the executor's seed (0)
    with pytest.raises(ValueError, match="bad job 5"):
        run_jobs(fails, [Fit(5)], executor=executor, progress=False)


@pytest.mark.slow
def test_a_job_whose_worker_dies_becomes_a_lost_row_and_the_others_finish(executor, monkeypatch):
    # Ray retries a crashed worker's task (3 times by default), then the executor's lost_row
    # stands in for it: the other jobs' rows are kept, not lost with one ray.get error
    monkeypatch.setattr(executor, "lost_row", lost)
    rows = run_jobs(dies_on_seed_1, [Fit(0), Fit(1), Fit(2)], executor=executor, progress=False)
    assert [r["status"] for r in rows] == ["ok", "error", "ok"]
    assert rows[1]["error"].startswith("WorkerCrashedError: "), rows[1]["error"]
    monkeypatch.setattr(executor, "lost_row", None)  # without it, Ray's error reaches the caller
    with pytest.raises(ray.exceptions.WorkerCrashedError):
        run_jobs(dies_on_seed_1, [Fit(1)], executor=executor, progress=False)


def test_a_local_worker_that_dies_gives_lost_rows_not_an_error():
    pool = LocalExecutor(2, lost_row=lost)
    rows = run_jobs(dies_on_seed_1, [Fit(1), Fit(0)], executor=pool, progress=False)
    assert rows[0] == {"seed": 1, "status": "error", "error": rows[0]["error"]}
    assert rows[0]["error"].startswith("BrokenProcessPool: "), rows[0]["error"]
    assert rows[1]["status"] in ("ok", "error")  # it may have been queued behind the broken pool
    from concurrent.futures.process import BrokenProcessPool

    with pytest.raises(BrokenProcessPool):
        run_jobs(dies_on_seed_1, [Fit(1)], executor=LocalExecutor(2), progress=False)


@pytest.mark.slow
def test_an_executor_joining_a_running_ray_leaves_it_running(executor):
    executor.start()
    other = RayExecutor(num_cpus=2)
    assert [row["seed"] for _, row in other.map_unordered(fit, [Fit(4)])] == [4]
    other.close()
    assert not other.started and ray.is_initialized()


def test_cli_flags_choose_the_executor():
    parser = benchmark_parser("example", "example benchmark")
    args = parse_args(parser, [])
    assert (args.executor, args.address) == ("local", None) and isinstance(make_executor(args), LocalExecutor)
    ex = make_executor(parse_args(parser, ["--executor", "ray", "--workers", "3", "--threads", "2"]))
    assert isinstance(ex, RayExecutor) and (ex.address, ex.num_cpus, ex.threads) == (None, 6, 2)
    ex = make_executor(parse_args(parser, ["--executor", "ray", "--address", "auto", "--workers", "3"]))
    assert (ex.address, ex.num_cpus) == ("auto", None)  # a cluster brings its own CPUs
    assert not ex.started  # nothing starts before the first job
    with pytest.raises(SystemExit):
        parse_args(parser, ["--address", "auto"])  # only with --executor ray
    with pytest.raises(SystemExit):
        parse_args(parser, ["--executor", "dask"])


def test_bad_arguments_and_missing_ray_are_named(monkeypatch):
    with pytest.raises(ValueError, match="num_cpus"):
        RayExecutor(num_cpus=0)
    with pytest.raises(ValueError, match="threads"):
        RayExecutor(num_cpus=2, threads=4)
    with pytest.raises(ValueError, match="address"):
        RayExecutor(address="")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    with pytest.raises(ImportError, match=r"\[ray\]"):
        RayExecutor().start()


# a study of one run whose metric logs images and whose loggers write their own folders
FILES_STUDY = {"name": "files", "seeds": 1, "scenarios": [{"benchmark": "split_digits", "n_experiences": 2}],
               "model": {"name": "mlp", "kwargs": {"hidden": [16]}}, "training": {"epochs": 1, "batch_size": 64},
               "strategies": ["Naive"], "loggers": ["text", "tensorboard"],
               "metrics": [{"name": "confusion_matrix_metrics", "kwargs": {"stream": True, "save_image": True}}]}


def _run_files(out) -> dict:
    """``{path relative to out: bytes}`` of the per-run files (``runs/``, the loggers' folders)."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.relative_to(out).parts[0] in ("runs", "text", "tensorboard")}


@pytest.mark.slow
def test_a_ray_study_brings_every_per_run_file_to_the_drivers_out(executor, tmp_path):
    from avalanche_plugins.study import run_study

    executor.start()  # the study's Ray executor uses this instance (and leaves it running)
    local = run_study(FILES_STUDY, out=tmp_path / "local", progress=False)
    remote = run_study(FILES_STUDY, out=tmp_path / "ray", executor="ray", progress=False)
    assert [r.status for r in remote.rows] == ["ok"] and "node_ip" in remote.rows[0].extra  # it ran on Ray
    here, there = _run_files(tmp_path / "local"), _run_files(tmp_path / "ray")
    # every file the metrics.csv rows name exists under the driver's out, as the local executor wrote it
    named = [m for m in csv.DictReader(remote.csv.read_text().splitlines()) if m["file"]]
    listed_locally = [m["file"] for m in csv.DictReader(local.csv.read_text().splitlines()) if m["file"]]
    assert named and [m["file"] for m in named] == listed_locally
    for m in named:
        path = f"runs/{m['scenario']}/{m['strategy']}/{m['setting']}/{m['file']}"
        assert there[path] == here[path]
    csv_path = "runs/split_digits/Naive/default/seed0.csv"
    assert there[csv_path] == here[csv_path]
    # the loggers' folders too (a TensorBoard file is named by its time, host and process)
    assert "text/split_digits/Naive/default/seed0.txt" in there
    assert [p.rsplit("/", 1)[0] for p in there if p.startswith("tensorboard/")] == \
        ["tensorboard/split_digits/Naive/default/seed0"]
    assert {p for p in there if "tensorboard/" not in p} == {p for p in here if "tensorboard/" not in p}
    # the bytes travelled with the row only: neither the cache nor results.json keeps them
    cached = [json.loads(line)["row"] for line in (tmp_path / "ray" / "jobs.jsonl").read_text().splitlines()]
    assert len(cached) == 1 and "files" not in cached[0]
    assert "files" not in json.loads((tmp_path / "ray" / "results.json").read_text())["runs"][0]
