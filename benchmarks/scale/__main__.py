"""``python -m benchmarks.scale``."""

from benchmarks.scale import main

if __name__ == "__main__":
    main()
