"""Quick start: the demo study (``studies/demo.yaml``), what ``make demo`` runs.

Naive, EWC, Replay, LayerAdaptiveEWC and Grow on Split digits (scikit-learn, offline), every
diagnostic of the package attached, EWC's and LayerAdaptiveEWC's λ tuned on a validation split,
3 test seeds. Prints the paper-style table and writes ``demo_out/report.md`` with its figures.
Same flags as ``python -m benchmarks.study`` (``--quick``, ``--seeds``, ``--workers``, …); a
config path runs that study instead.
"""

from __future__ import annotations

from benchmarks.study.__main__ import main as study_main


def main(argv=None):
    return study_main(argv, name="demo", default_out="demo_out")


if __name__ == "__main__":
    main()
