"""Transport keys: how much "forgotten" knowledge is still readable from the updated network.

After a model learns task A (weights θ_A) and then task B (θ_AB), its task-A accuracy drops. The
stitched model

    ŷ = head_A( f^A_{>ℓ}( T_ℓ( f^{AB}_{≤ℓ}(x) ) ) )

keeps the updated early layers, reuses the checkpoint's late layers and head (never retrained)
and joins them at stage ℓ by a small *key* T_ℓ fitted, without labels, on paired anchor
activations ``u_i = f^{AB}_{≤ℓ}(x_i)`` and ``v_i = f^A_{≤ℓ}(x_i)`` of a few task-A inputs.
If a key recovers task-A accuracy, the early layers still carry the information: it drifted
(``channel`` key: per-channel scale and shift) or moved to another basis (``cross_channel``
key: channel mixing), rather than being erased.

Closed forms (ridge least squares in float64, λ relative to the anchors' mean channel energy,
``λ = ridge · tr(ŨᵀŨ) / C`` with Ũ the centred activations):

* ``identity``: ``T(u) = u`` (the "no key" control);
* ``channel``: ``s_c = Cov(u_c, v_c) / (Var(u_c) + λ)``, ``b_c = μ_v − s_c μ_u``; a dead
  channel (zero variance, λ = 0) gets ``s_c = 0``, i.e. the anchor mean of ``v_c``;
* ``cross_channel``: ``M = ṼᵀŨ (ŨᵀŨ + λI)⁻¹``, ``b = μ_v − M μ_u`` (λ = 0: the
  pseudo-inverse fit of model-stitching work); a 1×1 convolution on conv maps;
* ``procrustes``: the orthogonal ``R`` closest to mapping Ũ onto Ṽ (SVD of ŨᵀṼ), plus a shift.

Conv maps ``(N, C, H, W)`` contribute every spatial position of every anchor as one sample,
token sequences ``(N, T, C)`` every token, flat features ``(N, C)`` every anchor. The relative fit
residual ``‖V − T(U)‖² / ‖V − μ_v‖²`` (fraction of unexplained variance) is stored on the key.

Stitching is in :mod:`~avalanche_plugins.transport.stitch`, label-free refinement in
:mod:`~avalanche_plugins.transport.refine`, controls and the recovery fraction in
:mod:`~avalanche_plugins.transport.controls`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from avalanche_plugins.core.checks import (
    check_choice,
    check_finite,
    check_int,
    check_nonempty,
    check_not_meta,
    check_positive,
)

__all__ = ["FAMILIES", "LAYOUTS", "TransportKey", "class_balanced_anchors", "fit_transport_key"]

FAMILIES = ("identity", "channel", "cross_channel", "procrustes")
LAYOUTS = ("flat", "channels_first", "tokens")


# ------------------------------------------------------------------------------------------------
# anchors


def _targets_of(data) -> torch.Tensor:
    if hasattr(data, "targets"):
        return torch.as_tensor([int(t) for t in data.targets])
    return torch.as_tensor([int(data[i][1]) for i in range(len(data))])


def class_balanced_anchors(data, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``⌊n / K⌋`` random samples of each of the ``K`` classes of ``data``, as ``(inputs, targets)``.

    ``data`` is an ``(inputs, targets)`` pair of tensors or a dataset whose items start with
    ``(x, y)`` (an Avalanche dataset, a ``TensorDataset``). The set has ``K·⌊n/K⌋`` anchors, class
    by class; the same ``seed`` picks the same anchors.

    Raises ``ValueError`` when ``n < K`` or a class has fewer than ``⌊n/K⌋`` samples.

    Example:
        >>> x, y = torch.randn(30, 4), torch.arange(30) % 3
        >>> xa, ya = class_balanced_anchors((x, y), 6, seed=0)
        >>> ya.tolist()
        [0, 0, 1, 1, 2, 2]
    """
    check_int("n", n)
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], torch.Tensor):
        inputs, targets = data
        targets = torch.as_tensor(targets)
        if inputs.shape[0] != targets.shape[0]:
            raise ValueError(f"inputs has {inputs.shape[0]} samples but targets has {targets.shape[0]}")
        dataset = None
    else:
        inputs, dataset = None, data
        targets = _targets_of(data)
    if targets.numel() == 0:
        raise ValueError("data is empty: anchors need at least one sample per class")
    classes = targets.unique()
    per_class = n // len(classes)
    if per_class == 0:
        raise ValueError(f"n={n} is smaller than the number of classes ({len(classes)})")
    g = torch.Generator().manual_seed(seed)
    picked = []
    for c in classes.tolist():
        idx = (targets == c).nonzero().flatten()
        if len(idx) < per_class:
            raise ValueError(f"class {c} has {len(idx)} samples, fewer than the {per_class} anchors "
                             f"per class that n={n} asks for")
        picked.append(idx[torch.randperm(len(idx), generator=g)[:per_class]].sort().values)
    index = torch.cat(picked)
    if dataset is None:
        return inputs[index], targets[index]
    xs = [torch.as_tensor(dataset[i][0]) for i in index.tolist()]
    return torch.stack(xs), targets[index]


