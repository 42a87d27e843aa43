"""Fisher estimators against direct loops over minibatches, samples and classes."""

import pytest
import torch
from torch import nn

from avalanche_plugins.layer_adaptive import (
    batched_fisher,
    empirical_fisher,
    expected_fisher,
    fisher_diagonal,
)
from tests.cases import CASES, small_mlp

CE = nn.CrossEntropyLoss()


def grads_of(model, loss):
    return dict(zip([n for n, _ in model.named_parameters()],
                    torch.autograd.grad(loss, list(model.parameters()))))


def loop_fisher(model, x, y, kind, batch_size=4):
    model.eval()
    names = [n for n, _ in model.named_parameters()]
    total = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    if kind == "batched":
        batches = [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, len(x), batch_size)]
        for xb, yb in batches:
            for n, g in grads_of(model, CE(model(xb), yb)).items():
                total[n] += g ** 2
        return {n: total[n] / len(batches) for n in names}
    for i in range(len(x)):
        if kind == "empirical":
            for n, g in grads_of(model, CE(model(x[i:i + 1]), y[i:i + 1])).items():
                total[n] += g ** 2
        else:
            probs = torch.softmax(model(x[i:i + 1]), -1)[0].detach()
            for c in range(len(probs)):
                log_p = torch.log_softmax(model(x[i:i + 1]), -1)[0, c]
                for n, g in grads_of(model, log_p).items():
                    total[n] += probs[c] * g ** 2
    return {n: total[n] / len(x) for n in names}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.parametrize("kind", ["batched", "empirical", "expected"])
def test_estimators_match_direct_loops(case, kind):
    model = case.model()
    torch.manual_seed(3)
    x, y = case.inputs(10), torch.randint(0, 3, (10,))
    fast = fisher_diagonal(kind, model, CE, x, y, batch_size=4)
    slow = loop_fisher(model, x, y, kind)
    for name in slow:
        assert torch.allclose(fast[name], slow[name], rtol=1e-4, atol=1e-8), name


@pytest.mark.parametrize("chunk_size", [1, 2, 4, 1000])
def test_per_sample_fishers_do_not_depend_on_chunk_size(chunk_size):
    # chunk 1 and 2 split one sample's 3 classes over passes, 4 holds one sample per pass
    model = small_mlp()
    torch.manual_seed(4)
    x, y = torch.randn(7, 6), torch.randint(0, 3, (7,))
    for kind in ("empirical", "expected"):
        fast = fisher_diagonal(kind, model, CE, x, y, chunk_size=chunk_size)
        slow = loop_fisher(model, x, y, kind)
        for name in slow:
            assert torch.allclose(fast[name], slow[name], rtol=1e-5, atol=1e-9), (kind, name)


def test_expected_differs_from_empirical_and_all_nonnegative():
    model = small_mlp()
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    emp, exp = empirical_fisher(model, CE, x, y), expected_fisher(model, x)
    assert all((v >= 0).all() for v in exp.values())
    assert not torch.allclose(emp["4.weight"], exp["4.weight"])


def test_batched_needs_batches_and_restores_mode():
    model = small_mlp()
    model.train()
    with pytest.raises(ValueError, match="empty"):
        batched_fisher(model, CE, [])
    batched_fisher(model, CE, [(torch.randn(4, 6), torch.randint(0, 3, (4,)))])
    assert model.training
    with pytest.raises(ValueError, match="fisher must be one of"):
        fisher_diagonal("diagonal", model, CE, torch.randn(4, 6), torch.randint(0, 3, (4,)))
