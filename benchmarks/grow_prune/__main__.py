"""``python -m benchmarks.grow_prune``."""

from benchmarks.grow_prune.main import main

if __name__ == "__main__":
    main()
