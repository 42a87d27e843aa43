"""``python -m benchmarks.plasticity_ranking``."""

from benchmarks.plasticity_ranking.main import main

if __name__ == "__main__":
    main()
