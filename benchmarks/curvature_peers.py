"""Per-layer curvature against the maintained curvature library, side by side in one process.

Method, outputs, ``--report`` and ``--memory``: docs/benchmarks.md, "benchmarks.curvature_peers".
"""

from __future__ import annotations

import resource
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from avalanche_plugins.core.layers import discover_layers
from avalanche_plugins.layer_adaptive.curvature import DEFAULT_SAMPLES, layer_curvature
from avalanche_plugins.layer_adaptive.fisher_blocks import layer_fisher_eigenvalues
from avalanche_plugins.layer_adaptive.hessian import layer_top_eigenvalues
from avalanche_plugins.study.catalog.datasets import load_digits_arrays
from avalanche_plugins.study.catalog.zoo import build_model
from avalanche_plugins.study.report.files import print_report
from benchmarks._cli import benchmark_parser, is_skipped, parse_args
from benchmarks._results import write_results
from benchmarks._training import train_minibatches

CE = nn.CrossEntropyLoss()
CURVATURES = ("hessian", "ef", "ggn")  # exact Hessian, empirical Fisher, generalised Gauss-Newton blocks
NAMES = {"hessian": "Hessian", "ef": "empirical Fisher", "ggn": "GGN"}


@dataclass(frozen=True)
class Setting:
    name: str
    samples: int
    quick_samples: int
    tol: float
    reference_tol: float
    ggn_labels: str  # ours for the GGN row: "expected" (exact) or "sampled" (Monte-Carlo)


SETTINGS = (Setting("mlp", 256, 64, 1e-6, 1e-8, "expected"),
            Setting("cnn", 128, 32, 1e-6, 1e-8, "expected"),
            Setting("resnet18", 16, 4, 1e-3, 1e-5, "sampled"))
CHUNK = 32  # samples per minibatch, ours and curvlinops alike


def build(setting: Setting, n: int):
    """``(model, x, y)``: the model in eval mode and its ``n`` samples (seeded)."""
    torch.manual_seed(0)
    if setting.name == "mlp":
        x_train, y_train, _, _ = load_digits_arrays()
        model = build_model("mlp", (1, 8, 8), 10)
        train_minibatches(model, x_train, y_train, epochs=3, lr=1e-3, batch_size=64,
                          generator=torch.Generator().manual_seed(0))
        return model.eval(), x_train[:n], y_train[:n]
    classes = 10 if setting.name == "cnn" else 100
    model = build_model("cnn", (3, 32, 32), classes) if setting.name == "cnn" else \
        build_model("cifar_resnet", (3, 32, 32), classes, depth=18)
    x, y = torch.randn(n, 3, 32, 32), torch.randint(0, classes, (n,))
    model.train()
    with torch.no_grad():
        model(x)  # BatchNorm running statistics of the data
    return model.eval(), x, y


def peer(kind: str, model, x, y, tol: float) -> tuple[np.ndarray, int]:
    """curvlinops: per layer the block operator and eigsh's top eigenvalue; and the products used."""
    import curvlinops
    from scipy.sparse.linalg import LinearOperator, eigsh

    operator = {"hessian": curvlinops.HessianLinearOperator, "ef": curvlinops.EFLinearOperator,
                "ggn": curvlinops.GGNLinearOperator}[kind]
    data = list(zip(x.split(CHUNK), y.split(CHUNK)))
    tops, products = [], [0]
    for layer in discover_layers(model, x[:2]):
        op = operator(model, CE, list(layer.params.values()), data, check_deterministic=False,
                      num_data=x.shape[0]).to_scipy()

        def matvec(v, op=op):
            products[0] += 1
            return op.matvec(v)

        counted = LinearOperator(op.shape, matvec=matvec, dtype=op.dtype)
        tops.append(float(eigsh(counted, k=1, which="LA", tol=tol, return_eigenvectors=False)[0]))
    return np.array(tops), products[0]


def ours(kind: str, model, x, y, setting: Setting, tol: float) -> tuple[np.ndarray, int]:
    """Ours: the top eigenvalues and the block products used (0 for the exact Gram paths)."""
    if kind == "hessian":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            spec = layer_top_eigenvalues(model, CE, x, y, tol=tol, max_iter=500, chunk_size=CHUNK)
        return spec.top, int(sum(spec.iterations))
    labels = "true" if kind == "ef" else setting.ggn_labels
    return layer_fisher_eigenvalues(model, CE, x, y, labels=labels, debias=False).top, 0


def timed(fns, repeats: int) -> list[tuple]:
    """``[(result of the last call, best wall time)]`` of each of ``fns``, called in turn."""
    best, out = [float("inf")] * len(fns), [None] * len(fns)
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            start = time.perf_counter()
            out[k] = fn()
            best[k] = min(best[k], time.perf_counter() - start)
    return list(zip(out, best))


