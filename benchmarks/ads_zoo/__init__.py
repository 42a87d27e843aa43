"""Does Architecture-Driven Shift (ADS) rank architectures by how far their old-task logits move?

Method, zoo, modules and outputs: docs/benchmarks.md, "benchmarks.ads_zoo", and docs/ads.md.
"""

from benchmarks.ads_zoo.main import main
from benchmarks.ads_zoo.scoring import analyse
from benchmarks.ads_zoo.zoo import quick_zoo

__all__ = ["analyse", "main", "quick_zoo"]
