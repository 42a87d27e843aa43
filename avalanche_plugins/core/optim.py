"""One functional SGD / Adam step, shared by every estimator that simulates training.

``k_step_gain`` runs many stacked training runs, ADS probes the path of a few full-batch steps,
and the structural masks replay Adam's update for re-activated units. All of them need the same
update rule, written once here on plain dicts of tensors (no ``torch.optim`` object, so the
parameters can be stacked, vmapped or indexed freely).

.. math::
    m_t = β_1 m_{t-1} + (1-β_1) g, \\quad v_t = β_2 v_{t-1} + (1-β_2) g^2, \\quad
    Δ_t = η \\frac{m_t / (1-β_1^t)}{\\sqrt{v_t / (1-β_2^t)} + ε}

and ``Δ = η g`` for SGD; the parameters move by ``-Δ``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["OPTIMIZERS", "AdamState", "adam_update", "functional_step"]

OPTIMIZERS = ("sgd", "adam")


class AdamState:
    """Adam's first and second moments for a dict of tensors, with a shared step count.

    Example:
        >>> state = AdamState({"w": torch.zeros(2)})
        >>> state.step, sorted(state.first)
        (0, ['w'])
    """

    def __init__(self, like: Mapping[str, torch.Tensor], *, betas=(0.9, 0.999), eps: float = 1e-8,
                 step: int = 0):
        self.first = {name: torch.zeros_like(t) for name, t in like.items()}
        self.second = {name: torch.zeros_like(t) for name, t in like.items()}
        self.betas = tuple(betas)
        self.eps = float(eps)
        self.step = int(step)


def adam_update(first: torch.Tensor, second: torch.Tensor, step, lr: float, betas, eps: float
                ) -> torch.Tensor:
    """``η m̂ / (√v̂ + ε)`` from Adam's moments after ``step`` updates (``step`` may be a tensor
    of per-entry counts that broadcasts against the moments).

    Example:
        >>> adam_update(torch.tensor([0.1]), torch.tensor([0.001]), 1, 0.5, (0.9, 0.999), 0.0)
        tensor([0.5000])
    """
    beta1, beta2 = betas
    denom = (second / (1 - beta2 ** step)).sqrt().add_(eps)
    return lr * (first / (1 - beta1 ** step)) / denom


def functional_step(params: dict, grads: Mapping[str, torch.Tensor], lr: float, *,
                    optimizer: str = "sgd", state: AdamState | None = None,
                    in_place: bool = True) -> dict:
    """One SGD or Adam step on ``params`` (a dict of tensors) with gradients ``grads``.

    Returns the update ``Δ`` per name (the parameters move by ``-Δ``). With ``in_place=True`` the
    tensors of ``params`` are updated in place; otherwise ``params`` is left alone and the caller
    applies ``Δ``. Adam needs ``state`` (:class:`AdamState`), whose moments and step count advance.

    Example:
        >>> p = {"w": torch.tensor([1.0])}
        >>> functional_step(p, {"w": torch.tensor([2.0])}, 0.25)["w"], p["w"]
        (tensor([0.5000]), tensor([0.5000]))
        >>> s = AdamState(p)
        >>> functional_step(p, {"w": torch.tensor([-3.0])}, 0.1, optimizer="adam", state=s)["w"]
        tensor([-0.1000])
    """
    if optimizer == "sgd":
        updates = {name: lr * g for name, g in grads.items()}
    elif optimizer == "adam":
        if state is None:
            raise ValueError("optimizer='adam' needs state=AdamState(params)")
        state.step += 1
        beta1, beta2 = state.betas
        updates = {}
        for name, g in grads.items():
            state.first[name].mul_(beta1).add_(g, alpha=1 - beta1)
            state.second[name].mul_(beta2).addcmul_(g, g, value=1 - beta2)
            updates[name] = adam_update(state.first[name], state.second[name], state.step, lr,
                                        state.betas, state.eps)
    else:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if in_place:
        for name, update in updates.items():
            params[name].sub_(update)
    return updates
