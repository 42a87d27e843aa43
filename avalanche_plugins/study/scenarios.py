"""The study's built-in scenarios: names → (dataset of ``harness.data.make_stream``, scenario kind),
with each dataset's input shape."""

from __future__ import annotations

__all__ = ["BUILTIN_SCENARIOS", "INPUT_SHAPES"]

BUILTIN_SCENARIOS = {  # name → (make_stream dataset, scenario)
    "split_digits": ("digits", "split"),
    "permuted_digits": ("digits", "permuted"),
    "split_mnist": ("mnist", "split"),
    "permuted_mnist": ("mnist", "permuted"),
    "split_cifar10": ("cifar10", "split"),
    "split_cifar100": ("cifar100", "split"),
}
INPUT_SHAPES = {"digits": (1, 8, 8), "mnist": (1, 28, 28), "cifar10": (3, 32, 32), "cifar100": (3, 32, 32)}
