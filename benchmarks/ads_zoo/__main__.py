"""``python -m benchmarks.ads_zoo``."""

from benchmarks.ads_zoo.main import main

main()
