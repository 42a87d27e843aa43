"""``benchmarks._cli``: the shared parser, the recorded command, and importing it changing no cache key."""

from __future__ import annotations

import os
import sys

import pytest

from avalanche_plugins.study.report.files import command_line
from benchmarks._cli import (
    DEFAULT_SEEDS,
    QUICK_SEEDS,
    benchmark_parser,
    is_skipped,
    make_executor,
    parse_args,
    run_cached,
    subset_of,
)
from tests import REPO_ROOT


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


def test_make_executor_follows_the_flags():
    assert type(make_executor(_parse(["--workers", "2"]))).__name__ == "LocalExecutor"
    ex = make_executor(_parse(["--executor", "ray", "--workers", "2", "--threads", "2"]))
    assert (type(ex).__name__, ex.num_cpus, ex.threads, ex.address) == ("RayExecutor", 4, 2, None)


def test_skip_names_a_path_or_a_prefix():
    assert is_skipped({"permuted"}, "permuted", "cnn")
    assert is_skipped({"permuted/cnn"}, "permuted", "cnn")
    assert not is_skipped({"permuted/cnn"}, "permuted", "mlp")
    assert not is_skipped({"cnn"}, "permuted", "cnn")


SQUARED = []


def _square(x: int) -> int:
    SQUARED.append(x)
    return x * x


def test_run_cached_keeps_rows_in_the_commands_job_cache_and_resumes_from_it(tmp_path):
    SQUARED.clear()
    args = _parse(["--out", str(tmp_path), "--no-progress"])
    assert run_cached(args, _square, [1, 2, 3], "squares") == [1, 4, 9]
    assert len((tmp_path / "jobs.jsonl").read_text().splitlines()) == 3 and SQUARED == [1, 2, 3]
    assert run_cached(args, _square, [3, 4], "squares") == [9, 16]
    assert SQUARED == [1, 2, 3, 4]  # 3 came from the cache


def test_a_shared_flag_a_benchmark_does_not_use_is_hidden_and_refused_not_ignored(capsys):
    parser = benchmark_parser("example", "example benchmark")
    args = parse_args(parser, ["--quick"], unused=("seeds", "workers", "executor"))
    assert args.quick and args.seeds == QUICK_SEEDS and args.workers == 1
    usage = parser.format_help()
    assert "--quick" in usage and not any(f in usage for f in ("--seeds", "--workers", "--executor", "--address"))
    for argv in (["--seeds", "3"], ["--workers", "2"], ["--executor", "ray"]):
        with pytest.raises(SystemExit):
            parse_args(benchmark_parser("example", "example benchmark"), argv, unused=("seeds", "workers", "executor"))
        assert f"does not take {argv[0]}" in capsys.readouterr().err


@pytest.mark.parametrize("module, argv", [
    ("benchmarks.lae_costs", ["--seeds", "3"]), ("benchmarks.diagnostics_profile", ["--quick"]),
    ("benchmarks.diagnostics_cost", ["--workers", "2"]), ("benchmarks.sample_counts", ["--skip", "x"]),
    ("benchmarks.lae_pretrained", ["--skip", "task"]), ("benchmarks.scale", ["--executor", "ray"]),
    ("benchmarks.curvature_peers", ["--seeds", "2"]),
])
def test_benchmarks_refuse_the_shared_flags_they_would_ignore(module, argv, tmp_path, capsys):
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(module).main([*argv, "--out", str(tmp_path)])
    assert f"does not take {argv[0]}" in capsys.readouterr().err and not any(tmp_path.iterdir())


def test_subset_of_takes_the_default_and_refuses_unknown_names_before_anything_runs(capsys):
    parser = benchmark_parser("example", "example benchmark")
    assert subset_of(parser, "--models", "cnn, mlp", ("mlp", "cnn", "vit")) == ["cnn", "mlp"]
    assert subset_of(parser, "--models", None, ("mlp", "cnn"), ("cnn",)) == ["cnn"]
    assert subset_of(parser, "--models", " , ", ("mlp", "cnn"), ("mlp",)) == ["mlp"]
    with pytest.raises(SystemExit):
        subset_of(parser, "--models", "mlp,resnet50", ("mlp", "cnn"))
    assert "--models must be a subset of mlp, cnn; got resnet50" in capsys.readouterr().err


@pytest.mark.parametrize("module, argv", [
    ("benchmarks.lae_pretrained", ["--scenarios", "task,domain"]),
    ("benchmarks.plasticity_ranking", ["--benchmarks", "scr,cifar"]),
    ("benchmarks.plasticity_ranking", ["--only", "scr/no_such_setting"]),
    ("benchmarks.grow_prune", ["--methods", "grow,regrow"]),
    ("benchmarks.transport_keys", ["--pairs", "split,class"]),
    ("benchmarks.ads_zoo", ["--scenarios", "split_cifar"]),
    ("benchmarks.curvature_agreement", ["--models", "resnet"]),
])
def test_benchmarks_refuse_names_they_do_not_have(module, argv, tmp_path, capsys):
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(module).main([*argv, "--quick", "--out", str(tmp_path)])
    assert f"{argv[0]} must be a subset of" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing ran


def test_command_is_recorded_with_relative_paths():
    argv = ["--out", os.path.join(os.getcwd(), "out", "x"), f"--data-root={os.getcwd()}/data", "--quick"]
    assert command_line("python -m benchmarks.example", argv) == \
        "python -m benchmarks.example --out out/x --data-root=data --quick"
    assert _parse(argv).command == "python -m benchmarks.example --out out/x --data-root=data --quick"


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
                            cwd=str(REPO_ROOT))
    assert result.returncode == 0, result.stderr[-2000:]
