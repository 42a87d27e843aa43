"""Shared test helpers: tiny models and a dense Hessian to check fast paths against."""

import torch
from torch import nn
from torch.func import functional_call

from avalanche_plugins.core.layers import discover_layers


def dense_block_eigenvalues(model, loss_fn, x, y):
    """Exact eigenvalues of every layer's Hessian block (torch.autograd.functional.hessian)."""
    model.eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = dict(model.named_buffers())
    result = []
    for layer in discover_layers(model, x[:2]):
        names = list(layer.params)
        shapes = [params[n].shape for n in names]
        flat0 = torch.cat([params[n].flatten() for n in names])

        def loss_of(flat, names=names, shapes=shapes):
            block, offset = {}, 0
            for n, s in zip(names, shapes):
                block[n] = flat[offset:offset + s.numel()].view(s)
                offset += s.numel()
            return loss_fn(functional_call(model, {**params, **buffers, **block}, (x,)), y)

        hessian = torch.autograd.functional.hessian(loss_of, flat0)
        result.append(torch.linalg.eigvalsh(hessian.double()))
    return result


def small_mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 3))


def small_bn_cnn(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3),
                        nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))
    net.train()
    with torch.no_grad():
        net(torch.randn(64, 1, 8, 8))  # non-trivial running statistics
    return net


def train_with_checkpoints(fresh, experiences, path, *, resume_at=None, **train_kwargs):
    """Train a strategy from ``fresh()`` on ``experiences``, saving an Avalanche checkpoint after each.

    With ``resume_at=i`` a second ``fresh()`` strategy loads the checkpoint before experience ``i``,
    as a restarted process would; comparing with ``resume_at=None`` tests checkpoint/resume.
    """
    from avalanche.checkpointing import maybe_load_checkpoint, save_checkpoint

    strategy = fresh()
    for i, experience in enumerate(experiences):
        if i == resume_at:
            strategy, start = maybe_load_checkpoint(fresh(), path)
            assert start == resume_at
        strategy.train(experience, **train_kwargs)
        save_checkpoint(strategy, path)
    return strategy
