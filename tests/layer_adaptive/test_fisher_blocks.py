"""Per-layer Fisher-block top eigenvalues against dense per-sample-gradient computations."""

import numpy as np
import pytest
import torch
from torch import nn

from avalanche_plugins.core.layers import discover_layers
from avalanche_plugins.layer_adaptive import (
    layer_curvature,
    layer_fisher_eigenvalues,
    layer_top_eigenvalues,
)
from tests.cases import TINY_CASES, build_model, small_bn_cnn, small_mlp
from tests.fixtures import digits_stream

CE = nn.CrossEntropyLoss()


def dense_fisher_tops(model, x, y, task_labels=None, *, debias=True):
    """Top eigenvalue of (1/N) Σ_i g_i g_iᵀ per layer (``debias``: of N/(N-1) times its hollow Gram,
    Σ_{i≠j} g_i·g_j / N), per-sample gradients by a Python loop of autograd, eigenvalues in the
    parameter space (plain) or the sample space (hollow)."""
    layers = discover_layers(model, x[:1] if task_labels is None else (x[:1], int(task_labels[0])))
    model.eval()
    rows = {layer.index: [] for layer in layers}
    for i in range(x.shape[0]):
        out = model(x[i:i + 1]) if task_labels is None else model(x[i:i + 1], int(task_labels[i]))
        loss = CE(out, y[i:i + 1])
        for layer in layers:
            params = list(layer.params.values())
            grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)  # other tasks' heads
            rows[layer.index].append(torch.cat([(torch.zeros_like(p) if g is None else g).flatten()
                                                for p, g in zip(params, grads)]))
    tops = []
    for layer in layers:
        m = torch.stack(rows[layer.index]).double()
        n = x.shape[0]
        if debias:
            gram = m @ m.T / n
            tops.append(float(torch.linalg.eigvalsh((gram - torch.diag(gram.diagonal())) * n / (n - 1))[-1]))
        else:
            tops.append(float(torch.linalg.eigvalsh(m.T @ m / n)[-1]))
    return np.array(tops)


@pytest.mark.parametrize("debias", [True, False])
@pytest.mark.parametrize("case", TINY_CASES, ids=[c.id for c in TINY_CASES])
def test_true_labels_match_dense_empirical_fisher_blocks(case, debias):
    model = case.model()
    torch.manual_seed(3)
    x = case.inputs(24)
    y = torch.randint(0, 3, (24,))
    # a tiny memory budget puts every layer in its own group: several passes, same values
    spec = layer_fisher_eigenvalues(model, CE, x, y, labels="true", chunk_size=7, memory_mb=1e-4, debias=debias)
    np.testing.assert_allclose(spec.top, dense_fisher_tops(case.model(), x, y, debias=debias), rtol=1e-5)
    assert spec.method == "fisher" and all(spec.converged)


def test_sampled_labels_reproduce_dense_fisher_of_the_drawn_labels():
    model = small_mlp()
    x = torch.randn(30, 6)
    spec = layer_fisher_eigenvalues(model, CE, x, torch.zeros(30, dtype=torch.long), seed=5)
    # the same draw, independently: the model's softmax sampled with the documented CPU generator
    with torch.no_grad():
        probs = torch.softmax(model(x).double(), dim=-1)
    drawn = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(5)).squeeze(1)
    np.testing.assert_allclose(spec.top, dense_fisher_tops(model, x, drawn), rtol=1e-5)
    again = layer_fisher_eigenvalues(model, CE, x, torch.zeros(30, dtype=torch.long), seed=5)
    np.testing.assert_array_equal(spec.top, again.top)