def relative(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)) / np.abs(np.asarray(b))))


def measure(setting: Setting, kind: str, quick: bool, repeats: int) -> dict:
    n = setting.quick_samples if quick else setting.samples
    model, x, y = build(setting, n)
    ((ours_top, ours_products), ours_s), ((peer_top, peer_products), peer_s) = timed(
        [lambda: ours(kind, model, x, y, setting, setting.tol), lambda: peer(kind, model, x, y, setting.tol)], repeats)
    row = {"model": setting.name, "samples": n, "layers": len(ours_top), "tol": setting.tol, "curvature": kind,
           "ours_labels": {"hessian": "-", "ef": "true"}.get(kind, setting.ggn_labels),
           "ours_s": ours_s, "peer_s": peer_s, "speedup": peer_s / ours_s,
           "ours_products": ours_products, "peer_products": peer_products,
           "rel_diff": relative(ours_top, peer_top), "ours_top": ours_top.tolist(), "peer_top": peer_top.tolist()}
    if kind == "hessian":
        reference, _ = ours(kind, model, x, y, setting, setting.reference_tol)
        row.update(reference_tol=setting.reference_tol, ours_err=relative(ours_top, reference),
                   peer_err=relative(peer_top, reference))
    print(f"{setting.name} {NAMES[kind]}: ours {ours_s:.2f} s, curvlinops {peer_s:.2f} s, "
          f"rel. diff {row['rel_diff']:.1e}", flush=True)
    return row


def report(saved: dict) -> str:
    lines = [f"`{saved['command']}` — {saved['machine']['cpus']}-CPU machine, torch threads "
             f"{saved['config']['threads']}, times the best of {saved['config']['repeats']}", "",
             "| model (samples, layers, tol) | curvature | ours (s) | curvlinops (s) | speed-up | products ours / "
             "curvlinops | max rel. diff | rel. error vs reference: ours / curvlinops |",
             "|---|---|---|---|---|---|---|---|"]
    for r in saved["runs"]:
        label = "" if r["ours_labels"] in ("-", "true", "expected") else f" (ours: {r['ours_labels']} labels)"
        error = f"{r['ours_err']:.1e} / {r['peer_err']:.1e} (ref. tol {r['reference_tol']:g})" if "ours_err" in r \
            else "Monte-Carlo estimate: not the same quantity" if r["ours_labels"] == "sampled" else "exact Gram / –"
        lines.append(f"| {r['model']} ({r['samples']}, {r['layers']}, {r['tol']:g}) | {NAMES[r['curvature']]}{label} | "
                     f"{r['ours_s']:.2f} | {r['peer_s']:.2f} | {r['speedup']:.1f}× | "
                     f"{r['ours_products'] or '–'} / {r['peer_products']} | {r['rel_diff']:.1e} | {error} |")
    return "\n".join(lines)


def peak_memory() -> None:
    """Peak RSS of this process before and after the default curvature on the ResNet-18."""
    model, x, y = build(SETTINGS[-1], DEFAULT_SAMPLES["fisher"])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    start = time.perf_counter()
    layer_curvature(model, CE, x, y)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"resnet18, layer_curvature defaults (Fisher blocks), {x.shape[0]} samples: "
          f"{time.perf_counter() - start:.1f} s, peak RSS {after:.2f} GB ({before:.2f} GB before the call)")


def main(argv=None) -> None:
    parser = benchmark_parser("curvature_peers", __doc__.split("\n")[0],
                              skip_help="mlp, cnn, resnet18, or MODEL/hessian, MODEL/ef, MODEL/ggn")
    parser.add_argument("--repeats", type=int, default=1, help="time each measurement this often, keep the best")
    parser.add_argument("--memory", action="store_true", help="only the peak RSS of the default curvature")
    args = parse_args(parser, argv, unused=("seeds", "workers", "executor"))
    if args.report:
        print_report(args.report, report)
        return
    torch.set_num_threads(args.threads)
    if args.memory:
        peak_memory()
        return
    start = time.perf_counter()
    rows = [measure(setting, kind, args.quick, args.repeats) for setting in SETTINGS
            for kind in CURVATURES if not is_skipped(args.skip, setting.name, kind)]
    config = {"threads": args.threads, "repeats": args.repeats, "quick": args.quick, "chunk": CHUNK,
              "settings": [vars(s) for s in SETTINGS]}
    out = write_results(args.out, args, config=config, rows=rows, summary=[], wall_seconds=time.perf_counter() - start)
    print_report(out / "results.json", report, out_dir=out)


if __name__ == "__main__":
    main()
