"""Our readiness variants (issue 33): lookahead readiness and curvature readiness, against
independent computations (closed forms on a linear model, autograd's HVP, a loop of GD steps)."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

from avalanche_plugins.readiness import k_step_gain
from avalanche_plugins.readiness.lookahead import curvature_readiness, lookahead_readiness


def _linear_problem(seed=0, n=40, d=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randn(n, 1, generator=g, dtype=torch.float64)
    net = nn.Linear(d, 1).double()
    return net, x, y


def test_curvature_readiness_closed_form_on_least_squares():
    net, x, y = _linear_problem()
    xt = np.hstack([x.numpy(), np.ones((len(x), 1))])  # [x, 1]: weights then bias
    theta = np.concatenate([net.weight.detach().numpy().ravel(), net.bias.detach().numpy()])
    resid = xt @ theta - y.numpy().ravel()
    loss = float(np.mean(resid ** 2))
    g = 2 * xt.T @ resid / len(x)
    hessian = 2 * xt.T @ xt / len(x)
    lr = 0.05
    res = curvature_readiness(net, nn.MSELoss(), x, y, lr=lr, chunk_size=7)
    tol = dict(rel=1e-10)  # float64 throughout
    assert res.loss == pytest.approx(loss, **tol)
    assert res.grad_norm_sq == pytest.approx(float(g @ g), **tol)
    assert res.grad_curvature == pytest.approx(float(g @ hessian @ g), **tol)
    assert res.curvature == pytest.approx(float(g @ hessian @ g / (g @ g)), **tol)
    # a quadratic loss: Q(η) is the exact relative decrease of one full-batch step
    step = theta - lr * g
    after = float(np.mean((xt @ step - y.numpy().ravel()) ** 2))
    assert res.quadratic_gain == pytest.approx((loss - after) / loss, **tol)


def test_curvature_readiness_against_autograd_hvp_on_a_tanh_net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 4)).double()
    x = torch.randn(30, 6, dtype=torch.float64)
    y = torch.randint(0, 4, (30,))
    loss_fn = nn.CrossEntropyLoss()
    params = tuple(net.parameters())

    def loss_of(*ps):
        out = torch.func.functional_call(net, {n: p for (n, _), p in zip(net.named_parameters(), ps)}, (x,))
        return loss_fn(out, y)

    grads = torch.autograd.grad(loss_of(*params), params)
    _, hv = torch.autograd.functional.hvp(loss_of, params, grads)
    ghg = sum(float((a * b).sum()) for a, b in zip(grads, hv))
    res = curvature_readiness(net, loss_fn, x, y, lr=0.1, chunk_size=8)
    assert res.grad_curvature == pytest.approx(ghg, rel=1e-9)
    gnorm = sum(float((a * a).sum()) for a in grads)
    assert res.quadratic_gain == pytest.approx((0.1 * gnorm - 0.005 * ghg) / float(loss_of(*params).detach()), rel=1e-9)


def test_curvature_readiness_rules():
    net, x, y = _linear_problem()
    with pytest.raises(ValueError, match="lr"):
        curvature_readiness(net, nn.MSELoss(), x, y, lr=0.0)
    with torch.no_grad():  # an exact fit: zero loss, relative gain undefined
        net.weight.zero_()
        net.bias.zero_()
    with pytest.raises(ValueError, match="loss"):
        curvature_readiness(net, nn.MSELoss(), x, torch.zeros_like(y), lr=0.1)


def test_lookahead_is_the_k_step_gain_with_its_protocol_and_leaves_the_model():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(50, 5), torch.randint(0, 3, (50,))
    xv, yv = torch.randn(20, 5), torch.randint(0, 3, (20,))
    before = copy.deepcopy(net.state_dict())
    la = lookahead_readiness(net, nn.CrossEntropyLoss(), x, y, lr=0.1, k=4, n_runs=6, eval_inputs=xv,
                             eval_targets=yv, seed=9)
    ref = k_step_gain(net, nn.CrossEntropyLoss(), x, y, xv, yv, k=4, lr=0.1, batch_size=4, n_runs=6, seed=9)
    assert la.readiness == ref.gain and la.stderr == ref.stderr and la.loss == ref.loss_before
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    again = lookahead_readiness(net, nn.CrossEntropyLoss(), x, y, lr=0.1, k=4, n_runs=6, eval_inputs=xv,
                                eval_targets=yv, seed=9)
    assert again.readiness == la.readiness
    with pytest.raises(ValueError, match="eval_inputs"):
        lookahead_readiness(net, nn.CrossEntropyLoss(), x, y, lr=0.1, eval_inputs=xv)


def test_full_batch_lookahead_against_a_loop_of_gradient_steps():
    net, x, y = _linear_problem(seed=2)
    lr, k = 0.05, 6
    la = lookahead_readiness(net, nn.MSELoss(), x, y, lr=lr, k=k, n_runs=1, batch_size=len(x))
    ref = copy.deepcopy(net)
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    loss0 = nn.MSELoss()(ref(x), y).item()
    for _ in range(k):
        opt.zero_grad()
        nn.MSELoss()(ref(x), y).backward()
        opt.step()
    after = nn.MSELoss()(ref(x), y).item()
    assert la.readiness == pytest.approx((loss0 - after) / loss0, rel=1e-9)
