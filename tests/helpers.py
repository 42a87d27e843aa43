"""Shared test helpers: a dense Hessian to check fast paths against, checkpoint/resume runs."""

import torch
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
