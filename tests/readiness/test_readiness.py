"""Optimization Readiness, k-step gain and label-agnostic baselines against independent answers:
plain loops over samples / minibatches / runs, enumeration of all minibatches, dense Jacobians
and Hessians, numpy / scipy."""

import copy
import itertools
import math

import numpy as np
import pytest
import torch
from torch import nn

from avalanche_plugins.core.stats import kendall_tau, pairwise_ranking_accuracy, spearman
from avalanche_plugins.readiness import (
    active_unit_fraction,
    effective_rank,
    energy_rank,
    entk_energy_rank,
    hessian_energy_rank,
    hidden_features,
    k_step_gain,
    optimization_readiness,
    representation_ranks,
)

MSE = nn.MSELoss()
CE = nn.CrossEntropyLoss()


def mlp(seed=0, n_in=3, hidden=5, n_out=1):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, n_out)).double()


def flat_grad(model, loss):
    params = list(model.parameters())
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for p, g in zip(params, grads)])


def loop_moments(model, loss_fn, x, y, forward=None):
    """Loss, g, and per-sample gradients by a plain loop (batch of one per sample)."""
    forward = forward or (lambda xb, i: model(xb))
    model.eval()
    per_sample = torch.stack([flat_grad(model, loss_fn(forward(x[i:i + 1], i), y[i:i + 1]))
                              for i in range(len(x))])
    losses = torch.stack([loss_fn(forward(x[i:i + 1], i), y[i:i + 1]).detach() for i in range(len(x))])
    return float(losses.mean()), per_sample.mean(0), per_sample


def subset_second_moment(model, loss_fn, x, y, batch_size):
    """Exact E_B ‖ĝ_B‖² (and its variance) over ALL size-B subsets, by enumeration."""
    values = []
    for subset in itertools.combinations(range(len(x)), batch_size):
        idx = list(subset)
        values.append(float(flat_grad(model, loss_fn(model(x[idx]), y[idx])).pow(2).sum()))
    values = np.array(values)
    return values.mean(), values.var()


def regression_data(n=20, n_in=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, n_in, generator=g, dtype=torch.float64),
            torch.randn(n, 1, generator=g, dtype=torch.float64))


# --------------------------------------------------------------------------------------------
# Optimization Readiness
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_per_sample_matches_direct_formula(task):
    if task == "regression":
        model, loss_fn = mlp(0), MSE
        x, y = regression_data(20)
    else:
        model, loss_fn = mlp(0, n_out=3), CE
        x = regression_data(20)[0]
        y = torch.arange(20) % 3
    n, b = 20, 4
    loss, g, per_sample = loop_moments(model, loss_fn, x, y)
    gn2 = float(g.pow(2).sum())
    trace = float((per_sample - g).pow(2).sum(1).mean())
    second = gn2 + trace / b * (n - b) / (n - 1)
    res = optimization_readiness(model, loss_fn, x, y, batch_size=b, estimator="per_sample")
    assert res.loss == pytest.approx(loss_fn(model(x), y).item(), rel=1e-6)
    assert res.loss == pytest.approx(loss, rel=1e-6)
    assert res.grad_norm_sq == pytest.approx(gn2, rel=1e-6)
    assert res.second_moment == pytest.approx(second, rel=1e-6)
    assert res.strength == pytest.approx(gn2 / loss, rel=1e-6)
    assert res.reliability == pytest.approx(gn2 / second, rel=1e-6)
    assert res.readiness == pytest.approx(gn2 ** 2 / (loss * second), rel=1e-6)
    assert (res.estimator, res.batch_size, res.n_samples) == ("per_sample", b, n)
    # the sampled estimator's L and ‖g‖² come from batch losses over chunks: same values
    sampled = optimization_readiness(model, loss_fn, x, y, batch_size=b, chunk_size=7)
    assert sampled.loss == pytest.approx(loss, rel=1e-9)
    assert sampled.grad_norm_sq == pytest.approx(gn2, rel=1e-9)


