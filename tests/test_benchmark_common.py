"""The shared benchmark contract: the parser, the job cache key, the resumable executor, the
results files and ``--report`` re-printing a saved run."""

import json
import os
import sys
from dataclasses import dataclass

import pytest

from avalanche_plugins.study import jobs
from avalanche_plugins.study.jobs import job_key, run_jobs
from avalanche_plugins.study.report.files import command_line, load_results
from benchmarks._cli import (
    DEFAULT_SEEDS,
    QUICK_SEEDS,
    benchmark_parser,
    is_skipped,
    parse_args,
)
from benchmarks._results import write_results


def _parse(argv):
    return parse_args(benchmark_parser("example", "example benchmark"), argv)


def test_seeds_default_is_stated_once_and_quick_uses_one_unless_given():
    assert (DEFAULT_SEEDS, QUICK_SEEDS) == (3, 1)
    assert _parse([]).seeds == DEFAULT_SEEDS
    assert _parse(["--quick"]).seeds == QUICK_SEEDS
    assert _parse(["--quick", "--seeds", "3"]).seeds == 3  # explicit wins, even when equal to the default
    assert _parse(["--seeds", "2"]).seeds == 2
    help_text = benchmark_parser("example", "example benchmark").format_help()
    assert "default 3; 1 with --quick" in help_text


def test_shared_flags_and_their_defaults():
    args = _parse([])
    assert (args.quick, args.workers, args.threads, args.no_progress, args.report, args.data_root) == \
        (False, 1, 1, False, None, None)
    assert args.out == "out/example" and args.skip == frozenset()
    args = _parse(["--quick", "--workers", "2", "--threads", "3", "--no-progress", "--skip", "a/b, c",
                   "--report", "r.json", "--data-root", "d"])
    assert (args.quick, args.workers, args.threads, args.no_progress, args.report, args.data_root) == \
        (True, 2, 3, True, "r.json", "d")
    assert args.skip == {"a/b", "c"}
    for bad in (["--seeds", "0"], ["--workers", "0"], ["--threads", "-1"]):
        with pytest.raises(SystemExit):
            _parse(bad)


def test_skip_names_a_path_or_a_prefix():
    assert is_skipped({"permuted"}, "permuted", "cnn")
    assert is_skipped({"permuted/cnn"}, "permuted", "cnn")
    assert not is_skipped({"permuted/cnn"}, "permuted", "mlp")
    assert not is_skipped({"cnn"}, "permuted", "cnn")


def test_command_is_recorded_with_relative_paths():
    argv = ["--out", os.path.join(os.getcwd(), "out", "x"), f"--data-root={os.getcwd()}/data", "--quick"]
    assert command_line("python -m benchmarks.example", argv) == \
        "python -m benchmarks.example --out out/x --data-root=data --quick"
    assert _parse(argv).command == "python -m benchmarks.example --out out/x --data-root=data --quick"


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


def test_source_version_changes_with_the_code_only(tmp_path, monkeypatch):
    jobs.source_version.cache_clear()
    before = jobs.source_version()
    assert before.startswith("src:") and jobs.source_version() == before
    jobs.source_version.cache_clear()
    assert jobs.source_version() == before  # reading again: the same tree, the same version


def test_code_version_names_a_commit_or_the_package():
    version = jobs.code_version()
    assert version.startswith("git:") or version.startswith("avalanche_plugins ")


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


def test_importing_the_benchmark_cli_changes_no_cache_key():
    import subprocess

    code = ("from avalanche_plugins.study import jobs\n"
            "from avalanche_plugins.study.run.job import run_job\n"
            "before = (jobs.source_version(), jobs.code_roots(run_job), jobs.code_version())\n"
            "import benchmarks._cli  # noqa: F401\n"
            "jobs.source_version.cache_clear(); jobs.code_version.cache_clear()\n"
            "assert (jobs.source_version(), jobs.code_roots(run_job), jobs.code_version()) == before\n"
            "assert jobs.code_roots(run_job) == (jobs.PACKAGE_ROOT,)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0, result.stderr[-2000:]


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


def test_results_files_record_code_version_data_and_no_absolute_path(tmp_path):
    args = _parse(["--quick", "--out", str(tmp_path)])
    out = write_results(tmp_path, args, config={"args": vars(args)}, rows=[{"m": "a", "acc": 0.5}],
                        summary=[], wall_seconds=1.0)
    text = (out / "results.json").read_text()
    saved = load_results(out)
    assert saved["code_version"] == jobs.code_version()
    assert saved["data"]["name"] == "scikit-learn digits"
    assert os.getcwd() not in text

    def strings(obj):
        if isinstance(obj, dict):
            return [s for v in obj.values() for s in strings(v)]
        if isinstance(obj, list):
            return [s for v in obj for s in strings(v)]
        return [obj] if isinstance(obj, str) else []

    assert not [s for s in strings(saved) if os.path.isabs(s)]
    assert saved["config"]["args"]["out"] == os.path.relpath(tmp_path)
    assert (out / "results.csv").read_text().splitlines() == ["m,acc", "a,0.5"]


class _Example:
    """A minimal benchmark on the shared contract (parser, job cache, results files, ``--report``)."""

    def __init__(self):
        self.calls = []

    def run_job(self, job: Job) -> dict:
        self.calls.append(job)
        return {"method": job.method, "seed": job.seed, "acc": 0.25 + 0.5 * job.seed}

    @staticmethod
    def report(saved: dict) -> str:
        from benchmarks._results import format_table

        return format_table(saved["summary"], ["method"], ["acc"])

    def main(self, argv):
        from avalanche_plugins.study.report.files import print_report
        from benchmarks._results import summarize

        args = parse_args(benchmark_parser("example", "example benchmark"), argv)
        if args.report:
            return {"report": print_report(args.report, self.report)}
        batch = [Job(m, s) for m in ("naive", "ewc") if not is_skipped(args.skip, m) for s in range(args.seeds)]
        rows = run_jobs(self.run_job, batch, cache=f"{args.out}/jobs.jsonl", progress=False)
        summary = summarize(rows, ["method"], ["acc"])
        out = write_results(args.out, args, config={"args": vars(args)}, rows=rows, summary=summary,
                            wall_seconds=0.0)
        return {"rows": rows, "report": print_report(out / "results.json", self.report, out_dir=out)}


def test_report_reprints_a_saved_run_without_running_it(tmp_path, capsys):
    bench = _Example()
    result = bench.main(["--quick", "--skip", "ewc", "--no-progress", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert result["report"] in printed and "| naive" in result["report"]
    assert (tmp_path / "report.md").read_text() == result["report"] + "\n"
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["command"].startswith("python -m benchmarks.example --quick")
    assert [r["method"] for r in saved["runs"]] == ["naive"] and len(bench.calls) == 1

    again = bench.main(["--report", str(tmp_path / "results.json")])
    assert again["report"] == result["report"] and len(bench.calls) == 1  # --report runs no job
    assert capsys.readouterr().out.strip() == result["report"]
    with pytest.raises(FileNotFoundError, match="--report"):
        bench.main(["--report", str(tmp_path / "missing.json")])


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
