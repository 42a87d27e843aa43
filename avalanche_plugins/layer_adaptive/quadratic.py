"""The quadratic EWC penalty and its folding across experiences (torch only).

Every experience ``e`` adds a quadratic ``a_e (θ − θ*_e)²`` per parameter entry (``a_e = λ w_ℓ F``).
Their sum is kept as one quadratic plus a constant, by completing the square:

.. math:: a(θ - m_1)^2 + b(θ - m_2)^2 = (a + b)(θ - m)^2 + \\frac{ab}{a + b}(m_1 - m_2)^2,
          \\qquad m = \\frac{a m_1 + b m_2}{a + b}

(``online`` mode instead decays the old curvature by ``γ`` and moves the anchor to ``θ*``), so the
penalty costs one pass over the parameters whatever the number of experiences.
"""

from __future__ import annotations

import torch

__all__ = ["fold_quadratic", "pad_to", "quadratic_penalty"]


def pad_to(tensor: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Zero-pad at the end of grown dimensions (Avalanche's ``ParamData.expand`` convention).

    Example:
        >>> pad_to(torch.ones(2), torch.Size([3]))
        tensor([1., 1., 0.])
    """
    if tensor.shape == shape:
        return tensor
    if len(shape) != tensor.dim() or any(n < o for n, o in zip(shape, tensor.shape)):
        raise ValueError(f"parameter shrank or changed rank: {tuple(tensor.shape)} -> {tuple(shape)}")
    out = tensor.new_zeros(shape)
    out[tuple(slice(0, s) for s in tensor.shape)] = tensor
    return out


def fold_quadratic(curvature: torch.Tensor | None, anchor: torch.Tensor | None, new_curvature: torch.Tensor,
                   theta: torch.Tensor, *, online: bool = False, decay: float = 1.0):
    """``(curvature, anchor, constant)``: the quadratic ``curvature (θ − anchor)²`` (None: none yet)
    plus ``new_curvature (θ − theta)²``, as one quadratic and the constant it leaves (module
    docstring); ``online``: ``decay · curvature + new_curvature`` anchored at ``theta``, no constant.
    Old tensors are zero-padded to ``theta``'s shape (a grown parameter).

    Example:
        >>> c, m, k = fold_quadratic(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([3.0]), torch.tensor([2.0]))
        >>> c.item(), m.item(), k
        (4.0, 1.5, 3.0)
    """
    if curvature is None:
        return new_curvature, theta.clone(), 0.0
    if online:  # decayed importances accumulate; the anchor moves to θ*
        return decay * pad_to(curvature, theta.shape) + new_curvature, theta.clone(), 0.0
    old_a, old_m = pad_to(curvature, theta.shape), pad_to(anchor, theta.shape)
    total = old_a + new_curvature
    safe = total.where(total > 0, torch.ones_like(total))
    constant = float((old_a * new_curvature / safe * (old_m - theta).pow(2)).sum())
    return total, torch.where(total > 0, (old_a * old_m + new_curvature * theta) / safe, theta), constant


def quadratic_penalty(params: dict, names: list[str], curvature: torch.Tensor, anchor: torch.Tensor):
    """``Σ_i c_i (θ_i − a_i)²`` over the parameters ``names`` of ``params``, with ``curvature`` and
    ``anchor`` flat and aligned with them (differentiable in the parameters).

    One pass per parameter over views of the flat buffers: no concatenated copy of θ, whose
    model-sized temporaries (forward and backward) cost more than the arithmetic on a ResNet-18.

    Example:
        >>> p = {"w": torch.tensor([1.0, 2.0])}
        >>> quadratic_penalty(p, ["w"], torch.tensor([1.0, 0.5]), torch.tensor([0.0, 0.0])).item()
        3.0
    """
    total, offset = 0.0, 0
    for n in names:
        p = params[n]
        size = p.numel()
        c, a = curvature[offset:offset + size].view_as(p), anchor[offset:offset + size].view_as(p)
        total = total + (c * (p - a).pow(2)).sum()
        offset += size
    return total