def test_second_moment_equals_enumeration_of_all_minibatches():
    model = mlp(2)
    x, y = regression_data(8, seed=3)
    exact, variance = subset_second_moment(model, MSE, x, y, 2)
    per_sample = optimization_readiness(model, MSE, x, y, batch_size=2, estimator="per_sample")
    assert per_sample.second_moment == pytest.approx(exact, rel=1e-5)
    n_batches = 4000
    sampled = optimization_readiness(model, MSE, x, y, batch_size=2, n_batches=n_batches, seed=5)
    stderr = math.sqrt(variance / n_batches)
    assert abs(sampled.second_moment - exact) < 4 * stderr
    assert sampled.second_moment == pytest.approx(exact, rel=0.05)
    assert sampled.reliability == pytest.approx(per_sample.reliability, rel=0.05)
    # the sampled minibatches are sampled without replacement: with B = N every batch is the data
    full = optimization_readiness(model, MSE, x, y, batch_size=8, n_batches=5)
    assert full.second_moment == pytest.approx(full.grad_norm_sq, rel=1e-9)
    assert full.reliability == pytest.approx(1.0, rel=1e-9)
    full_ps = optimization_readiness(model, MSE, x, y, batch_size=8, estimator="per_sample")
    assert full_ps.reliability == pytest.approx(1.0, rel=1e-9)


def test_sampled_is_seeded_and_chunk_invariant():
    model = mlp(4)
    x, y = regression_data(30, seed=4)
    a = optimization_readiness(model, MSE, x, y, batch_size=3, n_batches=50, seed=7)
    b = optimization_readiness(model, MSE, x, y, batch_size=3, n_batches=50, seed=7, chunk_size=4)
    c = optimization_readiness(model, MSE, x, y, batch_size=3, n_batches=50, seed=8)
    assert a.second_moment == pytest.approx(b.second_moment, rel=1e-10)
    assert a.loss == pytest.approx(b.loss, rel=1e-10)
    assert a.second_moment != c.second_moment
    p1 = optimization_readiness(model, MSE, x, y, batch_size=3, estimator="per_sample")
    p2 = optimization_readiness(model, MSE, x, y, batch_size=3, estimator="per_sample", chunk_size=4)
    assert p1.readiness == pytest.approx(p2.readiness, rel=1e-10)


def test_model_state_rng_and_grads_untouched():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 6), nn.Dropout(0.5), nn.ReLU(), nn.Linear(6, 2))
    model.train()
    x, y = torch.randn(12, 3), torch.randint(0, 2, (12,))
    before = copy.deepcopy(model.state_dict())
    rng = torch.get_rng_state()
    for estimator in ("sampled", "per_sample"):
        optimization_readiness(model, CE, x, y, estimator=estimator)
    k_step_gain(model, CE, x, y, x, y, k=2, lr=0.1, batch_size=3, n_runs=4, optimizer="adam")
    assert model.training
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


