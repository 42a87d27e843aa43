"""The study's paper-style tables: bold marks a winner, and a column every strategy ties on says why.

Case: the demo's FWT column in class-incremental runs was the same for every strategy (−0.109,
every cell bold, p = 1.000). It is true (a single head cannot predict classes it has not seen), but
the table showed a tie of five winners and the report did not say why (issue 38, case 5)."""

from __future__ import annotations

from avalanche_plugins.study.report.stats import summarize_study
from avalanche_plugins.study.report.tables import markdown_tables


def _row(strategy, seed, acc, fwt, matrix):
    return {"scenario": "split", "strategy": strategy, "seed": seed, "setting": "", "status": "ok",
            "acc": acc, "acc_til": float("nan"), "bwt": -0.5, "forgetting": 0.5, "fwt": fwt,
            "train_s": 1.0, "diagnostics_s": 0.0, "peak_memory_mb": 1.0, "accuracy_matrix": matrix}


def _table(fwt_of, future_accuracy):
    rows = []
    for strategy, acc in (("Naive", 0.40), ("Replay", 0.60), ("EWC", 0.45)):
        for seed in range(3):
            matrix = [[0.9, future_accuracy], [0.2 + 0.1 * seed, 0.9]]
            rows.append(_row(strategy, seed, acc + 0.01 * seed, fwt_of(strategy, seed), matrix))
    summary = summarize_study(rows, "Naive", ["Naive", "Replay", "EWC"])
    return markdown_tables(summary, "Naive")


def _cells(table: str, column: str) -> list[str]:
    lines = [line for line in table.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    index = header.index(column)
    return [[c.strip() for c in line.strip("|").split("|")][index] for line in lines[2:]]


def test_a_column_every_strategy_ties_on_has_no_winner_and_says_why():
    table = _table(lambda strategy, seed: -0.109, future_accuracy=0.0)
    fwt = _cells(table, "FWT ↑")
    assert len(fwt) == 3 and not any("**" in cell for cell in fwt)
    assert "FWT is -0.109 for every strategy and ranks none" in table
    assert "single-head class-incremental model never predicts" in table
    acc = _cells(table, "ACC ↑")  # the other columns still mark their winner
    assert [("**" in cell) for cell in acc] == [False, True, False]


def test_a_tie_without_the_class_incremental_cause_is_named_plainly():
    table = _table(lambda strategy, seed: 0.05, future_accuracy=0.3)
    assert "FWT is 0.050 for every strategy and ranks none." in table
    assert "single-head" not in table
    assert not any("**" in cell for cell in _cells(table, "FWT ↑"))


def test_fwt_that_differs_keeps_its_winner_and_no_note():
    values = {"Naive": 0.01, "Replay": 0.03, "EWC": 0.02}
    table = _table(lambda strategy, seed: values[strategy] + 0.001 * seed, future_accuracy=0.3)
    assert "ranks none" not in table
    assert [("**" in cell) for cell in _cells(table, "FWT ↑")] == [False, True, False]
