"""``jobs.cache``: the job cache key, resuming, and keys on the code a job runs."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from avalanche_plugins.study import jobs
from avalanche_plugins.study.jobs import job_key, run_jobs


@dataclass(frozen=True)
class Job:
    method: str
    seed: int
    lr: float = 0.1


def test_cache_key_changes_with_job_fields_and_code_version(monkeypatch):
    base = job_key(Job("ewc", 0), "v1")
    assert base == job_key(Job("ewc", 0), "v1")
    assert base != job_key(Job("ewc", 1), "v1")
    assert base != job_key(Job("ewc", 0, lr=0.2), "v1")
    assert base != job_key(Job("naive", 0), "v1")
    assert base != job_key(Job("ewc", 0), "v2")
    monkeypatch.setattr(jobs.cache, "source_version", lambda: "v1")
    assert job_key(Job("ewc", 0)) == base  # the default version is the hash of the code's source
    monkeypatch.setattr(jobs.cache, "source_version", lambda: "v2")
    assert job_key(Job("ewc", 0)) != base


def test_run_jobs_resumes_from_the_cache(tmp_path):
    calls = []

    def fn(job):
        calls.append(job)
        return {"method": job.method, "seed": job.seed, "value": job.seed * 0.5}

    cache = tmp_path / "jobs.jsonl"
    batch = [Job("a", 1), Job("a", 0), Job("a", 1)]  # a job listed twice runs once
    rows = run_jobs(fn, batch, cache=cache, progress=False)
    assert [r["seed"] for r in rows] == [1, 0, 1] and len(calls) == 2  # rows in job order
    assert len(cache.read_text().splitlines()) == 2
    assert run_jobs(fn, batch + [Job("b", 2)], cache=cache, progress=False)[:3] == rows
    assert len(calls) == 3  # only the new job ran
    with open(cache, "a") as f:
        f.write('{"key": "half-written')  # a run killed while writing
    assert run_jobs(fn, batch, cache=cache, progress=False) == rows and len(calls) == 3
    run_jobs(fn, [Job("c", 3)], cache=cache, progress=False)
    assert json.loads(cache.read_text().splitlines()[-1])["row"]["method"] == "c"  # on a line of its own


PROBE = "cache_probe"  # a caller's own experiment package (as a checkout's benchmarks/), made per test


PROBE_JOB = """
import importlib


def probe(job):
    return {"seed": job.seed, "value": importlib.import_module("cache_probe.used").VALUE}
