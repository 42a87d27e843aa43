"""Fallbacks instead of refusals where the math allows (issue 23): ADS through operations without
forward-mode AD (double-vjp; MultiheadAttention's fused path switched off) and per-layer Fisher
curvature on recurrent layers (per-sample gradients one sample at a time where vmap cannot run)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from avalanche_plugins.ads import architecture_driven_shift
from avalanche_plugins.ads.layer_terms import layer_groups, layer_logit_changes
from avalanche_plugins.core.calls import math_attention
from avalanche_plugins.core.layers import discover_layers
from avalanche_plugins.layer_adaptive import layer_fisher_eigenvalues


class _Recurrent(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(3, 4, batch_first=True)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.rnn(x)[0][:, -1])


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        h = self.inp(x)
        return self.fc(self.attn(h, h, h, need_weights=False)[0].mean(1))


def _direct_jvp(model, x, tangent):
    """J(x)·tangent by torch.autograd.functional.jvp (the double-backward trick), model in train
    mode (no fused fast path), dropout-free models only."""
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach() for _, p in model.named_parameters())

    def f(*ps):
        return functional_call(model, dict(zip(names, ps)), (x,))

    with math_attention():  # the flash kernel has no double backward
        return torch.autograd.functional.jvp(f, params, tuple(tangent[n] for n in names))[1]


@pytest.mark.parametrize("build", [lambda: _Recurrent(nn.LSTM), lambda: _Recurrent(nn.GRU), _Attention],
                         ids=["lstm", "gru", "multihead_attention"])
def test_ads_layer_logit_changes_match_the_direct_jvp(build):
    torch.manual_seed(0)
    model, x = build(), torch.randn(5, 6, 3)
    layer_map = discover_layers(model, x[:2])
    groups = layer_groups(model, layer_map)
    direction = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    changes = layer_logit_changes(model, x, direction, groups)
    for group in groups:
        tangent = {n: direction[n] if n in group.params else torch.zeros_like(p) for n, p in model.named_parameters()}
        torch.testing.assert_close(changes[group.name], _direct_jvp(model, x, tangent), atol=1e-5, rtol=1e-4)
    y = torch.randint(0, 2, (5,))
    result = architecture_driven_shift(model, nn.CrossEntropyLoss(), x, x, y, lr=0.1, steps=2)
    assert result.ads > 0 and all(v >= 0 for v in result.layer_shifts)


def test_multihead_attention_fast_path_is_restored_after_ads():
    torch.manual_seed(0)
    model, x = _Attention().eval(), torch.randn(4, 6, 3)
    architecture_driven_shift(model, nn.CrossEntropyLoss(), x, x, torch.randint(0, 2, (4,)), lr=0.1, steps=1)
    assert torch.backends.mha.get_fastpath_enabled()


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU])
def test_fisher_block_curvature_on_recurrent_layers_matches_explicit_per_sample_gradients(cell):
    """s_ℓ = N/(N-1) λ_max(K - diag K) with K the Gram of layer ℓ's per-sample gradients (true labels)."""
    torch.manual_seed(0)
    model, x, y = _Recurrent(cell), torch.randn(6, 5, 3), torch.randint(0, 2, (6,))
    ce = nn.CrossEntropyLoss()
    spectrum = layer_fisher_eigenvalues(model, ce, x, y, labels="true")
    layer_map = discover_layers(model, x[:2])
    for layer, top in zip(layer_map, spectrum.top):
        rows = []
        for i in range(x.shape[0]):
            model.zero_grad()
            ce(model(x[i:i + 1]), y[i:i + 1]).backward()
            rows.append(torch.cat([p.grad.reshape(-1) for p in layer.params.values()]))
        g = torch.stack(rows).double()
        gram = g @ g.T
        gram = gram - torch.diag(torch.diag(gram))
        expected = x.shape[0] / (x.shape[0] - 1) * float(torch.linalg.eigvalsh(gram).max()) / x.shape[0]
        assert top == pytest.approx(expected, rel=1e-4, abs=1e-8), layer.name
