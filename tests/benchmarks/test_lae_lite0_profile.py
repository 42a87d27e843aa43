"""``benchmarks.lae_lite0_profile``: its table from saved profiles, ``--report`` and its refusals
(the run itself needs Fashion-MNIST and the EfficientNet-Lite0 weights: docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from benchmarks import lae_lite0_profile as lite0
from benchmarks._results import write_results


def _measured(s):
    return {"layers": ["stem", "block", "head"], "s": s, "seconds": 2.0}


def test_report_reprints_a_saved_run_over_its_seeds_and_runs_nothing(tmp_path):
    # κ = max s / min s per seed: 4 and 2 (mean 3, sample std √2); the peak is the first layer
    rows = [{"seed": seed, "pretrained": {"fisher": _measured(s)}, "fine_tuned": {"fisher": _measured(s[::-1])}}
            for seed, s in enumerate(([4.0, 2.0, 1.0], [2.0, 1.0, 1.0]))]
    write_results(tmp_path, config={}, rows=rows, summary=[], wall_seconds=1.0,
                  command="python -m benchmarks.lae_lite0_profile --seeds 2")
    text = lite0.main(["--report", str(tmp_path / "results.json")])["report"]
    lines = text.splitlines()
    assert lines[0] == "`python -m benchmarks.lae_lite0_profile --seeds 2`"
    assert lines[4].startswith("| fisher | pretrained | 2 | 3 ± 1.4 |")
    assert "stem (0.00), stem (0.00)" in lines[4] and "head (1.00), head (1.00)" in lines[5]
    assert not any("hessian" in line for line in lines)  # no exact blocks were saved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv", "results.json"]


def test_refuses_to_start_without_the_data(tmp_path, capsys):
    with pytest.raises(SystemExit):
        lite0.main(["--out", str(tmp_path)])
    assert "--data-root" in capsys.readouterr().err and not any(tmp_path.iterdir())
