"""The settings of the Grow vs Prune benchmark: the methods, one :class:`Setting` per stream × network, and their models and optimizers."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import yaml
from torch import nn

from avalanche_plugins.study.catalog.zoo import build_model

_DATA = yaml.safe_load((Path(__file__).parent / "settings.yaml").read_text(encoding="utf-8"))
GROW_VARIANTS = _DATA["grow_variants"]  # method -> GrowPlugin interventions
METHODS = ("dense", "prune", "prune+norewind", *GROW_VARIANTS)  # prune+norewind: IMP without rewinding


@dataclass
class Setting:
    """One data/model setting; every method and compactness runs on it."""

    name: str
    dataset: str = "digits"
    scenario: str = "split"
    n_experiences: int = 5
    model: str = "mlp"
    hidden: tuple[int, ...] = (128, 128)
    widths: tuple[int, ...] = (16, 32)
    epochs: int = 4  # per experience; one cycle per epoch
    edits: int = 3  # edit cycles to reach the target
    lr: float = 0.01
    momentum: float = 0.9
    optimizer: str = "sgd"  # or "adam" (lr 1e-3), where the optimizer-state interventions differ
    batch_size: int = 32
    replay_per_class: int = 5
    data_root: str | None = None
    epochs_per_cycle: int = 1  # > 1 on the plasticity stream: one edit per experience, E epochs to integrate
    ticket: bool = True  # retrain the final mask as a ticket (off on the plasticity stream)
    subset: int | None = None  # MNIST / Fashion-MNIST: the first N train / N // 2 test images (cost)
    edit_epoch: int = 0  # epochs into each cycle at which its edit happens (0: at its start; DelayedEditClock)
    leaky: bool = False  # leaky ReLU (slope 0.01) for every method: a plasticity-preserving activation


_LEAKY = functools.partial(nn.functional.leaky_relu, negative_slope=0.01)


def uses_leaky(setting: Setting, method: str) -> bool:
    """Leaky ReLU for this run: the setting's activation for every method, or ``grow+leaky``."""
    return setting.leaky or method == "grow+leaky"


def make_model(setting: Setting, n_classes: int, input_shape, leaky: bool = False) -> nn.Module:
    if setting.model == "mlp":
        return build_model("mlp", input_shape, n_classes, hidden=setting.hidden,
                           activation=nn.LeakyReLU if leaky else nn.ReLU)
    return build_model("cnn", input_shape, n_classes, widths=setting.widths)


def make_optimizer(setting: Setting, params):
    if setting.optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    return torch.optim.SGD(params, lr=setting.lr, momentum=setting.momentum)


def settings_for(args) -> list[Setting]:
    """The settings of the command (what each is for: docs/benchmarks.md, "Settings")."""
    quick = args.quick
    common = dict(epochs=2 if quick else 4, edits=2 if quick else 3)
    out = [Setting("mlp split digits", hidden=(64, 64) if quick else (128, 128), **common),
           Setting("cnn split digits", model="cnn", widths=(8, 16) if quick else (16, 32), **common)]
    if not quick:
        out.append(Setting("mlp iid digits", n_experiences=1, epochs=8, edits=3))
    if args.data_root:
        split = dict(epochs=2 if quick else 3, edits=2, batch_size=64, data_root=args.data_root)
        for dataset, subset in (("fashion_mnist", getattr(args, "fashion_subset", None)), ("mnist", None)):
            out += [Setting(f"mlp split {dataset}", hidden=(256, 256), dataset=dataset, subset=subset, **split),
                    Setting(f"cnn split {dataset}", model="cnn", widths=(32, 64), dataset=dataset, subset=subset,
                            **split)]
        mnist = dict(dataset="mnist", data_root=args.data_root, batch_size=64)
        if not quick:
            out.append(Setting("mlp iid mnist", n_experiences=1, hidden=(256, 256), epochs=6, edits=3, **mnist))
        out.append(Setting("cnn iid mnist", model="cnn", n_experiences=1, widths=tuple(args.cnn_widths),
                           epochs=6, edits=3, lr=args.cnn_lr, **mnist))
        permuted = dict(scenario="permuted", n_experiences=args.permuted_experiences,
                        hidden=(256, 256), edits=args.permuted_experiences - 1, ticket=False,
                        subset=args.permuted_subset, **mnist)
        for e in args.integration_epochs:
            out.append(Setting(f"mlp permuted mnist E{e}", epochs=e, epochs_per_cycle=e,
                               **permuted))
        t = args.fixed_budget_epochs
        for e in (e for e in args.integration_epochs if e <= t):
            out.append(Setting(f"mlp permuted mnist T{t} E{e}", epochs=t, epochs_per_cycle=t,
                               edit_epoch=t - e, **permuted))
            out.append(replace(out[-1], name=f"mlp leaky permuted mnist T{t} E{e}", leaky=True))
            out.append(replace(out[-2], name=f"mlp random-label mnist T{t} E{e}", scenario="random_labels",
                               replay_per_class=0))
    return out