# ------------------------------------------------------------------------------------------------
# activations as samples


def _infer_layout(a: torch.Tensor) -> str:
    layouts = {2: "flat", 3: "tokens", 4: "channels_first"}
    if a.dim() not in layouts:
        raise ValueError(f"activations must be (N, C), (N, T, C) tokens or (N, C, H, W) maps, "
                         f"got shape {tuple(a.shape)}")
    return layouts[a.dim()]


def _channel_dim(layout: str) -> int:
    return 1 if layout == "channels_first" else -1


def _as_samples(a: torch.Tensor, layout: str) -> torch.Tensor:
    """``(samples, C)``: every position of a conv map and every token is one sample."""
    if layout == "channels_first":
        a = a.movedim(1, -1)
    return a.reshape(-1, a.shape[-1])


# ------------------------------------------------------------------------------------------------
# the key


class TransportKey(nn.Module):
    """A fitted key ``T``: ``T(u) = s ⊙ u + b`` (``channel``), ``M u + b`` (``cross_channel`` and
    ``procrustes``) or ``u`` (``identity``), applied along the channel dimension of ``layout``.

    Built by :func:`fit_transport_key`; construct directly only to load a saved ``state_dict``
    (or use :meth:`from_state_dict`, which reads the family and sizes from it).

    Attributes:
        residual: relative fit residual ``‖V − T(U)‖² / ‖V − μ_v‖²`` on the anchors (NaN if unknown).
    """

    def __init__(self, family: str, in_channels: int, out_channels: int | None = None,
                 layout: str = "flat"):
        super().__init__()
        check_choice("family", family, FAMILIES)
        check_choice("layout", layout, LAYOUTS)
        check_int("in_channels", in_channels)
        out_channels = in_channels if out_channels is None else out_channels
        check_int("out_channels", out_channels)
        if family != "cross_channel" and out_channels != in_channels:
            raise ValueError(f"family={family!r} maps C channels to C channels, got in_channels="
                             f"{in_channels} and out_channels={out_channels}")
        self.family, self.layout = family, layout
        self.in_channels, self.out_channels = in_channels, out_channels
        self.residual = math.nan
        if family == "channel":
            self.scale = nn.Parameter(torch.ones(in_channels), requires_grad=False)
        elif family in ("cross_channel", "procrustes"):
            self.weight = nn.Parameter(torch.eye(out_channels, in_channels), requires_grad=False)
        if family != "identity":
            self.bias = nn.Parameter(torch.zeros(out_channels), requires_grad=False)

    @property
    def num_parameters(self) -> int:
        """Stored numbers of the key (``2C`` channel, ``C_out·C_in + C_out`` matrix keys)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        if self.family == "identity":
            return u
        dim = _channel_dim(self.layout)
        if u.shape[dim] != self.in_channels:
            raise ValueError(f"the key expects {self.in_channels} channels in dim {dim}, got shape "
                             f"{tuple(u.shape)}")
        h = u.movedim(1, -1) if self.layout == "channels_first" else u
        h = h * self.scale + self.bias if self.family == "channel" else h @ self.weight.T + self.bias
        return h.movedim(-1, 1) if self.layout == "channels_first" else h

    def get_extra_state(self):
        return {"family": self.family, "layout": self.layout, "in_channels": self.in_channels,
                "out_channels": self.out_channels, "residual": self.residual}

    def set_extra_state(self, state):
        for key in ("family", "layout", "in_channels", "out_channels"):
            if state[key] != getattr(self, key):
                raise ValueError(f"state_dict is for {key}={state[key]!r}, this key has "
                                 f"{getattr(self, key)!r}")
        self.residual = state["residual"]

    @classmethod
    def from_state_dict(cls, state_dict) -> TransportKey:
        """Rebuild a key saved with ``torch.save(key.state_dict(), path)``."""
        extra = state_dict["_extra_state"]
        key = cls(extra["family"], extra["in_channels"], extra["out_channels"], extra["layout"])
        key.load_state_dict(state_dict)
        return key

    def extra_repr(self) -> str:
        return (f"family={self.family}, in_channels={self.in_channels}, "
                f"out_channels={self.out_channels}, layout={self.layout}, residual={self.residual:.3g}")


def fit_transport_key(u: torch.Tensor, v: torch.Tensor, family: str = "channel", *,
                      ridge: float = 1e-4, layout: str | None = None) -> TransportKey:
    """Fit ``T`` with ``T(u_i) ≈ v_i`` in closed form (module docstring for the formulas).

    Args:
        u: updated model's activations at the stage, ``(N, C)``, ``(N, T, C)`` or ``(N, C, H, W)``.
        v: the checkpoint's activations for the same anchors, same shape except the channel count
            (which may differ only for ``cross_channel``).
        family: ``"identity"``, ``"channel"``, ``"cross_channel"`` or ``"procrustes"``.
        ridge: relative ridge ``λ / (tr(ŨᵀŨ)/C)``, ≥ 0. With ``ridge=0`` the matrix fit is the
            pseudo-inverse one and needs more samples than channels.
        layout: ``"flat"``, ``"tokens"`` or ``"channels_first"``; inferred from ``u.dim()`` (2, 3, 4)
            when None.

    Returns:
        a :class:`TransportKey` (same dtype and device as ``u``) with ``residual`` set.

    Example:
        >>> v = torch.randn(20, 3, 4, 4)
        >>> u = 2.0 * v + 1.0                      # per-channel drift
        >>> key = fit_transport_key(u, v, "channel", ridge=0.0)
        >>> torch.allclose(key(u), v, atol=1e-5), key.num_parameters
        (True, 6)
    """
    c_in, c_out, layout = _check_key_inputs(u, v, family, ridge, layout)
    key = TransportKey(family, c_in, c_out, layout).to(device=u.device, dtype=u.dtype)
    U = _as_samples(u.detach(), layout).double()
    V = _as_samples(v.detach(), layout).double()
    anchors = _centred_anchors(U, V, family, ridge)
    with torch.no_grad():
        for name, value in _FITS[family](anchors).items():
            getattr(key, name).copy_(value)
        fitted = _as_samples(key.double()(_from_samples(U, u, layout)), layout)
        key.to(u.dtype)
        key.residual = _relative_residual(anchors, fitted)
    return key


def _check_key_inputs(u, v, family: str, ridge: float, layout: str | None) -> tuple[int, int, str]:
    """The entry checks of :func:`fit_transport_key`: non-empty finite tensors, a known family,
    ``ridge ≥ 0``, a known (or inferred) layout, ``u`` and ``v`` pairing the same anchors and
    positions, equal channel counts unless ``cross_channel``. Returns ``(C_in, C_out, layout)``."""
    check_nonempty(u, "u")
    check_nonempty(v, "v")
    check_choice("family", family, FAMILIES)
    check_positive("ridge", ridge, allow_zero=True)
    for name, a in (("u", u), ("v", v)):
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(a).__name__}")
        if a.dim() == 0 or a.shape[0] == 0:
            raise ValueError(f"{name} is empty: at least one anchor is needed")
        check_not_meta(a, name)
        check_finite(name, a)
    layout = _infer_layout(u) if layout is None else layout
    check_choice("layout", layout, LAYOUTS)
    dim = _channel_dim(layout)
    other_u = [s for i, s in enumerate(u.shape) if i != dim % u.dim()]
    other_v = [s for i, s in enumerate(v.shape) if i != dim % v.dim()]
    if u.dim() != v.dim() or other_u != other_v:
        raise ValueError(f"u {tuple(u.shape)} and v {tuple(v.shape)} must pair the same anchors "
                         f"(and positions/tokens); only the channel dim {dim} may differ")
    c_in, c_out = u.shape[dim], v.shape[dim]
    if family != "cross_channel" and c_in != c_out:
        raise ValueError(f"family={family!r} needs as many channels in u as in v, got {c_in} and "
                         f"{c_out}; use family='cross_channel'")
    return c_in, c_out, layout


@dataclass(frozen=True)
class _Anchors:
    """The anchor samples of a fit, float64 ``(samples, C)``: ``U``, ``V``, their means ``mu_u``,
    ``mu_v``, the centred ``Uc = U − μ_u``, ``Vc = V − μ_v`` and the absolute ridge ``lam``."""

    U: torch.Tensor
    V: torch.Tensor
    mu_u: torch.Tensor
    mu_v: torch.Tensor
    Uc: torch.Tensor
    Vc: torch.Tensor
    lam: float


def _centred_anchors(U: torch.Tensor, V: torch.Tensor, family: str, ridge: float) -> _Anchors:
    """Centre the anchors and scale the ridge: ``λ = ridge · tr(ŨᵀŨ) / C``. ``ValueError`` for a
    ridge-free fit with no more samples than channels and for constant ``u`` (no key but
    ``identity`` can be fitted on either)."""
    m, c_in = U.shape
    if family in ("channel", "cross_channel", "procrustes") and ridge == 0 and m <= c_in:
        raise ValueError(f"{m} samples for {c_in} channels: a ridge-free fit needs more samples than "
                         "channels; pass ridge > 0 or more anchors")
    mu_u, mu_v = U.mean(0), V.mean(0)
    Uc, Vc = U - mu_u, V - mu_v
    if family != "identity" and not bool((Uc != 0).any()):
        raise ValueError("u is constant across the anchors (e.g. all-zero, dead activations): there is "
                         "nothing to fit a key on; use other anchors or another stage")
    lam = ridge * float((Uc * Uc).sum()) / c_in
    return _Anchors(U=U, V=V, mu_u=mu_u, mu_v=mu_v, Uc=Uc, Vc=Vc, lam=lam)


def _identity_fit(a: _Anchors) -> dict[str, torch.Tensor]:
    """``T(u) = u``: nothing to fit."""
    return {}


def _channel_fit(a: _Anchors) -> dict[str, torch.Tensor]:
    """``s_c = Cov(u_c, v_c) / (Var(u_c) + λ)`` (0 for a dead channel at λ = 0),
    ``b_c = μ_v − s_c μ_u``."""
    denom = (a.Uc * a.Uc).sum(0) + a.lam
    scale = torch.where(denom > 0, (a.Uc * a.Vc).sum(0) / denom.clamp_min(1e-300),
                        torch.zeros_like(denom))
    return {"scale": scale, "bias": a.mu_v - scale * a.mu_u}


def _cross_channel_fit(a: _Anchors) -> dict[str, torch.Tensor]:
    """``M = ṼᵀŨ (ŨᵀŨ + λI)⁻¹`` (λ = 0: the pseudo-inverse), ``b = μ_v − M μ_u``."""
    gram = a.Uc.T @ a.Uc
    if a.lam > 0:
        gram = gram + a.lam * torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
        weight = torch.linalg.solve(gram, a.Uc.T @ a.Vc).T
    else:
        weight = (torch.linalg.pinv(gram) @ (a.Uc.T @ a.Vc)).T
    return {"weight": weight, "bias": a.mu_v - weight @ a.mu_u}


def _procrustes_fit(a: _Anchors) -> dict[str, torch.Tensor]:
    """The orthogonal ``R = (L Rᵀ)ᵀ`` from the SVD ``ŨᵀṼ = L Σ Rᵀ`` (the rotation closest to
    mapping Ũ onto Ṽ), ``b = μ_v − R μ_u``."""
    left, _, right_t = torch.linalg.svd(a.Uc.T @ a.Vc)
    weight = (left @ right_t).T
    return {"weight": weight, "bias": a.mu_v - weight @ a.mu_u}


# the closed-form fit of each family: the key's parameters (float64) by attribute name
_FITS = {"identity": _identity_fit, "channel": _channel_fit, "cross_channel": _cross_channel_fit,
         "procrustes": _procrustes_fit}


def _relative_residual(a: _Anchors, fitted: torch.Tensor) -> float:
    """``‖V − T(U)‖² / ‖V − μ_v‖²`` (0 for an exact fit of constant ``v``, inf otherwise then)."""
    total = float((a.Vc * a.Vc).sum())
    err = float(((a.V - fitted) ** 2).sum())
    return err / total if total > 0 else (0.0 if err == 0 else math.inf)

def _from_samples(samples: torch.Tensor, like: torch.Tensor, layout: str) -> torch.Tensor:
    """Inverse of :func:`_as_samples` for a tensor shaped like ``like``."""
    if layout == "channels_first":
        shape = (like.shape[0], *like.shape[2:], samples.shape[-1])
        return samples.reshape(shape).movedim(-1, 1)
    return samples.reshape(*like.shape[:-1], samples.shape[-1])


# ------------------------------------------------------------------------------------------------
# stitching


# ------------------------------------------------------------------------------------------------
# controls and recovery


