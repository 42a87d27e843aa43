"""``python -m benchmarks.scale``."""

from benchmarks.scale.main import main

if __name__ == "__main__":
    main()