class TwoHeads(nn.Module):
    """Duck-typed Avalanche multi-task module (``forward_single_task``) with one head per task."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.trunk = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(4, 2), nn.Linear(4, 2)])

    def forward_single_task(self, x, task):
        return self.heads[task](self.trunk(x))

    def forward(self, x, task_labels):
        if isinstance(task_labels, int):
            return self.forward_single_task(x, task_labels)
        out = torch.zeros(x.shape[0], 2, dtype=x.dtype)
        for t in torch.unique(task_labels):
            mask = task_labels == t
            out[mask] = self.forward_single_task(x[mask], int(t))
        return out


def test_multitask_mixed_labels():
    model = TwoHeads().double()
    x = regression_data(10, seed=6)[0]
    y = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 1, 1])
    t = torch.tensor([0, 1, 0, 1, 1, 0, 1, 0, 0, 1])
    n, b = 10, 3
    loss, g, per_sample = loop_moments(model, CE, x, y, forward=lambda xb, i: model(xb, int(t[i])))
    gn2 = float(g.pow(2).sum())
    second = gn2 + float((per_sample - g).pow(2).sum(1).mean()) / b * (n - b) / (n - 1)
    res = optimization_readiness(model, CE, x, y, batch_size=b, estimator="per_sample", task_labels=t)
    assert res.loss == pytest.approx(loss, rel=1e-9)
    assert res.grad_norm_sq == pytest.approx(gn2, rel=1e-9)
    assert res.second_moment == pytest.approx(second, rel=1e-9)
    sampled = optimization_readiness(model, CE, x, y, batch_size=b, n_batches=3000, task_labels=t)
    assert sampled.loss == pytest.approx(loss, rel=1e-9)
    assert sampled.grad_norm_sq == pytest.approx(gn2, rel=1e-9)
    assert sampled.second_moment == pytest.approx(second, rel=0.06)
    # without labels every sample is task 0
    zero = optimization_readiness(model, CE, x, y, batch_size=b, estimator="per_sample")
    same = optimization_readiness(model, CE, x, y, batch_size=b, estimator="per_sample",
                                  task_labels=torch.zeros(10, dtype=torch.long))
    assert zero.readiness == pytest.approx(same.readiness, rel=1e-12)


@pytest.mark.parametrize("chunk_size", [1, 4, 1024])
def test_mixed_task_minibatches_match_a_loop_over_the_drawn_batches(chunk_size):
    # the sampled estimator on minibatches that mix tasks: mean over the drawn minibatches of
    # ‖mean of their per-sample gradients‖², whatever the chunking of the per-sample gradients
    from avalanche_plugins.readiness._common import _draw_batches

    model = TwoHeads().double()
    x = regression_data(10, seed=6)[0]
    y = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 1, 1])
    t = torch.tensor([0, 1, 0, 1, 1, 0, 1, 0, 0, 1])
    _, _, per_sample = loop_moments(model, CE, x, y, forward=lambda xb, i: model(xb, int(t[i])))
    batches = _draw_batches(10, 3, 40, torch.Generator().manual_seed(2))
    expected = float(torch.stack([per_sample[b].mean(0).pow(2).sum() for b in batches]).mean())
    res = optimization_readiness(model, CE, x, y, batch_size=3, n_batches=40, seed=2, task_labels=t,
                                 chunk_size=chunk_size)
    assert res.second_moment == pytest.approx(expected, rel=1e-10)


def test_zero_gradient_rule_exact():
    """Residual orthogonal to the columns of X: g = 0 exactly, OR = S = R = 0 (not NaN)."""
    model = nn.Linear(2, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    x = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], dtype=torch.float64)
    y = model(x).detach() - 1.0  # residual model(x) - y = 1 ⟂ columns of X
    # E_B‖ĝ_B‖² by enumeration: per-sample gradients 2·x_i, so ĝ_B = x_i + x_j; the pairs {±e1}
    # and {±e2} cancel, the 4 mixed pairs have ‖ĝ_B‖² = 2: 8/6 for B = 2, and 0 for B = N = 4.
    exact = {b: subset_second_moment(model, MSE, x, y, b) for b in (2, 4)}
    assert exact[2][0] == pytest.approx(4 / 3, rel=1e-12) and exact[4] == (0.0, 0.0)
    n_batches = 128
    for estimator, b in (("per_sample", 2), ("sampled", 2), ("per_sample", 4), ("sampled", 4)):
        res = optimization_readiness(model, MSE, x, y, batch_size=b, n_batches=n_batches, estimator=estimator)
        assert res.grad_norm_sq == 0.0
        assert (res.strength, res.reliability, res.readiness) == (0.0, 0.0, 0.0)
        assert res.loss == 1.0
        mean, variance = exact[b]
        if estimator == "per_sample" or b == 4:
            assert res.second_moment == pytest.approx(mean, rel=1e-12, abs=1e-12)
        else:  # the mean of n_batches draws: within 4 standard errors
            assert abs(res.second_moment - mean) < 4 * math.sqrt(variance / n_batches)
    gd = k_step_gain(model, MSE, x, y, x, y, k=5, lr=0.1, batch_size=4, n_runs=2)
    assert gd.gain == 0.0


# --------------------------------------------------------------------------------------------
# The counterexample: label-agnostic ranks ignore the residual
# --------------------------------------------------------------------------------------------


def relu_mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 1)).double()


def output_jacobian(model, x):
    return torch.stack([flat_grad(model, model(x[i:i + 1]).sum()) for i in range(len(x))])


def test_label_orthogonal_counterexample():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=g, dtype=torch.float64)
    # A: healthy network, residual in the null space of J Jᵀ (r ⟂ every column of J) => g = 0
    plastic_looking = relu_mlp(1)
    jac = output_jacobian(plastic_looking, x)  # (40, 31): rank ≤ 31 < 40
    z = torch.randn(40, generator=g, dtype=torch.float64)
    r = z - jac @ torch.linalg.lstsq(jac, z).solution
    r = r / r.norm() * math.sqrt(40)
    y_a = plastic_looking(x).detach() - r[:, None]
    assert float((jac.T @ r).abs().max()) < 1e-10
    # B: rank-deficient network (5 of 6 hidden units dead), residual aligned with the output bias
    collapsed = relu_mlp(1)
    with torch.no_grad():
        collapsed[0].bias[1:] = -100.0
    y_b = collapsed(x).detach() - 1.0

    or_a = optimization_readiness(plastic_looking, MSE, x, y_a, batch_size=4, estimator="per_sample")
    or_b = optimization_readiness(collapsed, MSE, x, y_b, batch_size=4, estimator="per_sample")
    assert or_a.readiness < 1e-20 and or_a.grad_norm_sq < 1e-20
    assert or_b.readiness > 0.1
    gain_a = k_step_gain(plastic_looking, MSE, x, y_a, x, y_a, k=10, lr=0.02, batch_size=4, n_runs=64)
    gain_b = k_step_gain(collapsed, MSE, x, y_b, x, y_b, k=10, lr=0.02, batch_size=4, n_runs=64)
    full_a = k_step_gain(plastic_looking, MSE, x, y_a, x, y_a, k=10, lr=0.02, batch_size=40, n_runs=2)
    assert abs(full_a.gain) < 1e-12  # gradient descent does not move at all
    assert abs(gain_a.gain) < 0.02 and gain_a.gain < 3 * gain_a.stderr  # SGD noise only: no progress
    assert gain_b.gain > 0.2 and gain_b.gain > 10 * gain_b.stderr

    ranks_a = representation_ranks(plastic_looking, x)["0"]
    ranks_b = representation_ranks(collapsed, x)["0"]
    assert ranks_b["energy_rank"] == 1 and ranks_a["energy_rank"] >= 3
    assert ranks_a["effective_rank"] > ranks_b["effective_rank"] + 1
    entk_a, entk_b = entk_energy_rank(plastic_looking, x), entk_energy_rank(collapsed, x)
    assert entk_a > entk_b + 2
    active_a, active_b = active_unit_fraction(plastic_looking, x), active_unit_fraction(collapsed, x)
    assert active_b == pytest.approx(1 / 6) and active_a > active_b
    # OR ranks the two checkpoints like the true gain; every label-agnostic rank gets them backwards
    gains = [gain_a.gain, gain_b.gain]
    assert pairwise_ranking_accuracy([or_a.readiness, or_b.readiness], gains) == 1.0
    for a, b in [(ranks_a["effective_rank"], ranks_b["effective_rank"]), (entk_a, entk_b),
                 (active_a, active_b)]:
        assert pairwise_ranking_accuracy([a, b], gains) == 0.0


# --------------------------------------------------------------------------------------------
# The one-step bound G^(1) ≥ α(1−α)/β · OR
# --------------------------------------------------------------------------------------------


def test_one_step_gain_bound_on_a_quadratic():
    torch.manual_seed(0)
    model = nn.Linear(3, 1).double()
    x, y = regression_data(8, seed=11)
    n, b = 8, 2
    params = [p.detach() for p in model.parameters()]

    def loss_of(weight, bias):
        return MSE(x @ weight.T + bias, y)

    beta = float(torch.linalg.eigvalsh(dense_hessian(model, MSE, x, y)).max())  # L is quadratic
    x1 = torch.cat([x, torch.ones(n, 1, dtype=torch.float64)], 1)
    assert beta == pytest.approx(float(torch.linalg.eigvalsh(2 / n * x1.T @ x1).max()), rel=1e-10)

    ready = optimization_readiness(model, MSE, x, y, batch_size=b, estimator="per_sample")
    loss0 = ready.loss
    subsets = list(itertools.combinations(range(n), b))
    for alpha in (0.2, 0.5, 0.9):
        lr = alpha * ready.reliability / beta
        # exact E L(θ_1) by enumerating every minibatch
        after = []
        for subset in subsets:
            idx = list(subset)
            grads = torch.autograd.grad(MSE(model(x[idx]), y[idx]), list(model.parameters()))
            after.append(float(loss_of(params[0] - lr * grads[0], params[1] - lr * grads[1])))
        exact_gain = (loss0 - np.mean(after)) / loss0
        bound = alpha * (1 - alpha) / beta * ready.readiness
        measured = k_step_gain(model, MSE, x, y, x, y, k=1, lr=lr, batch_size=b, n_runs=20000, seed=1)
        assert abs(measured.gain - exact_gain) < 4 * measured.stderr
        assert exact_gain >= bound > 0
        assert measured.gain - 3 * measured.stderr >= bound
        # the quadratic's tighter form α(1 − α/2)/β · OR is also met, and the bound is not vacuous
        assert exact_gain >= alpha * (1 - alpha / 2) / beta * ready.readiness * (1 - 1e-9)
        assert bound > 0.05 * exact_gain


# --------------------------------------------------------------------------------------------
# k-step gain against a plain loop over runs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_k_step_gain_matches_loop_over_runs(optimizer):
    model = mlp(5, hidden=4)
    x, y = regression_data(16, seed=12)
    xv, yv = regression_data(10, seed=13)
    lr = 0.05 if optimizer == "sgd" else 0.01
    res = k_step_gain(model, MSE, x, y, xv, yv, k=3, lr=lr, optimizer=optimizer, batch_size=4,
                      n_runs=3, seed=2)
    assert res.indices.shape == (3, 3, 4)
    assert all(len(set(row.tolist())) == 4 for row in res.indices.reshape(-1, 4))  # no repeats
    loss0 = MSE(model(xv), yv).item()
    losses = []
    for run in range(3):
        copy_ = copy.deepcopy(model)
        opt = (torch.optim.SGD(copy_.parameters(), lr=lr) if optimizer == "sgd"
               else torch.optim.Adam(copy_.parameters(), lr=lr))
        for step in range(3):
            idx = res.indices[run, step]
            opt.zero_grad()
            MSE(copy_(x[idx]), y[idx]).backward()
            opt.step()
        losses.append(MSE(copy_(xv), yv).item())
    losses = np.array(losses)
    np.testing.assert_allclose(res.losses_after.numpy(), losses, rtol=1e-10)
    gains = (loss0 - losses) / loss0
    assert res.loss_before == pytest.approx(loss0, rel=1e-12)
    assert res.gain == pytest.approx(gains.mean(), rel=1e-9)
    assert res.stderr == pytest.approx(gains.std(ddof=1) / math.sqrt(3), rel=1e-6)
    assert res.loss_after_mean == pytest.approx(losses.mean(), rel=1e-10)
    replay = k_step_gain(model, MSE, x, y, xv, yv, k=3, lr=lr, optimizer=optimizer, batch_size=4,
                         n_runs=3, indices=res.indices, chunk_size=3)
    np.testing.assert_allclose(replay.losses_after.numpy(), losses, rtol=1e-10)


def test_k_step_gain_classification_full_batch():
    model = mlp(6, n_out=3)
    x = regression_data(12, seed=14)[0]
    y = torch.arange(12) % 3
    res = k_step_gain(model, CE, x, y, x, y, k=4, lr=0.5, batch_size=12, n_runs=2)
    copy_ = copy.deepcopy(model)
    opt = torch.optim.SGD(copy_.parameters(), lr=0.5)
    for _ in range(4):
        opt.zero_grad()
        CE(copy_(x), y).backward()
        opt.step()
    before, after = CE(model(x), y).item(), CE(copy_(x), y).item()
    expected = (before - after) / before
    assert res.gain == pytest.approx(expected, rel=1e-9) and res.gain > 0
    assert res.stderr == pytest.approx(0.0, abs=1e-12)
    single = k_step_gain(model, CE, x, y, x, y, k=1, lr=0.5, batch_size=12, n_runs=1)
    assert math.isnan(single.stderr)


# --------------------------------------------------------------------------------------------
# Baselines
# --------------------------------------------------------------------------------------------


def with_singular_values(values, n=30, d=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(n, len(values), generator=g, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(d, len(values), generator=g, dtype=torch.float64)).Q
    return u @ torch.diag(torch.tensor(values, dtype=torch.float64)) @ v.T


def numpy_energy_rank(matrix, energy):
    s2 = np.linalg.svd(np.asarray(matrix, dtype=np.float64), compute_uv=False) ** 2
    return int(np.searchsorted(np.cumsum(s2), energy * s2.sum() * (1 - 1e-12)) + 1)


def test_energy_and_effective_rank_known_spectra():
    m = with_singular_values([10.0, 5.0, 1.0, 0.1, 0.01])
    assert energy_rank(m, 0.99) == 2  # 125 / 126.01 ≥ 0.99
    assert energy_rank(m, 0.995) == 3
    assert energy_rank(m, 1.0) == 5
    a, b = torch.randn(40, 3), torch.randn(3, 15)
    assert energy_rank(a @ b, 1.0) == 3
    for energy in (0.5, 0.9, 0.99):
        assert energy_rank(a @ b, energy) == numpy_energy_rank(a @ b, energy)
    assert effective_rank(with_singular_values([2.0, 2.0, 2.0])) == pytest.approx(3.0, rel=1e-10)
    assert effective_rank(with_singular_values([1.0])) == pytest.approx(1.0, rel=1e-10)
    r = torch.randn(20, 7, dtype=torch.float64)
    s = np.linalg.svd(r.numpy(), compute_uv=False)
    p = s / s.sum()
    assert effective_rank(r) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-10)
    assert effective_rank(torch.zeros(5, 3)) == 0.0 and energy_rank(torch.zeros(5, 3)) == 0
    # conv-like features are flattened per sample
    assert energy_rank(torch.randn(6, 2, 2, 2), 1.0) == 6


def test_entk_energy_rank_against_dense_jacobian():
    model = mlp(7, n_out=2)
    x = regression_data(6, seed=15)[0]
    rows = [flat_grad(model, model(x[i:i + 1])[0, c]) for i in range(6) for c in range(2)]
    jac = torch.stack(rows)
    for energy in (0.5, 0.9, 0.99, 0.9999):
        assert entk_energy_rank(model, x, energy) == numpy_energy_rank(jac, energy)
    assert entk_energy_rank(model, x, 0.99, chunk_size=2) == numpy_energy_rank(jac, 0.99)
    assert entk_energy_rank(nn.Linear(3, 2), torch.randn(10, 3), 1.0) == 8


def dense_hessian(model, loss_fn, x, y):
    params = [p.detach() for p in model.parameters()]
    shapes = [p.shape for p in params]
    sizes = [p.numel() for p in params]

    def loss_of(flat):
        pieces = [f.view(s) for f, s in zip(torch.split(flat, sizes), shapes)]
        return loss_fn(torch.func.functional_call(model, dict(zip([n for n, _ in model.named_parameters()],
                                                                   pieces)), (x,)), y)

    return torch.autograd.functional.hessian(loss_of, torch.cat([p.reshape(-1) for p in params]))


def test_hessian_energy_rank_exact_and_gauss_newton():
    model = mlp(8, n_out=3)
    x = regression_data(10, seed=16)[0]
    y = torch.arange(10) % 3
    hess = dense_hessian(model, CE, x, y)
    eig = np.linalg.eigvalsh(hess.numpy())
    for energy in (0.5, 0.9, 0.99):
        squares = np.sort(eig ** 2)[::-1]
        expected = int(np.searchsorted(np.cumsum(squares), energy * squares.sum() * (1 - 1e-12)) + 1)
        assert hessian_energy_rank(model, CE, x, y, energy) == expected
        assert hessian_energy_rank(model, CE, x, y, energy, chunk_size=3) == expected
    # Gauss–Newton dual vs a dense (1/N) Σ J_iᵀ H_i J_i
    gn = 0
    for i in range(10):
        jac = torch.stack([flat_grad(model, model(x[i:i + 1])[0, c]) for c in range(3)])
        out = model(x[i:i + 1]).detach()[0]
        h_out = torch.autograd.functional.hessian(lambda o, i=i: CE(o[None], y[i:i + 1]), out)
        gn = gn + jac.T @ h_out @ jac / 10
    eig_gn = np.abs(np.linalg.eigvalsh(gn.numpy()))
    for energy in (0.5, 0.9, 0.99):
        squares = np.sort(eig_gn ** 2)[::-1]
        expected = int(np.searchsorted(np.cumsum(squares), energy * squares.sum() * (1 - 1e-12)) + 1)
        assert hessian_energy_rank(model, CE, x, y, energy, max_params=10) == expected
    # for a model linear in its parameters with MSE, Gauss–Newton is the Hessian
    lin = nn.Linear(4, 2).double()
    xl, yl = torch.randn(9, 4, dtype=torch.float64), torch.randn(9, 2, dtype=torch.float64)
    assert hessian_energy_rank(lin, MSE, xl, yl, 1.0) == 10  # (2/(N·C)) X̃ᵀX̃ ⊗ I₂: 5 double eigenvalues
    for energy in (0.5, 0.9, 1.0):
        assert (hessian_energy_rank(lin, MSE, xl, yl, energy)
                == hessian_energy_rank(lin, MSE, xl, yl, energy, max_params=1))


class SharedActivation(nn.Module):
    """One ReLU instance reused after every layer, and a sigmoid after the output layer."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.out = nn.Linear(2, 4), nn.Linear(4, 3), nn.Linear(3, 1)
        self.act, self.squash = nn.ReLU(), nn.Sigmoid()

    def forward(self, x):
        return self.squash(self.out(self.act(self.fc2(self.act(self.fc1(x))))))


