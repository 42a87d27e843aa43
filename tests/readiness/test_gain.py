"""``readiness.gain``: the k-step simulation, step by step, against torch optimizers and loops."""

from __future__ import annotations

import pytest
import torch
from torch import nn


def _regression(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g, dtype=torch.float64), torch.randn(n, 2, generator=g, dtype=torch.float64)


def test_gain_steps_simulate_every_run_like_its_own_torch_optimizer():
    import copy

    from avalanche_plugins.core.calls import batch_loss, split_params
    from avalanche_plugins.readiness.gain import (
        _run_indices,
        _run_optimizer_state,
        _simulate_steps,
        _stack_runs,
    )

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    x, y = _regression(12, seed=1)
    indices = _run_indices(None, 12, n_runs=3, k=4, batch_size=5, seed=7)
    for optimizer, lr in (("sgd", 0.1), ("adam", 0.02)):
        params, consts = split_params(model)
        stacked = _stack_runs(params, 3)
        assert {name: tuple(p.shape) for name, p in stacked.items()} == \
            {name: (3, *p.shape) for name, p in params.items()}
        state = _run_optimizer_state(stacked, list(params), optimizer, (0.9, 0.999), 1e-8, None)
        assert (state is None) == (optimizer == "sgd")
        with torch.no_grad():
            _simulate_steps(batch_loss(model, nn.MSELoss(), consts, None), stacked, state, x, y, indices,
                            lr=lr, optimizer=optimizer)
        for run in range(3):
            reference = copy.deepcopy(model)
            opt = (torch.optim.SGD if optimizer == "sgd" else torch.optim.Adam)(reference.parameters(), lr=lr)
            for step in range(4):
                opt.zero_grad()
                nn.MSELoss()(reference(x[indices[run, step]]), y[indices[run, step]]).backward()
                opt.step()
            for name, p in reference.named_parameters():
                torch.testing.assert_close(stacked[name][run], p.detach(), rtol=1e-12, atol=1e-12)


def test_gain_validation_loss_is_the_mean_loss_per_run_whatever_the_chunks():
    from avalanche_plugins.core.calls import batch_loss, split_params
    from avalanche_plugins.readiness.gain import _stack_runs, _validation_loss

    model = nn.Linear(3, 2).double()
    x, y = _regression(11, seed=2)
    params, consts = split_params(model)
    run_loss = batch_loss(model, nn.MSELoss(), consts, None)
    stacked = _stack_runs(params, 2)
    with torch.no_grad():
        stacked["weight"][1] += 1.0
        direct = [float(((x @ stacked["weight"][r].T + stacked["bias"][r] - y) ** 2).mean()) for r in range(2)]
        for chunk in (1, 4, 11, 100):
            single = _validation_loss(run_loss, params, x, y, chunk, batched=False)
            runs = _validation_loss(run_loss, stacked, x, y, chunk, batched=True)
            assert abs(float(single) - direct[0]) < 1e-12
            assert runs.shape == (2,) and torch.allclose(runs, torch.tensor(direct, dtype=torch.float64), rtol=1e-12)


def test_gain_run_indices_are_seeded_subsets_or_the_checked_given_ones():
    import pytest

    from avalanche_plugins.readiness.gain import _run_indices

    drawn = _run_indices(None, 9, n_runs=4, k=3, batch_size=5, seed=3)
    assert drawn.shape == (4, 3, 5) and torch.equal(drawn, _run_indices(None, 9, n_runs=4, k=3, batch_size=5, seed=3))
    assert all(len(set(row.tolist())) == 5 and max(row.tolist()) < 9 for row in drawn.reshape(-1, 5))
    given = torch.zeros(2, 1, 3, dtype=torch.int32)
    assert _run_indices(given, 9, n_runs=2, k=1, batch_size=3, seed=0).dtype == torch.int64
    with pytest.raises(ValueError, match="shape"):
        _run_indices(given, 9, n_runs=2, k=2, batch_size=3, seed=0)
    with pytest.raises(ValueError, match=r"in \[0, 9\)"):
        _run_indices(given + 9, 9, n_runs=2, k=1, batch_size=3, seed=0)


