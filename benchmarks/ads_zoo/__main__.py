"""``python -m benchmarks.ads_zoo``."""

from benchmarks.ads_zoo.main import main

if __name__ == "__main__":
    main()