def hand_made(net_fc1, net_fc2):
    with torch.no_grad():
        net_fc1.weight.copy_(torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]))
        net_fc1.bias.copy_(torch.tensor([1.0, -1.0, 0.0, 0.0]))  # always on, dead, x0 > 0, zero
        net_fc2.weight.zero_()
        net_fc2.bias.copy_(torch.tensor([1.0, -1.0, 0.0]))  # on, dead, zero


def test_active_units_and_hidden_features_on_hand_made_relu_nets():
    x = torch.tensor([[-1.0, 2.0], [0.5, -1.0], [-2.0, 0.0]])
    seq = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Dropout(0.3), nn.Linear(4, 3), nn.ReLU(),
                        nn.Linear(3, 1), nn.Sigmoid())
    hand_made(seq[0], seq[3])
    shared = SharedActivation()
    hand_made(shared.fc1, shared.fc2)
    for net, names in ((seq, ["0", "3"]), (shared, ["fc1", "fc2"])):
        assert active_unit_fraction(net, x) == pytest.approx(3 / 7)
        feats = hidden_features(net, x)
        assert list(feats) == names
        h1 = torch.relu(x @ torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0] * 4]) + torch.tensor([1.0, -1, 0, 0]))
        assert torch.equal(feats[names[0]], h1)
        assert torch.equal(feats[names[1]], torch.tensor([[1.0, 0, 0]] * 3))
    # a single input with x0 < 0 leaves unit 2 of layer 1 inactive as well
    assert active_unit_fraction(seq, x[:1]) == pytest.approx(2 / 7)
    assert active_unit_fraction(seq, x, threshold=0.6) == pytest.approx(2 / 7)  # 0.5 is below
    # conv units are channels: active if non-zero at any position of any input
    conv = nn.Sequential(nn.Conv2d(1, 3, 1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4, 1))
    with torch.no_grad():
        conv[0].weight.copy_(torch.tensor([1.0, 0.0, -1.0]).view(3, 1, 1, 1))
        conv[0].bias.zero_()
    img = torch.zeros(2, 1, 2, 2)
    img[0, 0, 0, 1] = 1.0  # channel 0 fires at one pixel, channel 2 never (negative weight)
    assert active_unit_fraction(conv, img) == pytest.approx(1 / 3)


