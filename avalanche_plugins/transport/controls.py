"""Controls for transport keys and the recovery fraction.

``channel_permutation`` applies a fitted key to channel-permuted activations;
``correspondence_break`` fits a key on mispaired anchors (globally or within class). A real key
must beat both. :func:`control_keys` builds all three for one fitted key (the metric and the
benchmark use it). :func:`recovery` is the fraction of the lost accuracy a key brings back.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import nn

from avalanche_plugins.core.checks import check_choice
from avalanche_plugins.transport.keys import TransportKey, _channel_dim, fit_transport_key

__all__ = ["CONTROLS", "Recovery", "channel_permutation", "control_keys", "correspondence_break", "recovery"]

CONTROLS = ("channel_permutation", "global_shuffle", "within_class_shuffle")


class _PermutedChannels(nn.Module):
    def __init__(self, key: TransportKey, permutation: torch.Tensor):
        super().__init__()
        self.key = key
        self.register_buffer("permutation", permutation)

    def forward(self, u):
        return self.key(u.index_select(_channel_dim(self.key.layout) % u.dim(), self.permutation))



def channel_permutation(key: TransportKey, seed: int = 0) -> nn.Module:
    """Control: ``key`` applied to activations whose channels are randomly permuted (seeded).
    If channel identity matters, this should lose what the key recovered.

    Example:
        >>> key = TransportKey("channel", 4)
        >>> channel_permutation(key, seed=0)(torch.arange(4.0).reshape(1, 4)).sort().values
        tensor([[0., 1., 2., 3.]])
    """
    if key.in_channels < 2:
        raise ValueError("channel_permutation needs at least 2 channels")
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(key.in_channels, generator=g)
    while bool((perm == torch.arange(key.in_channels)).all()):
        perm = torch.randperm(key.in_channels, generator=g)
    device = next(key.parameters()).device if key.num_parameters else None
    return _PermutedChannels(key, perm.to(device))



def correspondence_break(u: torch.Tensor, v: torch.Tensor, family: str = "channel", *,
                         mode: str = "global", labels: torch.Tensor | None = None, seed: int = 0,
                         ridge: float = 1e-4, layout: str | None = None) -> TransportKey:
    """Control: a key fitted on mispaired anchors (``u_i`` with ``v_π(i)``).

    ``mode="global"`` shuffles across all anchors; ``"within_class"`` only among anchors of the
    same class (``labels`` needed), which keeps class-level statistics but breaks instance pairing.

    Example:
        >>> v = torch.randn(40, 3)
        >>> key = correspondence_break(v, v, "cross_channel", seed=0)
        >>> key.residual > 0.5
        True
    """
    check_choice("mode", mode, ("global", "within_class"))
    n = u.shape[0]
    g = torch.Generator().manual_seed(seed)
    if mode == "global":
        perm = torch.randperm(n, generator=g)
    else:
        if labels is None or labels.shape[0] != n:
            raise ValueError("mode='within_class' needs labels with one entry per anchor")
        perm = torch.arange(n)
        labels = labels.cpu()  # the permutation is built on the CPU (seeded generator), then moved
        for c in labels.unique():
            idx = (labels == c).nonzero().flatten()
            perm[idx] = idx[torch.randperm(len(idx), generator=g)]
    return fit_transport_key(u, v[perm.to(v.device)], family, ridge=ridge, layout=layout)



@dataclass(frozen=True)
class Recovery:
    """``(acc_key − acc_AB) / (acc_A − acc_AB)``; NaN with ``reason`` when it is undefined."""

    value: float
    reason: str | None = None

    def __float__(self) -> float:
        return self.value



def recovery(acc_key: float, acc_updated: float, acc_checkpoint: float, *,
             min_forgetting: float = 1e-6) -> Recovery:
    """Fraction of the forgotten accuracy that the key brings back:
    ``(acc_key − acc_AB) / (acc_A − acc_AB)`` (1 = all of it, 0 = none, < 0 = worse than θ_AB).

    Undefined (``value`` NaN, ``reason`` set) when ``acc_A − acc_AB < min_forgetting``.

    Example:
        >>> round(recovery(0.8, 0.5, 0.9).value, 6)
        0.75
        >>> recovery(0.8, 0.9, 0.9).reason
        'nothing was forgotten: acc_checkpoint - acc_updated = 0 < 1e-06'
    """
    for name, a in (("acc_key", acc_key), ("acc_updated", acc_updated), ("acc_checkpoint", acc_checkpoint)):
        if isinstance(a, bool) or not isinstance(a, numbers.Real) or not math.isfinite(a):
            raise ValueError(f"{name} must be a finite number, got {a!r}")
    acc_key, acc_updated, acc_checkpoint = float(acc_key), float(acc_updated), float(acc_checkpoint)
    forgotten = acc_checkpoint - acc_updated
    if forgotten < min_forgetting:
        return Recovery(math.nan, f"nothing was forgotten: acc_checkpoint - acc_updated = "
                                  f"{forgotten:.3g} < {min_forgetting:g}")
    return Recovery((acc_key - acc_updated) / forgotten)


def control_keys(key: TransportKey, u: torch.Tensor, v: torch.Tensor, family: str, labels: torch.Tensor,
                 *, seed: int = 0, ridge: float = 1e-4, layout: str | None = None) -> dict[str, nn.Module]:
    """The three controls of a key fitted on ``(u, v)``, by name (:data:`CONTROLS` order): the key on
    channel-permuted activations, and keys fitted on globally / within-class mispaired anchors.

    Example:
        >>> u, v = torch.randn(20, 4), torch.randn(20, 4)
        >>> key = fit_transport_key(u, v, "channel")
        >>> list(control_keys(key, u, v, "channel", torch.arange(20) % 2))
        ['channel_permutation', 'global_shuffle', 'within_class_shuffle']
    """
    controls = {"channel_permutation": channel_permutation(key, seed)}
    for mode in ("global", "within_class"):
        controls[f"{mode}_shuffle"] = correspondence_break(u, v, family, mode=mode, labels=labels, seed=seed,
                                                           ridge=ridge, layout=layout)
    return controls
