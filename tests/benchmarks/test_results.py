"""``benchmarks._results``: the results files and ``--report`` re-printing a saved run."""

from __future__ import annotations

import json
import os

import pytest

from avalanche_plugins.study import jobs
from avalanche_plugins.study.jobs import run_jobs
from avalanche_plugins.study.report.files import load_results
from benchmarks._cli import (
    benchmark_parser,
    is_skipped,
    parse_args,
)
from benchmarks._results import format_table, rounded_floats, summarize, write_results
from tests.benchmarks.test_cli import _parse
from tests.study.jobs.test_cache import Job


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


def test_rounded_floats_summarize_and_format_table():
    assert rounded_floats({"a": [0.123456789, 2], "b": 1.0000001}, 3) == {"a": [0.123, 2], "b": 1.0}
    rows = [{"m": "a", "acc": 0.5}, {"m": "a", "acc": 0.7}, {"m": "b", "acc": 0.9}]
    assert [(s["m"], round(s["acc_mean"], 2), round(s["acc_std"], 3), s["n"])
            for s in summarize(rows, ["m"], ["acc"])] == [("a", 0.6, 0.141, 2), ("b", 0.9, 0.0, 1)]
    table = format_table([{"m": "a", "acc_mean": 0.5, "acc_std": 0.1, "ticket_mean": None, "n": 2}],
                         ["m"], ["acc", "ticket"], 2)
    assert table == "| m | acc | ticket | n |\n|---|---|---|---|\n| a | 0.50 ± 0.10 | – | 2 |"