def test_representation_ranks_against_manual_features():
    torch.manual_seed(9)
    net = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 2))
    x = torch.randn(25, 5)
    ranks = representation_ranks(net, x, energy=0.9)
    h1 = torch.relu(net[0](x)).detach()
    h2 = torch.tanh(net[2](h1)).detach()
    assert ranks["0"] == {"effective_rank": pytest.approx(effective_rank(h1)),
                          "energy_rank": numpy_energy_rank(h1, 0.9)}
    assert ranks["2"] == {"effective_rank": pytest.approx(effective_rank(h2)),
                          "energy_rank": numpy_energy_rank(h2, 0.9)}
    assert representation_ranks(nn.Linear(5, 2), x) == {}


# --------------------------------------------------------------------------------------------
# Ranking agreement
# --------------------------------------------------------------------------------------------


def test_pairwise_ranking_accuracy_against_loop():
    rng = np.random.default_rng(0)
    metric = rng.integers(0, 4, 15).astype(float)  # many ties
    truth = rng.integers(0, 5, 15).astype(float)
    score = count = 0
    for i in range(15):
        for j in range(i + 1, 15):
            if truth[i] == truth[j]:
                continue
            count += 1
            if metric[i] == metric[j]:
                score += 0.5
            elif (metric[i] > metric[j]) == (truth[i] > truth[j]):
                score += 1
    assert pairwise_ranking_accuracy(metric, truth) == pytest.approx(score / count)
    assert pairwise_ranking_accuracy([1, 2, 3], [10, 20, 30]) == 1.0
    assert pairwise_ranking_accuracy([3, 2, 1], [10, 20, 30]) == 0.0
    assert pairwise_ranking_accuracy([1, 1, 1], [10, 20, 30]) == 0.5
    assert pairwise_ranking_accuracy([1, 2, 0], [5, 5, 1]) == 1.0  # the tied-truth pair is skipped
    m, t = rng.normal(size=12), rng.normal(size=12)
    assert pairwise_ranking_accuracy(m, t) == pytest.approx((1 + kendall_tau(m, t)) / 2)


