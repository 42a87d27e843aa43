"""Per-layer top Hessian-block eigenvalues against dense eigendecompositions."""

import numpy as np
import pytest
import torch
from torch import nn

from avalanche_plugins.layer_adaptive import (
    condition_number,
    geometric_fit,
    layer_top_eigenvalues,
)
from tests.cases import small_bn_cnn, small_mlp
from tests.helpers import dense_block_eigenvalues

CE = nn.CrossEntropyLoss()


def rel_err(a, b):
    return np.abs(np.asarray(a) - np.asarray(b)) / np.abs(np.asarray(b))


def test_mlp_matches_dense_block_eigenvalues_including_negative_dominant():
    model = small_mlp(seed=0)  # the data continue the same RNG stream
    x, y = torch.randn(64, 6), torch.randint(0, 3, (64,))
    spec = layer_top_eigenvalues(model, CE, x, y, tol=1e-7, max_iter=2000)
    dense = dense_block_eigenvalues(model, CE, x, y)
    assert rel_err(spec.top, [float(e.max()) for e in dense]).max() < 1e-3
    dominant = [float(e[e.abs().argmax()]) for e in dense]
    assert rel_err(spec.dominant, dominant).max() < 1e-3
    # this seed's first block has a negative dominant eigenvalue: s_ℓ must still be λ_max
    assert dominant[0] < 0 < spec.top[0]


def test_cnn_with_batchnorm_and_minibatches_matches_dense():
    model = small_bn_cnn()
    torch.manual_seed(2)
    x, y = torch.randn(48, 1, 8, 8), torch.randint(0, 3, (48,))
    spec = layer_top_eigenvalues(model, CE, x, y, tol=1e-7, max_iter=2000, chunk_size=16)
    assert model.training  # mode restored
    assert all(spec.converged)
    dense = dense_block_eigenvalues(model, CE, x, y)
    assert rel_err(spec.top, [float(e.max()) for e in dense]).max() < 1e-3


def test_geometric_fit_and_kappa():
    s = 5.0 * 3.0 ** -np.arange(4)
    fit = geometric_fit(s)
    assert fit.alpha == pytest.approx(3.0) and fit.r2 == pytest.approx(1.0)
    assert np.allclose(fit.profile(4), s)
    assert condition_number(s) == pytest.approx(27.0)
    assert condition_number([1.0, -1.0]) == float("inf")
    with pytest.raises(ValueError, match="two positive"):
        geometric_fit([1.0, -2.0])


def test_warns_when_not_converged():
    model = small_mlp()
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    with pytest.warns(RuntimeWarning, match="did not reach tol.*last relative change"):
        spec = layer_top_eigenvalues(model, CE, x, y, max_iter=2, tol=1e-12)
    assert not any(spec.converged)


def test_bad_input():
    model = small_mlp()
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    with pytest.raises(ValueError, match="empty"):
        layer_top_eigenvalues(model, CE, x[:0], y[:0])
    with pytest.raises(ValueError, match="max_iter"):
        layer_top_eigenvalues(model, CE, x, y, max_iter=0)
    with pytest.raises(ValueError, match="tol"):
        layer_top_eigenvalues(model, CE, x, y, tol=-1)
    with pytest.raises(ValueError, match="no parametrised layer"):
        layer_top_eigenvalues(nn.Sequential(nn.Flatten()), CE, x, y)
    x_nan = x.clone()
    x_nan[0, 0] = float("nan")
    with pytest.raises(ValueError, match="inputs has 1 non-finite"):
        layer_top_eigenvalues(model, CE, x_nan, y)


def _symmetric_with_spectrum(eigenvalues, seed):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(len(eigenvalues), len(eigenvalues), generator=g, dtype=torch.float64))
    return q @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ q.T


