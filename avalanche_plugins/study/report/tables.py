"""Paper-style tables of a study summary, Markdown and LaTeX.

Per scenario:

* the **main table**: one row per strategy (with its chosen hyper-parameters); ACC
  (class-incremental), ACC task-IL (where the scenario's experiences have disjoint classes), BWT,
  Forgetting, FWT as ``mean ± std [95 % CI]`` over seeds, then training time, time spent in the
  attached diagnostics and peak memory as ``mean ± std``, then the Holm-corrected p-value of the
  paired t-test of each score against the reference strategy (only with >= 3 seeds; the caption
  says why otherwise). The best mean of every score is in bold. A strategy with failed seeds is
  marked with a footnote; one whose every seed failed shows "failed".
* the **failed runs** (scenario, strategy, setting, seed, cause), when there are any;
* per strategy, the **final accuracy matrix** ``R[i, j]`` (mean ± std over seeds) with the
  forgetting of every experience below it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from avalanche_plugins.study.report.stats import (
    COSTS,
    HIGHER_IS_BETTER,
    MIN_SEEDS_FOR_TESTS,
    TESTED,
)

__all__ = ["COLUMN_TITLES", "accuracy_matrix_tables", "diagnostics_tables", "failed_runs_table", "format_cell", "latex_tables",
           "markdown_tables"]

COLUMN_TITLES = {"acc": "ACC ↑", "acc_til": "ACC task-IL ↑", "bwt": "BWT ↑", "forgetting": "Forgetting ↓",
                 "fwt": "FWT ↑", "train_s": "time (s)", "diagnostics_s": "diagnostics (s)", "figures_s": "figures (s)",
                 "peak_memory_mb": "peak memory (MB)"}
_LATEX_TITLES = {"acc": r"ACC $\uparrow$", "acc_til": r"ACC task-IL $\uparrow$", "bwt": r"BWT $\uparrow$",
                 "forgetting": r"Forgetting $\downarrow$", "fwt": r"FWT $\uparrow$", "train_s": "Time (s)",
                 "diagnostics_s": "Diagnostics (s)", "figures_s": "Figures (s)", "peak_memory_mb": "Peak memory (MB)"}
_ORDER = ("acc", "acc_til", "bwt", "forgetting", "fwt")
_DIGITS = {"train_s": 1, "diagnostics_s": 1, "figures_s": 1, "peak_memory_mb": 0}
_LATEX_ESCAPES = {"\\": r"\textbackslash{}", **{c: "\\" + c for c in "&%$#_{}"}}
_DAGGER = {False: "†", True: r"$^\dagger$"}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def format_cell(stats: Mapping, digits: int = 3, latex: bool = False, interval: bool = True) -> str:
    """``mean ± std [low, high]`` (``mean`` alone for one seed; no interval with ``interval=False``).

    Example:
        >>> format_cell({"mean": 0.6, "std": 0.1, "n": 3, "ci_low": 0.522, "ci_high": 0.678})
        '0.600 ± 0.100 [0.522, 0.678]'
    """
    if not math.isfinite(stats["mean"]):
        return "—" if not latex else "--"
    text = f"{stats['mean']:.{digits}f}"
    if stats["n"] > 1:
        pm = r" $\pm$ " if latex else " ± "
        text += f"{pm}{stats['std']:.{digits}f}"
        if interval:
            text += f" [{stats['ci_low']:.{digits}f}, {stats['ci_high']:.{digits}f}]"
    return text


def _escape(text: str, latex: bool) -> str:
    if not latex:
        return text.replace("|", "\\|")
    return "".join(_LATEX_ESCAPES.get(char, char) for char in text)


def _scenarios(summary: Sequence[Mapping]) -> list[str]:
    return list(dict.fromkeys(e["scenario"] for e in summary))


def _columns(entries: Sequence[Mapping]) -> list[str]:
    """The scores shown: task-IL accuracy and FWT only where some run has them."""
    return [m for m in _ORDER if m not in ("acc_til", "fwt") or any(math.isfinite(e[m]["mean"]) for e in entries)]


def _finite_means(entries: Sequence[Mapping], metric: str) -> list[float]:
    return [e[metric]["mean"] for e in entries if not e["all_failed"] and math.isfinite(e[metric]["mean"])]


def _tied(entries: Sequence[Mapping], metric: str) -> bool:
    """Every scored strategy (two or more) has the same mean: a column that ranks nothing."""
    means = _finite_means(entries, metric)
    return len(means) > 1 and max(means) - min(means) <= 1e-12 * max(1.0, abs(means[0]))


def _best(entries: Sequence[Mapping], metric: str) -> float | None:
    """The best mean of a column, or None when there is none or every strategy ties (no winner)."""
    means = _finite_means(entries, metric)
    if not means or _tied(entries, metric):
        return None
    return max(means) if HIGHER_IS_BETTER[metric] else min(means)


def _unseen_classes_never_predicted(entries: Sequence[Mapping]) -> bool:
    """``R[j-1, j] = 0`` for every ``j >= 1`` in every run of every strategy: the model never predicts
    an experience's classes before it trains on them (class-incremental, one head), so FWT is
    ``-mean_j b_j`` whatever the strategy."""
    scored = [e for e in entries if not e["all_failed"]]
    if not scored or any(e.get("matrix") is None for e in scored):
        return False
    for e in scored:
        mean = e["matrix"]["mean"]
        if len(mean) < 2 or any(mean[j - 1][j] != 0 for j in range(1, len(mean))):
            return False
    return True


def _fwt_note(entries: Sequence[Mapping], columns, latex: bool) -> str:
    """Why the FWT column cannot rank the strategies, when it cannot (empty otherwise)."""
    if "fwt" not in columns or not _tied(entries, "fwt"):
        return ""
    value = _finite_means(entries, "fwt")[0]
    if _unseen_classes_never_predicted(entries):
        return (f" FWT is {value:.3f} for every strategy and ranks none: before training on experience j the "
                f"single-head class-incremental model never predicts j's classes ({'$R_{j-1,j} = 0$' if latex else 'R[j-1, j] = 0'} "
                f"in every run), so FWT is minus the untrained model's mean accuracy whatever the strategy; "
                f"compare strategies on FWT in a task-incremental scenario.")
    return f" FWT is {value:.3f} for every strategy and ranks none."


def _p(test: Mapping | None, latex: bool) -> str:
    if test is None:
        return "ref" if not latex else "ref."
    p = test["p_holm"]
    if not math.isfinite(p):
        return "—" if not latex else "--"
    return f"{p:.3f}" if p >= 0.001 else ("<0.001" if not latex else "$<$0.001")


def _tests_shown(entries: Sequence[Mapping]) -> bool:
    return any(t["n"] >= MIN_SEEDS_FOR_TESTS for e in entries for t in e["tests"].values())


def _row(e: Mapping, columns, best, reference: str, tests: bool, latex: bool) -> list[str]:
    name = _escape(e["strategy"], latex) + (_DAGGER[latex] if e["failed"] else "")
    cells = [name, _escape(e["setting"], latex)]
    if e["all_failed"]:
        width = len(columns) + len(COSTS) + (len(columns) if tests else 0)
        return cells + ["failed"] * width
    for metric in columns:
        cell = format_cell(e[metric], latex=latex)
        if best[metric] is not None and e[metric]["mean"] == best[metric]:
            cell = rf"\textbf{{{cell}}}" if latex else f"**{cell}**"
        cells.append(cell)
    cells += [format_cell(e[m], digits=_DIGITS[m], latex=latex, interval=False) for m in COSTS]
    if tests:
        cells += [_p(e["tests"].get(m) if e["strategy"] != reference else None, latex) for m in columns if m in TESTED]
    return cells


def _caption(entries: Sequence[Mapping], columns, reference: str, tests: bool, latex: bool) -> str:
    n = max(e["acc"]["n"] for e in entries) if entries else 0
    pm, ci = (r"$\pm$", r"95\,\%") if latex else ("±", "95 %")
    text = (f"Mean {pm} std over {_plural(n, 'seed')}; [{ci} percentile-bootstrap interval of the mean, "
            f"resamples of the seeds enumerated exactly] for the scores; time: training and evaluation "
            f"without the diagnostics; diagnostics: time in the attached metrics' callbacks; figures: drawing "
            f"and writing the run's figures after training; peak memory of the process that ran the job alone.")
    if tests:
        m = len([e for e in entries if e["strategy"] != reference and not e["all_failed"]])
        text += (f" p: two-sided paired t-test against {_escape(reference, latex)} over seeds, Holm-corrected "
                 f"across the {_plural(m, 'comparison')} of each column.")
    elif n < MIN_SEEDS_FOR_TESTS and len(entries) > 1:
        text += (f" No p-values: a paired test needs at least {MIN_SEEDS_FOR_TESTS} seeds "
                 f"(this table has {n}).")
    text += _fwt_note(entries, columns, latex)
    text += " Best score in bold (none where every strategy ties)."
    failed = [e for e in entries if e["failed"]]
    for e in failed:
        seeds = ", ".join(str(f["seed"]) for f in e["failed"])
        text += (f" {_DAGGER[latex]} {_escape(e['strategy'], latex)}: seed{'s' if len(e['failed']) > 1 else ''} "
                 f"{seeds} failed and {'are' if len(e['failed']) > 1 else 'is'} not scored (see Failed runs).")
    return text


def _main_table(entries: Sequence[Mapping], reference: str, latex: bool) -> tuple[list[str], list[list[str]], str]:
    columns = _columns(entries)
    tests = _tests_shown(entries)
    best = {m: _best(entries, m) for m in columns}
    titles = _LATEX_TITLES if latex else COLUMN_TITLES
    header = ["Strategy" if latex else "strategy", "Setting" if latex else "setting",
              *(titles[m] for m in columns), *(titles[m] for m in COSTS)]
    if tests:
        header += [f"{'$p$' if latex else 'p'} {titles[m].rsplit(' ', 1)[0]}" for m in columns if m in TESTED]
    rows = [_row(e, columns, best, reference, tests, latex) for e in entries]
    return header, rows, _caption(entries, columns, reference, tests, latex)


def markdown_tables(summary: Sequence[Mapping], reference: str) -> str:
    """One Markdown main table per scenario, under a ``### scenario`` heading."""
    blocks = []
    for scenario in _scenarios(summary):
        entries = [e for e in summary if e["scenario"] == scenario]
        header, rows, caption = _main_table(entries, reference, latex=False)
        lines = [f"### {scenario}", "", caption, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _latex_table(caption: str, header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    lines = [r"\begin{table}[t]", r"\centering", r"\small", rf"\caption{{{caption}}}",
             r"\begin{tabular}{" + align + "}", r"\toprule", " & ".join(header) + r" \\", r"\midrule"]
    lines += [" & ".join(row) + r" \\" for row in rows]
    return "\n".join([*lines, r"\bottomrule", r"\end{tabular}", r"\end{table}"])


def latex_tables(summary: Sequence[Mapping], reference: str) -> str:
    """One ``table`` environment per scenario (``booktabs`` rules), then the failed runs and the
    accuracy matrices."""
    blocks = []
    for scenario in _scenarios(summary):
        entries = [e for e in summary if e["scenario"] == scenario]
        header, rows, caption = _main_table(entries, reference, latex=True)
        blocks.append(_latex_table(f"{_escape(scenario, True)}: {caption}", header, rows,
                                   "ll" + "c" * (len(header) - 2)))
    failed = failed_runs_table(summary, latex=True)
    if failed:
        blocks.append(failed)
    matrices = accuracy_matrix_tables(summary, latex=True)
    if matrices:
        blocks.append(matrices)
    return "\n\n".join(blocks)


def diagnostics_tables(entries: Sequence[Mapping], latex: bool = False) -> str:
    """Per scenario, the diagnostics' scalars per strategy (``mean ± std`` over seeds of each run's
    mean over its measurements; :func:`~avalanche_plugins.study.report.stats.summarize_diagnostics`);
    ``""`` when no run logged one."""
    blocks = []
    for scenario in dict.fromkeys(e["scenario"] for e in entries):
        part = [e for e in entries if e["scenario"] == scenario]
        titles = list(dict.fromkeys(k for e in part for k in e if k not in ("scenario", "strategy")))
        header = ["strategy", *titles]
        rows = [[e["strategy"], *(format_cell(e[t], latex=latex, interval=False) if t in e else "—" for t in titles)]
                for e in part]
        if latex:
            rows = [[_escape(row[0], True), *row[1:]] for row in rows]
            blocks.append(_latex_table(f"{_escape(scenario, True)}: diagnostics, mean over each run's measurements",
                                       [h.capitalize() for h in header], rows, "l" + "c" * len(titles)))
            continue
        lines = [f"### {scenario}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def failed_runs_table(summary: Sequence[Mapping], latex: bool = False) -> str:
    """The runs that failed (``""`` when none did): scenario, strategy, setting, seed, cause."""
    rows = [[e["scenario"], e["strategy"], e["setting"], str(f["seed"]),
             f["error"] if f["error"].startswith(f["status"]) else f"{f['status']}: {f['error']}"]
            for e in summary for f in e["failed"]]
    if not rows:
        return ""
    header = ["scenario", "strategy", "setting", "seed", "cause"]
    if latex:
        rows = [[_escape(c, True) for c in row] for row in rows]
        return _latex_table("Failed runs: not scored, left out of every mean and test.",
                            [h.capitalize() for h in header], rows, "llllp{0.45\\linewidth}")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_escape(c, False) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _matrix_rows(entry: Mapping, latex: bool) -> tuple[list[str], list[list[str]]] | None:
    matrix = entry.get("matrix")
    if not matrix:
        return None
    mean, std, n = matrix["mean"], matrix["std"], matrix["n"]
    pm = r" $\pm$ " if latex else " ± "
    size = len(mean)

    def cell(m, s):
        return f"{m:.3f}" + (f"{pm}{s:.3f}" if n > 1 and math.isfinite(s) else "")

    header = ["after training", *(f"exp {j}" for j in range(size))]
    rows = [[f"exp {i}", *(cell(mean[i][j], std[i][j]) for j in range(size))] for i in range(size)]
    forgetting = entry.get("forgetting_per_experience") or []
    if forgetting:
        rows.append(["forgetting", *(cell(f["mean"], f["std"]) for f in forgetting), *([""] * (size - len(forgetting)))])
    return header, rows


def accuracy_matrix_tables(summary: Sequence[Mapping], latex: bool = False) -> str:
    """Per (scenario, strategy): the final accuracy matrix ``R[i, j]`` (row: after training
    experience ``i``; column: evaluated experience ``j``; mean ± std over seeds) and the forgetting
    of each experience."""
    blocks = []
    for entry in summary:
        made = _matrix_rows(entry, latex)
        if made is None:
            continue
        header, rows = made
        n = entry["matrix"]["n"]
        title = f"{entry['scenario']} / {entry['strategy']} ({entry['setting']})"
        if latex:
            caption = (rf"{_escape(title, True)}: accuracy $R[i, j]$ on experience $j$ after training experience "
                       rf"$i$, mean $\pm$ std over {_plural(n, 'seed')}; last row: forgetting of each experience.")
            blocks.append(_latex_table(caption, header, [[_escape(c, True) if "$" not in c else c for c in row]
                                                         for row in rows], "l" + "c" * (len(header) - 1)))
            continue
        lines = [f"#### {_escape(title, False)}", "",
                 f"R[i, j]: accuracy on experience j (columns) after training experience i (rows), mean ± std over "
                 f"{_plural(n, 'seed')}; last row: forgetting of each experience.", "",
                 "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