def test_spearman_and_kendall_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    for _ in range(5):
        a = rng.integers(0, 5, 20).astype(float)
        b = a + rng.integers(-2, 3, 20)
        assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b)[0], rel=1e-10)
        assert kendall_tau(a, b) == pytest.approx(stats.kendalltau(a, b)[0], rel=1e-10)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3])) and math.isnan(kendall_tau([1, 1, 1], [1, 2, 3]))


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


def test_bad_input_readiness():
    model = mlp(0)
    x, y = regression_data(6)
    ok = {"batch_size": 2}
    cases = [
        ((x[:0], y[:0]), ok, "inputs is empty"),
        ((x, y[:5]), ok, "targets has 5 samples"),
        ((x, y), {"batch_size": 0}, "batch_size must be an int >= 1"),
        ((x, y), {"batch_size": 7}, "batch_size=7 is larger than the number of samples"),
        ((x, y), {"n_batches": 0}, "n_batches must be an int >= 1"),
        ((x, y), {"estimator": "exact"}, "estimator must be one of"),
        ((x, y), {"task_labels": torch.zeros(4, dtype=torch.long)}, "task_labels has 4 entries"),
        ((x, y), {"chunk_size": 0}, "chunk_size must be"),
    ]
    for (xi, yi), kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            optimization_readiness(model, MSE, xi, yi, **kwargs)
    x_nan = x.clone()
    x_nan[2, 0] = float("nan")
    for estimator in ("sampled", "per_sample"):
        with pytest.raises(ValueError, match="inputs has 1 non-finite"):
            optimization_readiness(model, MSE, x_nan, y, estimator=estimator)

    def nan_gradient_loss(out, target):  # finite value, NaN gradient (d√u/du = ∞ at u = 0, times 0)
        return MSE(out, target) + torch.sqrt((out * 0).sum())

    for estimator in ("sampled", "per_sample"):
        with pytest.raises(ValueError, match=r"loss is nan \(gradient\)"):
            optimization_readiness(model, nan_gradient_loss, x, y, estimator=estimator)
    solved = model(x).detach()
    for estimator in ("sampled", "per_sample"):
        with pytest.raises(ValueError, match="loss is 0: .*undefined at a zero loss"):
            optimization_readiness(model, MSE, x, solved, estimator=estimator)
    frozen = mlp(0).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameter"):
        optimization_readiness(frozen, MSE, x, y)


