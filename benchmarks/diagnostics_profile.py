"""Where the demo's diagnostics spend their time (issue 41's profile), beside its cost benchmark.

``callbacks``: the demo's Naive job under ``cProfile``; ``figures``: the curvature-profile figure
drawn now and as before issue 41 (docs/benchmarks.md, "benchmarks.diagnostics_profile").
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

from avalanche_plugins._avalanche import figures
from avalanche_plugins.study.jobs import Timer, torch_threads
from avalanche_plugins.study.report.files import print_report
from avalanche_plugins.study.run.job import run_job
from benchmarks._cli import benchmark_parser, parse_args
from benchmarks._results import write_results
from benchmarks.diagnostics_cost import DEMO, naive_job

NAMES = ["layers.0", "layers.1", "layers.2", "head"]
VALUES = [0.31, 0.045, 0.0062, 0.0011]


def _median_seconds(function, repeats: int) -> float:
    function()  # first call: imports, font cache
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _figure_before():
    """The profile figure as it was drawn before issue 41 (for the comparison only)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(3.0, 0.45 * len(NAMES) + 1.5), 3.0))
    ax = fig.subplots()
    ax.bar(range(len(VALUES)), VALUES)
    ax.set_yscale("log")
    ax.set_xticks(range(len(NAMES)))
    ax.set_xticklabels(NAMES, rotation=60, ha="right", fontsize=7)
    ax.set_title("s_l after experience 3 (kappa=282)", fontsize=9)
    fig.tight_layout()
    return figures.figure_image(fig).load()


def _figure_now():
    title = "s_l after experience 3 (kappa=282)"
    figures.DeferredFigure(figures.profile_figure, NAMES, VALUES, title,
                           figsize=figures.profile_figure_size(NAMES)).load()


def _callbacks(job, top: int) -> list[dict]:
    run_job(job, log_dir=None)  # warm: the profile is of a job after the first
    profile = cProfile.Profile()
    row = profile.runcall(run_job, job, log_dir=None)
    rows = [{"part": "callbacks", "what": name, "seconds": seconds} for name, seconds in row["callback_s"].items()
            if name.endswith("Metric")]
    rows.append({"part": "callbacks", "what": "training (train_s)", "seconds": row["train_s"]})
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(
        r"avalanche_plugins/(ads|readiness|transport|layer_adaptive|structural|_avalanche)/", top)
    listing = text.getvalue().split("\n\n", 2)[-1]
    for root in sorted({str(Path(p).resolve()) for p in (*sys.path, ".") if p}, key=len, reverse=True):
        listing = listing.replace(root + "/", "")  # no machine paths in a kept file
    return rows + [{"part": "profile", "what": listing, "seconds": None}]


def report(saved: dict) -> str:
    lines = [f"`{saved.get('command')}`", "", "| part | what | seconds |", "|---|---|---|"]
    lines += [f"| {r['part']} | {r['what']} | {r['seconds']:.4f} |" for r in saved["runs"] if r["seconds"] is not None]
    profile = [r["what"] for r in saved["runs"] if r["seconds"] is None]
    return "\n".join(lines + (["", "cProfile of the warm job (cumulative, the package's diagnostics):", "",
                               "```text", profile[0].rstrip(), "```"] if profile else []))


def main(argv=None) -> dict:
    parser = benchmark_parser("diagnostics_profile", __doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="drawings per timing (median)")
    parser.add_argument("--top", type=int, default=25, help="profiled functions listed")
    args = parse_args(parser, argv, unused=("quick", "seeds", "skip", "workers", "executor"))
    if args.report:
        return {"report": print_report(args.report, report)}
    job = naive_job(DEMO)  # diagnostics_cost's demo job
    with Timer() as total, torch_threads(args.threads):
        rows = _callbacks(job, args.top)
        rows += [{"part": "figures", "what": what, "seconds": _median_seconds(function, args.repeats)}
                 for what, function in (("curvature profile, now (DeferredFigure)", _figure_now),
                                        ("curvature profile, before (tight_layout)", _figure_before))]
    out = write_results(args.out, args, config={"repeats": args.repeats, "top": args.top, "threads": args.threads},
                        rows=rows, summary=[], wall_seconds=total.seconds)
    text = print_report(out / "results.json", report, out_dir=out)
    return {"rows": rows, "report": text}


if __name__ == "__main__":
    main()