"""


def _probe_package(tmp_path, monkeypatch):
    """``cache_probe`` (its job function in ``cache_probe.jobs``, importing ``cache_probe.used``;
    ``cache_probe.unused`` imported by nothing) on ``sys.path``; returns (package folder, job function)."""
    import importlib

    code = tmp_path / "experiment_code" / PROBE
    code.mkdir(parents=True)
    (code / "__init__.py").write_text("")
    (code / "jobs.py").write_text(PROBE_JOB)
    (code / "used.py").write_text("VALUE = 1\n")
    (code / "unused.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(code.parent))
    for name in [m for m in sys.modules if m == PROBE or m.startswith(f"{PROBE}.")]:
        monkeypatch.delitem(sys.modules, name)
    return code, importlib.import_module(f"{PROBE}.jobs").probe


def _forget_probe():
    for name in [m for m in sys.modules if m == PROBE or m.startswith(f"{PROBE}.")]:
        sys.modules.pop(name)


def test_a_job_runs_the_code_of_the_package_and_of_the_package_its_function_is_in(tmp_path, monkeypatch):
    code, probe = _probe_package(tmp_path, monkeypatch)
    try:
        assert jobs.code_roots(probe) == (jobs.PACKAGE_ROOT, code.resolve())
        assert jobs.code_roots(__import__("functools").partial(probe)) == jobs.code_roots(probe)
        from benchmarks.ads_zoo.job import run_job

        assert jobs.code_roots(run_job)[1].name == "benchmarks"
        assert jobs.code_roots(json.dumps) == (jobs.PACKAGE_ROOT,)  # the standard library is not the job's code
    finally:
        _forget_probe()


def test_the_cache_survives_edits_to_code_the_job_never_ran_and_not_to_code_it_ran(tmp_path, monkeypatch):
    code, probe = _probe_package(tmp_path, monkeypatch)
    cache, batch = tmp_path / "jobs.jsonl", [Job("a", 0), Job("a", 1)]
    benchmark = tmp_path / "benchmark_file.py"  # stands for an edit anywhere else (a benchmark, a test)
    try:
        rows = run_jobs(probe, batch, cache=cache, progress=False)
        lines = [json.loads(line) for line in cache.read_text().splitlines()]
        assert all(f"{PROBE}/used.py" in e["code"] and f"{PROBE}/jobs.py" in e["code"] for e in lines)
        assert not any(f"{PROBE}/unused.py" in e["code"] for e in lines)
        assert "avalanche_plugins/study/jobs/cache.py" in lines[0]["code"]  # the package's own modules too
        assert all(e["code_version"] == jobs.code_version() for e in lines)  # the full code version, per row
        (code / "unused.py").write_text("VALUE = 3  # edited\n")
        benchmark.write_text("x = 1\n")
        run_jobs(probe, batch, cache=cache, progress=False)
        assert len(cache.read_text().splitlines()) == 2  # an edit the jobs never ran: cached rows reused
        (code / "used.py").write_text('"""A docstring added."""\n\nVALUE = 1  # and a comment\n')
        run_jobs(probe, batch, cache=cache, progress=False)
        assert len(cache.read_text().splitlines()) == 2  # the code the jobs ran did not change
        (code / "used.py").write_text("VALUE = 10  # edited\n")
        sys.modules.pop(f"{PROBE}.used", None)
        again = run_jobs(probe, batch, cache=cache, progress=False)
        assert len(cache.read_text().splitlines()) == 4 and [r["value"] for r in again] == [10, 10]
        assert [r["value"] for r in rows] == [1, 1]
    finally:
        _forget_probe()


def test_a_cache_line_of_the_older_format_counts_under_the_whole_source(tmp_path, monkeypatch):
    calls = []
    cache = tmp_path / "jobs.jsonl"
    monkeypatch.setattr(jobs.cache, "source_version", lambda: "v1")
    cache.write_text(json.dumps({"key": job_key(Job("a", 0)), "job": {}, "row": {"value": 7}}) + "\n")
    assert run_jobs(lambda job: calls.append(job) or {"value": 0}, [Job("a", 0)], cache=cache,
                    progress=False) == [{"value": 7}] and calls == []
    monkeypatch.setattr(jobs.cache, "source_version", lambda: "v2")  # the package changed since that line
    assert run_jobs(lambda job: calls.append(job) or {"value": 0}, [Job("a", 0)], cache=cache,
                    progress=False) == [{"value": 0}] and len(calls) == 1


def test_a_ray_row_whose_node_ran_other_code_is_a_failed_run(tmp_path, monkeypatch):
    code = tmp_path / "node_code"
    code.mkdir()
    (code / "shared.py").write_text("VALUE = 1\n")
    roots = (jobs.PACKAGE_ROOT, code.resolve())
    same = {"node_code/shared.py": jobs.code._file_hash(str(code / "shared.py"), 0, 0)}
    row = {"status": "ok", "acc": 0.5, "node_ip": "10.0.0.2"}
    assert jobs.code._refuse_other_code(row, same, roots) == row
    assert jobs.code._refuse_other_code({"status": "ok"}, {"node_code/shared.py": "other"}, roots) == {"status": "ok"}
    refused = jobs.code._refuse_other_code(row, {"node_code/shared.py": "0123456789abcdef"}, roots)
    assert refused["status"] == "error" and "node 10.0.0.2 ran other code than the driver's (node_code/shared.py)" \
        in refused["error"]