def test_bad_input_gain_baselines_and_rankings():
    model = mlp(0)
    x, y = regression_data(6)
    base = {"k": 1, "lr": 0.1, "batch_size": 2}
    cases = [
        ({"k": 0}, "k must be an int >= 1"),
        ({"lr": 0.0}, "lr must be a finite number > 0"),
        ({"optimizer": "rmsprop"}, "optimizer must be one of"),
        ({"batch_size": 7}, "batch_size=7 is larger than the number of training samples"),
        ({"n_runs": 0}, "n_runs must be"),
        ({"indices": torch.zeros(5, 1, 2, dtype=torch.long)}, "indices must be a tensor of shape"),
        ({"n_runs": 1, "indices": torch.full((1, 1, 2), 6)}, r"indices must be integer indices in \[0, 6\)"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            k_step_gain(model, MSE, x, y, x, y, **{**base, **kwargs})
    with pytest.raises(ValueError, match="val_inputs is empty"):
        k_step_gain(model, MSE, x, y, x[:0], y[:0], **base)
    with pytest.raises(ValueError, match="loss is 0 on the validation set"):
        k_step_gain(model, MSE, x, y, x, model(x).detach(), **base)
    with pytest.raises(ValueError, match="energy must be a number in"):
        energy_rank(torch.randn(4, 3), 1.5)
    with pytest.raises(ValueError, match="energy must be a number in"):
        entk_energy_rank(model, x, 0.0)
    with pytest.raises(ValueError, match="features must have shape"):
        effective_rank(torch.randn(5))
    with pytest.raises(ValueError, match="no hidden layer"):
        active_unit_fraction(nn.Linear(3, 1), torch.randn(4, 3))
    with pytest.raises(ValueError, match="inputs is empty"):
        hidden_features(model, x[:0])
    with pytest.raises(ValueError, match="true_gains are all equal"):
        pairwise_ranking_accuracy([1, 2, 3], [1, 1, 1])
    with pytest.raises(ValueError, match="metric_values has 2 values but true_gains has 3"):
        pairwise_ranking_accuracy([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="must be finite"):
        spearman([1, float("nan")], [1, 2])
