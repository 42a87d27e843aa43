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
from tests.fixtures import small_bn_cnn, small_mlp
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
