"""Paper-style tables of a study summary: Markdown and LaTeX, one per scenario.

Rows are strategies (with the chosen hyper-parameters), columns final average accuracy,
forgetting and backward transfer as ``mean ± std [95 % CI]`` over seeds, then the Holm-corrected
p-value of the paired t-test of each against the reference strategy. The best mean of every
column is in bold (highest ACC and BWT, lowest forgetting).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from avalanche_plugins.study.stats import HIGHER_IS_BETTER, METRICS

__all__ = ["COLUMN_TITLES", "format_cell", "latex_tables", "markdown_tables"]

COLUMN_TITLES = {"acc": "ACC ↑", "forgetting": "Forgetting ↓", "bwt": "BWT ↑"}
_LATEX_ESCAPES = {"\\": r"\textbackslash{}", **{c: "\\" + c for c in "&%$#_{}"}}
_LATEX_TITLES = {"acc": r"ACC $\uparrow$", "forgetting": r"Forgetting $\downarrow$", "bwt": r"BWT $\uparrow$"}


def _best(entries: Sequence[Mapping], metric: str) -> float | None:
    means = [e[metric]["mean"] for e in entries if math.isfinite(e[metric]["mean"])]
    if not means:
        return None
    return max(means) if HIGHER_IS_BETTER[metric] else min(means)


def format_cell(stats: Mapping, digits: int = 3, latex: bool = False) -> str:
    """``mean ± std [low, high]`` (``mean`` alone for one seed).

    Example:
        >>> format_cell({"mean": 0.6, "std": 0.1, "n": 3, "ci_low": 0.352, "ci_high": 0.848})
        '0.600 ± 0.100 [0.352, 0.848]'
    """
    if not math.isfinite(stats["mean"]):
        return "—" if not latex else "--"
    text = f"{stats['mean']:.{digits}f}"
    if stats["n"] > 1:
        pm = r" $\pm$ " if latex else " ± "
        text += f"{pm}{stats['std']:.{digits}f} [{stats['ci_low']:.{digits}f}, {stats['ci_high']:.{digits}f}]"
    return text


def _p(test: Mapping | None, latex: bool) -> str:
    if test is None:
        return "ref" if not latex else "ref."
    p = test["p_holm"]
    if not math.isfinite(p):
        return "—" if not latex else "--"
    return f"{p:.3f}" if p >= 0.001 else ("<0.001" if not latex else "$<$0.001")


def _rows(entries: Sequence[Mapping], reference: str, latex: bool) -> list[list[str]]:
    best = {m: _best(entries, m) for m in METRICS}
    rows = []
    for e in entries:
        cells = [_escape(e["strategy"], latex), _escape(e["setting"], latex)]
        for metric in METRICS:
            cell = format_cell(e[metric], latex=latex)
            if best[metric] is not None and e[metric]["mean"] == best[metric]:
                cell = rf"\textbf{{{cell}}}" if latex else f"**{cell}**"
            cells.append(cell)
        cells += [_p(e["tests"].get(m) if e["strategy"] != reference else None, latex) for m in METRICS]
        rows.append(cells)
    return rows


def _escape(text: str, latex: bool) -> str:
    if not latex:
        return text.replace("|", "\\|")
    return "".join(_LATEX_ESCAPES.get(char, char) for char in text)


def _scenarios(summary: Sequence[Mapping]) -> list[str]:
    return list(dict.fromkeys(e["scenario"] for e in summary))


def markdown_tables(summary: Sequence[Mapping], reference: str) -> str:
    """One Markdown table per scenario, under a ``### scenario`` heading."""
    blocks = []
    for scenario in _scenarios(summary):
        entries = [e for e in summary if e["scenario"] == scenario]
        n = max(e["acc"]["n"] for e in entries)
        header = ["strategy", "setting", *(COLUMN_TITLES[m] for m in METRICS),
                  *(f"p {COLUMN_TITLES[m].split()[0]}" for m in METRICS)]
        lines = [f"### {scenario}", "",
                 f"Mean ± std [95 % CI] over {n} seed{'s' if n != 1 else ''}; p: paired t-test against "
                 f"{reference}, Holm-corrected; best in bold.", "",
                 "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in _rows(entries, reference, latex=False)]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def latex_tables(summary: Sequence[Mapping], reference: str) -> str:
    """One ``table`` environment per scenario (``booktabs`` rules)."""
    blocks = []
    for scenario in _scenarios(summary):
        entries = [e for e in summary if e["scenario"] == scenario]
        n = max(e["acc"]["n"] for e in entries)
        header = ["Strategy", "Setting", *(_LATEX_TITLES[m] for m in METRICS),
                  *(f"$p$ {_LATEX_TITLES[m].split()[0]}" for m in METRICS)]
        lines = [r"\begin{table}[t]", r"\centering", r"\small",
                 rf"\caption{{{_escape(scenario, True)}: mean $\pm$ std [95\,\% CI] over {n} seeds; "
                 rf"$p$: paired $t$-test against {_escape(reference, True)}, Holm-corrected; best in bold.}}",
                 r"\begin{tabular}{ll" + "c" * len(METRICS) + "r" * len(METRICS) + "}", r"\toprule",
                 " & ".join(header) + r" \\", r"\midrule"]
        lines += [" & ".join(row) + r" \\" for row in _rows(entries, reference, latex=True)]
        lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