def test_sampled_fisher_of_a_linear_softmax_model_approaches_its_hessian():
    # for a model linear in its parameters the cross-entropy Hessian *is* the true Fisher
    # (Gauss–Newton with no residual): the Monte-Carlo estimate converges to the exact block
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4))
    base = torch.randn(25, 3)
    x = base.repeat(400, 1)  # 400 label draws per input
    y = torch.randint(0, 4, (x.shape[0],))
    fisher = layer_fisher_eigenvalues(model, CE, x, y, chunk_size=2000).top
    raw = layer_fisher_eigenvalues(model, CE, x, y, chunk_size=2000, debias=False).top
    hessian = layer_top_eigenvalues(model, CE, base, y[:25], tol=1e-8, max_iter=1000).top
    np.testing.assert_allclose(fisher, hessian, rtol=0.05)
    np.testing.assert_allclose(raw, hessian, rtol=0.05)  # at large N the self-products do not matter


def test_debiasing_removes_the_self_products_that_dominate_few_samples():
    # g_i = a u + noise_i in a space much larger than N: each ‖noise_i‖² = σ²·dim lands on the
    # Gram's diagonal and inflates the plain estimate by ≈ σ²·dim / N; the hollow Gram keeps a²
    from avalanche_plugins.layer_adaptive.fisher_blocks import _top_gram_eigenvalue

    torch.manual_seed(0)
    n, dim, a, sigma2 = 32, 4000, 2.0, 0.03
    u = torch.nn.functional.normalize(torch.randn(dim), dim=0)
    grads = a * u + sigma2**0.5 * torch.randn(n, dim)
    population = a**2 + sigma2  # λ_max(E g gᵀ) = λ_max(a² u uᵀ + σ² I)
    plain = _top_gram_eigenvalue([grads], debias=False)
    hollow = _top_gram_eigenvalue([grads], debias=True)
    assert plain == pytest.approx(population + sigma2 * dim / n, rel=0.1)  # the self-product bias
    assert hollow == pytest.approx(population, rel=0.2)
    # exact for a rank-one block of equal-norm gradients
    signs = torch.tensor([1.0, -1.0] * (n // 2)).unsqueeze(1)
    assert _top_gram_eigenvalue([a * signs * u], debias=True) == pytest.approx(a**2, rel=1e-6)


def test_multi_head_model_with_mixed_task_labels():
    from avalanche.models.dynamic_modules import avalanche_model_adaptation

    model = build_model("mlp", multihead=True, hidden=(8,))
    for experience in digits_stream(5, task_incremental=True).benchmark.train_stream[:2]:
        avalanche_model_adaptation(model, experience)  # heads for tasks 0 and 1
    torch.manual_seed(1)
    x, y = torch.randn(24, 1, 8, 8), torch.randint(0, 2, (24,))
    t = torch.tensor([0, 1] * 12)
    spec = layer_fisher_eigenvalues(model, CE, x, y, labels="true", task_labels=t, chunk_size=5)
    np.testing.assert_allclose(spec.top, dense_fisher_tops(model, x, y, t), rtol=1e-5)


def test_layer_curvature_dispatches_and_validates():
    model = small_mlp()
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    assert layer_curvature(model, CE, x, y, method="hessian", max_iter=300).method == "hessian"
    with pytest.raises(ValueError, match="method"):
        layer_curvature(model, CE, x, y, method="lanczos")
    with pytest.raises(ValueError, match="labels='sampled'.*CrossEntropyLoss"):
        layer_fisher_eigenvalues(model, nn.MSELoss(), x, torch.randn(16, 3))
    with pytest.raises(ValueError, match="memory_mb"):
        layer_fisher_eigenvalues(model, CE, x, y, memory_mb=0)
    with pytest.raises(ValueError, match="labels"):
        layer_fisher_eigenvalues(model, CE, x, y, labels="predicted")
    # the empirical Fisher takes any per-sample loss
    assert layer_fisher_eigenvalues(model, nn.MSELoss(), x, torch.randn(16, 3), labels="true").top.shape == (3,)


def test_recurrent_layers_run_through_per_sample_gradients_one_at_a_time():
    class Recurrent(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.GRU(4, 5, batch_first=True)
            self.head = nn.Linear(5, 2)

        def forward(self, x):
            return self.head(self.rnn(x)[0][:, -1])

    # vmap has no rule for the GRU kernel: the fallback gives finite s_l (values: tests/integration/test_fallbacks.py)
    spectrum = layer_fisher_eigenvalues(Recurrent(), CE, torch.randn(4, 3, 4), torch.randint(0, 2, (4,)))
    assert spectrum.names == ["rnn", "head"] and all(v >= 0 for v in spectrum.top)


def test_hessian_layer_chunks_give_the_same_spectrum():
    model = small_mlp()
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    # the same 15 iterations from the same start vectors: equal up to float summation order
    with pytest.warns(RuntimeWarning, match="did not reach"):
        whole = layer_top_eigenvalues(model, CE, x, y, layer_chunk_size=None, chunk_size=None, tol=1e-12, max_iter=15)
    with pytest.warns(RuntimeWarning, match="did not reach"):
        chunked = layer_top_eigenvalues(model, CE, x, y, layer_chunk_size=1, chunk_size=8, tol=1e-12, max_iter=15)
    np.testing.assert_allclose(chunked.top, whole.top, rtol=1e-5)


def _multi_head_model():
    from avalanche.models.dynamic_modules import avalanche_model_adaptation

    model = build_model("mlp", multihead=True, hidden=(8,))
    for experience in digits_stream(5, task_incremental=True).benchmark.train_stream[:2]:
        avalanche_model_adaptation(model, experience)  # heads for tasks 0 and 1
    return model


@pytest.mark.parametrize("case", ["mlp", "frozen_first_layer", "multi_head", "vit"])
def test_linear_layers_gram_from_activations_equals_per_sample_gradients(case, monkeypatch):
    """Sampled labels: Linear layers on (samples, features) inputs take their Gram from
    activations and output gradients; it equals the per-sample-gradient path (itself checked
    against dense loops above). Linear layers on tokens (ViT) fall back to per-sample gradients."""
    from avalanche_plugins.layer_adaptive import fisher_blocks

    torch.manual_seed(2)
    t = None
    if case == "multi_head":
        model, x, t = _multi_head_model(), torch.randn(24, 1, 8, 8), torch.tensor([0, 1] * 12)
    elif case == "vit":
        model, x = build_model("vit"), torch.randn(24, 1, 8, 8)
    else:
        model, x = small_mlp(), torch.randn(24, 6)
        if case == "frozen_first_layer":
            model[0].requires_grad_(False)
    y = torch.zeros(24, dtype=torch.long)
    layers = discover_layers(model, x[:2] if t is None else x[:2])
    fast = fisher_blocks._linear_layer_grams(model.eval(), x, y, fisher_blocks.task_groups(model, 24, t), layers, 5)
    linear = [layer.name for layer in layers if isinstance(layer.module, nn.Linear)]
    if case == "vit":  # only the head sees (samples, features); the token layers fall back
        assert 0 < len(fast) < len(linear)
    else:
        assert sorted(fast) == sorted(linear)
    spec = layer_fisher_eigenvalues(model, CE, x, y, task_labels=t, chunk_size=5, seed=1)
    monkeypatch.setattr(fisher_blocks, "_linear_layer_grams", lambda *args: {})
    reference = layer_fisher_eigenvalues(model, CE, x, y, task_labels=t, chunk_size=5, seed=1)
    np.testing.assert_allclose(spec.top, reference.top, rtol=1e-5)
    assert (spec.top > 0).all()


@pytest.mark.parametrize("debias", [True, False])
def test_expected_labels_match_a_dense_loop_over_samples_and_classes(debias):
    """``labels="expected"``: rows ``√p_ic g_ic`` for every sample and class (autograd loop here);
    ``debias`` drops the products of a sample's own rows with each other."""
    model = small_bn_cnn()
    torch.manual_seed(4)
    x = torch.randn(12, 1, 8, 8)
    spec = layer_fisher_eigenvalues(model, CE, x, torch.zeros(12, dtype=torch.long), labels="expected",
                                    debias=debias, chunk_size=5)
    layers = discover_layers(model, x[:1])
    model.eval()
    rows, owner = {layer.index: [] for layer in layers}, []
    for i in range(x.shape[0]):
        logits = model(x[i:i + 1])
        probs = torch.softmax(logits.detach().double(), -1)[0]
        for c in range(logits.shape[1]):
            loss = CE(logits, torch.tensor([c]))
            owner.append(i)
            for layer in layers:
                grads = torch.autograd.grad(loss, list(layer.params.values()), retain_graph=True)
                rows[layer.index].append(probs[c].sqrt() * torch.cat([g.flatten() for g in grads]).double())
    owner = torch.tensor(owner)
    n = x.shape[0]
    tops = []
    for layer in layers:
        m = torch.stack(rows[layer.index])
        gram = m @ m.T / n
        if debias:
            gram = gram.masked_fill(owner[:, None] == owner[None, :], 0.0) * n / (n - 1)
        tops.append(float(torch.linalg.eigvalsh(gram)[-1]))
    np.testing.assert_allclose(spec.top, tops, rtol=1e-5)


@pytest.mark.parametrize("debias", [True, False])
def test_conv_layers_gram_from_activations_equals_per_sample_gradients(debias, monkeypatch):
    """Sampled labels: a ``Conv2d`` on a small map takes its Gram from its inputs' patches and its
    output gradients (``Σ_{t,s} (u_it·u_js)(δ_it·δ_js)``, plus the bias term); it equals the
    per-sample-gradient path (itself checked against dense loops above) for strides, padding,
    dilation, with and without bias, blocks of samples smaller than the batch."""
    from avalanche_plugins.layer_adaptive import fisher_blocks

    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Conv2d(4, 5, 3, stride=2, padding=2, dilation=2, bias=False), nn.Tanh(),
                          nn.Conv2d(5, 3, 2), nn.Flatten(), nn.Linear(27, 3)).eval()
    x, y = torch.randn(20, 2, 7, 7), torch.zeros(20, dtype=torch.long)
    layers = discover_layers(model, x[:2])
    monkeypatch.setattr(fisher_blocks, "_conv_pays", lambda module, a, out: a.dim() == 4)
    monkeypatch.setattr(fisher_blocks, "CONV_BLOCK_POSITIONS", 20)  # blocks of 1-2 samples
    grams = fisher_blocks._conv_layer_grams(model, x, y, fisher_blocks.task_groups(model, 20, None), layers, 7)
    assert sorted(grams) == ["0", "3", "5"]
    fast = layer_fisher_eigenvalues(model, CE, x, y, chunk_size=7, seed=2, debias=debias)
    monkeypatch.setattr(fisher_blocks, "_conv_layer_grams", lambda *args: {})
    reference = layer_fisher_eigenvalues(model, CE, x, y, chunk_size=7, seed=2, debias=debias)
    # float32 gradients either way, summed in another order: float32 rounding of the products
    np.testing.assert_allclose(fast.top, reference.top, rtol=1e-5)
    assert (fast.top > 0).all()


def test_conv_gram_pays_on_the_late_layers_of_a_resnet_only():
    from avalanche_plugins.layer_adaptive.fisher_blocks import _conv_pays

    late, early = nn.Conv2d(512, 512, 3, padding=1), nn.Conv2d(64, 64, 3, padding=1)
    assert _conv_pays(late, torch.zeros(1, 512, 4, 4), torch.zeros(1, 512, 4, 4))  # 16 positions
    assert not _conv_pays(early, torch.zeros(1, 64, 32, 32), torch.zeros(1, 64, 32, 32))
    assert not _conv_pays(nn.Conv2d(512, 512, 3, groups=2), torch.zeros(1, 512, 4, 4), torch.zeros(1, 512, 2, 2))
