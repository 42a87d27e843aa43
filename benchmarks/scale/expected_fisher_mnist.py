"""Expected-Fisher memory on torchvision's ResNet-18 for 1-channel MNIST-shaped inputs (issue 15).

``python -m benchmarks.scale.expected_fisher_mnist --samples 8 64``: time and peak RSS per sample
count, one fresh process each (docs/benchmarks.md, "benchmarks.scale").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import resource, time, torch, torchvision
from torch import nn
from avalanche_plugins.layer_adaptive import expected_fisher
torch.set_num_threads(1)
torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=10)
model.conv1 = nn.Conv2d(1, 64, 7, 2, 3, bias=False)
x = torch.randn({n}, 1, 28, 28)
start = time.perf_counter()
expected_fisher(model, x)
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6)
"""


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--out", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.samples):
        parser.error(f"--samples must be positive, got {args.samples}")
    rows = []
    print("| samples | time | peak RSS |\n|---|---|---|")
    for n in args.samples:
        out = subprocess.run([sys.executable, "-c", CHILD.format(n=n)], check=True, capture_output=True, text=True)
        seconds, rss_gb = map(float, out.stdout.split()[-2:])
        rows.append({"samples": n, "time_s": seconds, "peak_rss_gb": rss_gb})
        print(f"| {n} | {seconds:.1f} s | {rss_gb:.2f} GB |", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python -m benchmarks.scale.expected_fisher_mnist " + " ".join(argv or sys.argv[1:]),
                       "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