def test_gain_result_is_the_mean_relative_decrease_and_its_standard_error():
    import math

    from avalanche_plugins.readiness.gain import _gain_result

    after = torch.tensor([1.0, 1.5, 0.5], dtype=torch.float64)
    res = _gain_result(2.0, after, k=3, n_runs=3, indices=torch.zeros(3, 3, 1))
    gains = [0.5, 0.25, 0.75]
    sd = math.sqrt(sum((g - 0.5) ** 2 for g in gains) / 2)
    assert res.gain == 0.5 and abs(res.stderr - sd / math.sqrt(3)) < 1e-15 and res.loss_after_mean == 1.0
    assert math.isnan(_gain_result(2.0, after[:1], k=1, n_runs=1, indices=None).stderr)


def test_gain_adam_continues_from_a_checkpoints_optimizer_state():
    """``adam_state`` with zero moments is a fresh Adam; a real state is continued step by step as
    ``torch.optim.Adam`` loaded with it continues."""
    import copy

    from avalanche_plugins.readiness import k_step_gain
    from avalanche_plugins.study.catalog.zoo import MLP

    torch.manual_seed(0)
    model = MLP((6,), hidden=(5,), n_classes=1)
    x, y = torch.randn(40, 6), torch.randn(40, 1)
    fresh = torch.optim.Adam(model.parameters(), lr=0.01).state_dict()
    fresh["state"] = {i: {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
                      for i, p in enumerate(model.parameters())}
    common = dict(k=4, lr=0.01, optimizer="adam", batch_size=2, n_runs=6, seed=3)
    ours = k_step_gain(model, nn.MSELoss(), x, y, x, y, adam_state=fresh, **common)
    ref = k_step_gain(model, nn.MSELoss(), x, y, x, y, **common)
    assert ours.gain == pytest.approx(ref.gain, rel=1e-5, abs=1e-7)
    # a non-trivial state: one run replayed with torch.optim.Adam continuing from it
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for i in range(7):
        opt.zero_grad()
        nn.MSELoss()(model(x[i:i + 1]), y[i:i + 1]).backward()
        opt.step()
    state = copy.deepcopy(opt.state_dict())
    res = k_step_gain(model, nn.MSELoss(), x, y, x, y, k=3, lr=0.01, optimizer="adam", batch_size=2, n_runs=1,
                      seed=5, adam_state=state)
    replay = copy.deepcopy(model)
    opt2 = torch.optim.Adam(replay.parameters(), lr=0.01)
    opt2.load_state_dict(state)
    with torch.no_grad():
        before = nn.MSELoss()(model(x), y).item()
    for t in range(3):
        index = res.indices[0, t]
        opt2.zero_grad()
        nn.MSELoss()(replay(x[index]), y[index]).backward()
        opt2.step()
    with torch.no_grad():
        after = nn.MSELoss()(replay(x), y).item()
    assert res.gain == pytest.approx((before - after) / before, rel=1e-4, abs=1e-6)
    # one Adam setting serves every run: groups that differ in betas, or entries at different steps, are refused
    params = list(model.parameters())
    split = torch.optim.Adam([{"params": params[:2]}, {"params": params[2:], "betas": (0.5, 0.9)}], lr=0.01)
    nn.MSELoss()(model(x), y).backward()
    split.step()
    lagging = copy.deepcopy(state)
    lagging["state"][1]["step"] = torch.tensor(2.0)
    for bad, what in ((split.state_dict(), "betas"), (lagging, "steps")):
        with pytest.raises(ValueError, match=f"adam_state: .*{what}"):
            k_step_gain(model, nn.MSELoss(), x, y, x, y, k=1, lr=0.01, optimizer="adam", batch_size=2, adam_state=bad)