@pytest.mark.parametrize("krylov_dim", [40, 6])  # 6: restarts from the top Ritz vector
def test_block_lanczos_stops_on_the_residual_so_tol_is_a_relative_accuracy(krylov_dim):
    from avalanche_plugins.layer_adaptive.hessian import block_lanczos

    # row 0: a clustered top (slow for power iteration); row 1: negative dominant eigenvalue
    spectra = [[5.0, 4.9, 4.8, 1.0, -1.0] + [0.5] * 55, [3.0, -7.0, 1.0, 0.2] + list(np.linspace(-2, 2, 56))]
    mats = [_symmetric_with_spectrum(s, i) for i, s in enumerate(spectra)]
    owner = {"a": 0, "b": 1}
    start = {k: torch.randn(60, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
             for i, k in enumerate(owner)}
    hvp = lambda v, rows: {k: mats[owner[k]] @ t for k, t in v.items()}  # noqa: E731
    for tol in (1e-3, 1e-8):
        out = block_lanczos(hvp, start, owner, tol, 500, krylov_dim=krylov_dim)
        top = np.array([max(s) for s in spectra])
        assert (out.residual <= tol).all()
        assert (np.abs(out.estimate.numpy() - top) <= tol * top).all()  # the residual bound, per row
    # the bottom Ritz value is a by-product, not held to tol (after restarts it lags): only close
    assert out.dominant.tolist() == pytest.approx([5.0, -7.0], rel=1e-3)
    assert out.estimate.tolist() == pytest.approx([5.0, 3.0], rel=1e-8)


def test_block_lanczos_stops_at_once_on_a_zero_operator_and_caps_products():
    from avalanche_plugins.layer_adaptive.hessian import block_lanczos

    zero = block_lanczos(lambda v, rows: {k: torch.zeros_like(t) for k, t in v.items()},
                         {"a": torch.ones(3), "b": torch.ones(2, 2)}, {"a": 0, "b": 0}, 1e-3, 50)
    assert zero.iterations.tolist() == [1] and zero.estimate.tolist() == [0.0]
    mat = _symmetric_with_spectrum(list(np.linspace(1, 2, 50)), 0)
    capped = block_lanczos(lambda v, rows: {"w": mat @ v["w"]}, {"w": torch.ones(50, dtype=torch.float64)},
                           {"w": 0}, 1e-12, 7)
    assert capped.iterations.tolist() == [7] and float(capped.residual[0]) > 1e-12


def test_default_tol_is_within_1e3_of_the_dense_blocks_and_results_are_deterministic():
    model = small_mlp(seed=1)
    x, y = torch.randn(64, 6), torch.randint(0, 3, (64,))
    spec = layer_top_eigenvalues(model, CE, x, y)  # tol=1e-3
    dense = dense_block_eigenvalues(model, CE, x, y)
    assert rel_err(spec.top, [float(e.max()) for e in dense]).max() <= 1e-3
    # no kept gradient graphs (memory_mb=0), other layer groups and minibatches: the same products
    again = layer_top_eigenvalues(model, CE, x, y, memory_mb=0, layer_chunk_size=1, chunk_size=16)
    assert again.iterations == spec.iterations
    np.testing.assert_allclose(again.top, spec.top, rtol=1e-5)


def _symmetric_with_spectrum(eigenvalues, seed):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(len(eigenvalues), len(eigenvalues), generator=g, dtype=torch.float64))
    return q @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ q.T


def test_block_power_iteration_finds_the_dominant_eigenvalue_of_each_vectors_own_matrix():
    from avalanche_plugins.layer_adaptive.hessian import block_power_iteration

    matrices = [_symmetric_with_spectrum([5.0, 2.0, 1.0, -1.0, 0.5, 0.1], 0),
                _symmetric_with_spectrum([-4.0, 3.0, 1.0, 0.2, 0.0, -0.5], 1)]
    seen_rows = []

    def hvp(v, rows):
        seen_rows.append(rows.tolist())
        return {"w": torch.stack([m @ x for m, x in zip([matrices[r] for r in rows.tolist()], v["w"])])}

    start = {"w": torch.randn(2, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)}
    out = block_power_iteration(hvp, start, tol=1e-10, max_iter=2000)
    expected = [float(torch.linalg.eigvalsh(m).abs().max() * torch.linalg.eigvalsh(m)[
        torch.linalg.eigvalsh(m).abs().argmax()].sign()) for m in matrices]
    assert torch.allclose(out.estimate, torch.tensor(expected, dtype=torch.float64), rtol=1e-6)
    assert bool((out.residual <= 1e-5).all()) and seen_rows[0] == [0, 1]
    # the faster vector (ratio 2/5) stops first and is no longer asked for
    assert int(out.iterations[0]) < int(out.iterations[1]) and seen_rows[-1] == [1]


def test_block_power_iteration_stops_at_once_on_a_zero_operator_and_caps_iterations():
    from avalanche_plugins.layer_adaptive.hessian import block_power_iteration

    zero = block_power_iteration(lambda v, rows: {k: torch.zeros_like(t) for k, t in v.items()},
                                 {"a": torch.ones(1, 3), "b": torch.ones(1, 2, 2)}, 1e-3, 50)
    assert zero.iterations.tolist() == [1] and zero.estimate.tolist() == [0.0]
    flip = torch.diag(torch.tensor([1.0, -1.0]))  # eigenvalues ±1: ρ steady, never converged
    out = block_power_iteration(lambda v, rows: {"w": v["w"] @ flip}, {"w": torch.tensor([[2.0, 1.0]])}, 1e-3, 7)
    assert out.iterations.tolist() == [7] and float(out.residual[0]) > 0.5
