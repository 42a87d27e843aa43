"""The online training loop (batch 1, one pass per task; docs "Training loop") and the minibatch
learner."""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import nn


class OnlineLearner:
    """Batch-1 online training of a Linear+ReLU ``MLP`` in NumPy, in place on the model
    (``optimizer``, ``loss``: docs/benchmarks.md, "Training loop")."""

    def __init__(self, model: nn.Module, optimizer: str, lr: float, loss: str,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        if optimizer not in ("adam", "sgd") or loss not in ("mse", "ce"):
            raise ValueError(f"unsupported optimizer/loss {optimizer!r}/{loss!r}")
        self.model, self.optimizer, self.lr, self.loss = model, optimizer, lr, loss
        self.betas, self.eps = betas, eps
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        self.tensors = [p for lin in linears for p in (lin.weight, lin.bias)]
        if [id(p) for p in self.tensors] != [id(p) for p in model.parameters()]:
            raise ValueError("OnlineLearner needs a plain Linear/ReLU MLP (parameters = weights and biases in order)")
        self.W = [lin.weight.detach().numpy() for lin in linears]
        self.b = [lin.bias.detach().numpy() for lin in linears]
        self.steps = 0
        if optimizer == "adam":  # first and second moments of the weights and of the biases
            self.mW, self.vW = [np.zeros_like(w) for w in self.W], [np.zeros_like(w) for w in self.W]
            self.mb, self.vb = [np.zeros_like(b) for b in self.b], [np.zeros_like(b) for b in self.b]

    def train(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One pass over ``(x, y)`` in order, one sample per step; returns the mean online loss."""
        xs = x.reshape(len(x), -1).numpy().astype(np.float32, copy=False)
        ys = y.numpy()
        W, b, n_layers = self.W, self.b, len(self.W)
        mse = self.loss == "mse"
        adam = self.optimizer == "adam"
        lr = self.lr
        beta1, beta2 = self.betas
        eps = self.eps
        total = 0.0
        acts: list = [None] * n_layers
        for i in range(len(xs)):
            h = xs[i]
            for j in range(n_layers - 1):
                acts[j] = h
                h = W[j] @ h + b[j]
                np.maximum(h, 0, out=h)
            acts[n_layers - 1] = h
            out = W[-1] @ h + b[-1]
            if mse:
                diff = out - ys[i]
                total += float(diff @ diff) / diff.size
                delta = (2.0 / diff.size) * diff
            else:
                z = out - out.max()
                e = np.exp(z)
                s = e.sum()
                label = int(ys[i])
                total += math.log(s) - float(z[label])
                delta = e / s
                delta[label] -= 1.0
            self.steps += 1
            if adam:
                t = self.steps
                step_size = lr / (1 - beta1 ** t)
                root_c2 = math.sqrt(1 - beta2 ** t)
            for j in range(n_layers - 1, -1, -1):
                a = acts[j]
                g_w = np.outer(delta, a)
                g_b = delta
                if j > 0:
                    delta = (W[j].T @ delta) * (a > 0)
                if adam:
                    for p, m, v, g in ((W[j], self.mW[j], self.vW[j], g_w), (b[j], self.mb[j], self.vb[j], g_b)):
                        m *= beta1
                        m += (1 - beta1) * g
                        v *= beta2
                        v += (1 - beta2) * (g * g)
                        p -= step_size * m / (np.sqrt(v) / root_c2 + eps)
                else:
                    W[j] -= lr * g_w
                    b[j] -= lr * g_b
        return total / max(len(xs), 1)

    def optimizer_state_dict(self) -> dict:
        """The optimizer state in ``torch.optim.Adam`` / ``torch.optim.SGD`` ``state_dict`` format."""
        params = list(self.model.parameters())
        if self.optimizer == "adam":
            opt = torch.optim.Adam(params, lr=self.lr, betas=self.betas, eps=self.eps)
            state = opt.state_dict()
            moments = [(m, v) for j in range(len(self.W)) for m, v in ((self.mW[j], self.vW[j]), (self.mb[j], self.vb[j]))]
            state["state"] = {i: {"step": torch.tensor(float(self.steps)), "exp_avg": torch.tensor(m.copy()),
                                  "exp_avg_sq": torch.tensor(v.copy())} for i, (m, v) in enumerate(moments)}
            return state
        return torch.optim.SGD(params, lr=self.lr).state_dict()

    def checkpoint(self) -> dict:
        """The model's state, the optimizer's (``torch.optim`` format, a copy) and the step count."""
        return {"model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "optimizer": copy.deepcopy(self.optimizer_state_dict()), "steps": self.steps}


class MinibatchLearner(OnlineLearner):
    """Minibatch ``torch.optim`` training (the declining streams; docs, "Training loop"), with
    :class:`OnlineLearner`'s interface and ``last_accuracy``."""

    def __init__(self, model: nn.Module, optimizer: str, lr: float, loss: str, *, batch_size: int, epochs: int,
                 momentum: float = 0.0, seed: int = 0):
        if optimizer not in ("adam", "sgd") or loss not in ("mse", "ce"):
            raise ValueError(f"unsupported optimizer/loss {optimizer!r}/{loss!r}")
        self.model, self.loss, self.batch_size, self.epochs = model, loss, batch_size, epochs
        params = list(model.parameters())
        self.opt = (torch.optim.Adam(params, lr=lr) if optimizer == "adam"
                    else torch.optim.SGD(params, lr=lr, momentum=momentum))
        self.loss_fn = nn.CrossEntropyLoss() if loss == "ce" else nn.MSELoss()
        self.generator = torch.Generator().manual_seed(50_000 + seed)
        self.steps = 0
        self.last_accuracy = float("nan")

    def train(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """``epochs`` shuffled passes over ``(x, y)``; returns the mean loss of the last pass."""
        self.model.train()
        total = 0.0
        for _ in range(self.epochs):
            order = torch.randperm(len(x), generator=self.generator)
            total = 0.0
            for i in range(0, len(x), self.batch_size):
                b = order[i:i + self.batch_size]
                self.opt.zero_grad(set_to_none=True)
                loss = self.loss_fn(self.model(x[b]), y[b])
                loss.backward()
                self.opt.step()
                self.steps += 1
                total += loss.item() * len(b)
        if self.loss == "ce":
            with torch.no_grad():
                self.last_accuracy = float((self.model(x).argmax(1) == y).float().mean())
        return total / max(len(x), 1)

    def optimizer_state_dict(self) -> dict:
        return self.opt.state_dict()
