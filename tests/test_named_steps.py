"""The small named steps that the long kernels were cut into, each against an independent computation."""

from __future__ import annotations

import torch
from torch import nn

from avalanche_plugins.core.calls import task_batches


class _TwoHeads(nn.Module):
    """Duck-typed multi-task model (``forward_single_task``): no avalanche import needed."""

    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(2, 1), nn.Linear(2, 1)])

    def forward_single_task(self, x, task_label):
        return self.heads[task_label](x)

    def forward(self, x, task_label):
        return self.forward_single_task(x, task_label)


def test_task_batches_cover_every_sample_once_with_its_own_label_and_share():
    x = torch.arange(14.0).reshape(7, 2)
    y = torch.arange(7)
    t = torch.tensor([1, 0, 1, 1, 0, 1, 1])
    chunks = list(task_batches(_TwoHeads(), x, y, t, chunk_size=2))
    # task 0: samples 1, 4 (one chunk); task 1: samples 0, 2, 3, 5, 6 (chunks of 2, 2, 1)
    assert [(label, ys.tolist()) for label, _, ys, _ in chunks] == [(0, [1, 4]), (1, [0, 2]), (1, [3, 5]), (1, [6])]
    for label, xs, ys, weight in chunks:
        assert torch.equal(xs, x[ys]) and bool((t[ys] == label).all())
        assert weight == len(ys) / 7
    assert sum(w for *_, w in chunks) == 1.0


def test_task_batches_of_a_plain_model_is_one_group_in_order_and_targets_may_be_absent():
    x = torch.randn(5, 2)
    chunks = list(task_batches(nn.Linear(2, 1), x, task_labels=torch.tensor([0, 1, 0, 1, 0])))
    assert len(chunks) == 1
    label, xs, ys, weight = chunks[0]
    assert label is None and ys is None and weight == 1.0 and torch.equal(xs, x)


def test_task_batches_reuse_precomputed_groups():
    x, y = torch.randn(4, 2), torch.arange(4)
    groups = [(3, torch.tensor([2, 0]))]
    assert [(label, ys.tolist(), w) for label, _, ys, w in task_batches(nn.Linear(2, 1), x, y, groups=groups)] \
        == [(3, [2, 0], 0.5)]


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


def test_levenberg_marquardt_reaches_the_least_squares_solution_of_a_linear_problem():
    from avalanche_plugins.transport.refine import _direct_solver, _levenberg_marquardt

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(20, 3, generator=g, dtype=torch.float64), torch.randn(20, generator=g, dtype=torch.float64)

    def objective(params):
        return float(((b - a @ params[0]) ** 2).sum())

    def damped_system(params):
        return _direct_solver(a.T @ a, a.T @ (b - a @ params[0]))

    start = (torch.zeros(3, dtype=torch.float64),)
    (solution,) = _levenberg_marquardt(start, objective, damped_system, [3], iterations=30, damping=0.1, max_tries=6)
    torch.testing.assert_close(solution, torch.linalg.lstsq(a, b[:, None]).solution[:, 0])
    # no iterations: the start is returned as it is
    assert _levenberg_marquardt(start, objective, damped_system, [3], iterations=0, damping=0.1,
                                max_tries=6) is start


def test_the_direct_solver_adds_the_damping_on_the_diagonal_and_maps_the_solution_back():
    from avalanche_plugins.transport.refine import _direct_solver

    gram = torch.tensor([[2.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    rhs = torch.tensor([1.0, -1.0], dtype=torch.float64)
    expected = torch.linalg.solve(gram + 0.5 * torch.eye(2, dtype=torch.float64), rhs)
    diagonal, solve = _direct_solver(gram.clone(), rhs, back=lambda x: 2 * x)
    assert diagonal.tolist() == [2.0, 3.0]
    torch.testing.assert_close(solve(0.5), 2 * expected)


def test_discover_layers_steps_one_rule_each():
    from avalanche_plugins.core import layers as L

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.token = nn.Parameter(torch.zeros(4))
            self.fc = nn.Linear(4, 4)
            self.act = nn.ReLU()
            self.bn = nn.BatchNorm1d(4)
            self.attn = nn.MultiheadAttention(4, 2)
            self.fc2 = nn.Linear(4, 4)
            self.late_bn = nn.BatchNorm1d(4)

        def forward(self, x):
            h = self.bn(self.act(self.fc(x + self.token)))
            a = self.attn(h[None], h[None], h[None])[0][0]
            return self.late_bn(torch.tanh(self.fc2(a)))  # tanh called as a function: invisible to the trace

    net = Net()
    trace = L._trace(net, torch.randn(3, 4))
    assert [trace.names[m] for m, _, _ in trace.calls] == ["fc", "act", "bn", "attn", "fc2", "late_bn"]
    layers = L._choose_layers(net, trace)
    assert [trace.names[m] for m in layers] == ["fc", "attn", "fc2"]
    norm_of = L._attach_norms(trace, layers)
    assert {trace.names[m]: n for m, n in norm_of.items()} == {"fc": "bn"}
    owner, unassigned = L._assign_parameters(net, trace, layers)
    assert {p: trace.names[m] for p, m in owner.items()}["attn.out_proj.weight"] == "attn"
    assert unassigned == {"token": "parameter of a container, not of a layer", "bn.weight": "normalisation layer",
                          "bn.bias": "normalisation layer", "late_bn.weight": "normalisation layer",
                          "late_bn.bias": "normalisation layer"}
    assert L._untraced_norms(trace, layers, norm_of) == {"fc2": "late_bn"}


def test_grow_leaves_the_default_interventions_alone_and_treats_its_newborns_with_its_own():
    from avalanche_plugins.structural import Interventions, UnitMasks

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 10), nn.ReLU(), nn.Linear(10, 2))
    masks = UnitMasks(net, torch.randn(2, 3))
    masks.set_masks({"0": torch.arange(10) < 5})
    default = masks.interventions
    assert masks.newborn_interventions is default
    iv = Interventions(newborn_lr=0.1)
    masks.grow({"0": torch.arange(10.0)}, {"0": 7}, interventions=iv)
    assert masks.interventions is default and masks.newborn_interventions is iv


def test_the_slot_types_are_public_and_the_unit_policy_lives_apart_from_the_mask():
    import avalanche_plugins.structural.masks as masks_module
    from avalanche_plugins.structural import interventions, scores, selection, slots

    assert masks_module._Slot is slots.Slot and masks_module._Layer is slots.MaskedLayer  # old pickles load
    assert scores.lowest_active is selection.lowest_active and scores.highest_masked is selection.highest_masked
    assert interventions.reinit_rows.__annotations__["layer"] in ("MaskedLayer", slots.MaskedLayer)


def test_folded_quadratics_equal_the_sum_of_the_experiences_quadratics():
    from avalanche_plugins.layer_adaptive.quadratic import fold_quadratic, quadratic_penalty

    g = torch.Generator().manual_seed(0)
    experiences = [(torch.rand(6, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64))
                   for _ in range(3)]
    experiences[1][0][2] = 0.0  # an entry without curvature in one experience
    curvature = anchor = None
    constant = 0.0
    for a, star in experiences:
        curvature, anchor, k = fold_quadratic(curvature, anchor, a, star)
        constant += k
    for _ in range(5):
        theta = torch.randn(6, generator=g, dtype=torch.float64)
        direct = sum(float((a * (theta - star).pow(2)).sum()) for a, star in experiences)
        folded = float(quadratic_penalty({"w": theta}, ["w"], curvature, anchor)) + constant
        assert abs(folded - direct) < 1e-10 * max(1.0, abs(direct))


def test_online_folding_decays_the_old_curvature_and_moves_the_anchor():
    from avalanche_plugins.layer_adaptive.quadratic import fold_quadratic

    c, m, k = fold_quadratic(torch.tensor([2.0, 1.0]), torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0]),
                             torch.tensor([5.0, 6.0]), online=True, decay=0.5)
    assert c.tolist() == [2.0, 1.5] and m.tolist() == [5.0, 6.0] and k == 0.0
    # a grown parameter: the old entries are zero-padded
    c, m, _ = fold_quadratic(torch.tensor([2.0]), torch.tensor([1.0]), torch.tensor([1.0, 3.0]), torch.tensor([1.0, 4.0]))
    assert c.tolist() == [3.0, 3.0] and m.tolist() == [1.0, 4.0]


def test_the_quadratic_penalty_runs_over_views_of_flat_buffers_for_several_parameters():
    from avalanche_plugins.layer_adaptive.quadratic import quadratic_penalty

    params = {"a": torch.randn(2, 3, requires_grad=True), "b": torch.randn(4, requires_grad=True), "c": torch.ones(1)}
    c, m = torch.rand(10), torch.randn(10)
    flat = torch.cat([params["a"].reshape(-1), params["b"]])
    value = quadratic_penalty(params, ["a", "b"], c, m)
    torch.testing.assert_close(value, (c * (flat - m) ** 2).sum())
    value.backward()
    torch.testing.assert_close(params["b"].grad, 2 * c[6:] * (params["b"].detach() - m[6:]))


# --- readiness.gain: the k-step simulation as steps --------------------------------------------


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


# --- transport.keys: one closed-form fit per key family ------------------------------------------


def _anchors(u, v, family="channel", ridge=0.0):
    from avalanche_plugins.transport.keys import _centred_anchors

    return _centred_anchors(u.double(), v.double(), family, ridge)


def test_key_fits_are_dispatched_one_per_family():
    from avalanche_plugins.transport.keys import _FITS, FAMILIES

    assert tuple(_FITS) == FAMILIES
    assert _FITS["identity"](_anchors(torch.randn(5, 2), torch.randn(5, 2))) == {}


def test_centred_anchors_scale_the_ridge_by_the_mean_channel_energy_and_refuse_what_cannot_be_fitted():
    import pytest

    g = torch.Generator().manual_seed(0)
    u, v = torch.randn(8, 3, generator=g), torch.randn(8, 3, generator=g)
    a = _anchors(u, v, ridge=0.5)
    uc = u.double() - u.double().mean(0)
    assert torch.allclose(a.Uc, uc) and torch.allclose(a.mu_v, v.double().mean(0))
    assert abs(a.lam - 0.5 * float(torch.trace(uc.T @ uc)) / 3) < 1e-12
    with pytest.raises(ValueError, match="more samples than channels"):
        _anchors(u[:3], v[:3], "cross_channel", 0.0)
    assert _anchors(u[:3], v[:3], "identity", 0.0).lam == 0.0
    with pytest.raises(ValueError, match="constant"):
        _anchors(torch.ones(8, 3), v, "procrustes", 0.1)


def test_channel_fit_is_a_per_channel_ridge_regression_with_intercept():
    import numpy as np

    from avalanche_plugins.transport.keys import _channel_fit

    g = torch.Generator().manual_seed(1)
    u = torch.randn(30, 4, generator=g, dtype=torch.float64)
    v = 0.7 * u + torch.randn(30, 4, generator=g, dtype=torch.float64)
    u[:, 2] = 3.0  # a dead channel: scale 0, the bias is v's anchor mean
    a = _anchors(u, v, ridge=0.0)
    fit = _channel_fit(a)
    for c in (0, 1, 3):  # ridge 0: ordinary least squares of v_c on [u_c, 1]
        (slope, intercept), *_ = np.linalg.lstsq(np.stack([u[:, c].numpy(), np.ones(30)], 1), v[:, c].numpy(), rcond=None)
        assert abs(float(fit["scale"][c]) - slope) < 1e-10 and abs(float(fit["bias"][c]) - intercept) < 1e-10
    assert float(fit["scale"][2]) == 0.0 and abs(float(fit["bias"][2]) - float(v[:, 2].mean())) < 1e-12
    ridged = _channel_fit(_anchors(u, v, ridge=0.2))
    lam = _anchors(u, v, ridge=0.2).lam
    uc, vc = (u - u.mean(0)).numpy(), (v - v.mean(0)).numpy()
    for c in (0, 1, 3):  # ridge: the augmented least squares [ũ_c; √λ] s ≈ [ṽ_c; 0]
        s, *_ = np.linalg.lstsq(np.append(uc[:, c], np.sqrt(lam))[:, None], np.append(vc[:, c], 0.0), rcond=None)
        assert abs(float(ridged["scale"][c]) - s[0]) < 1e-10


def test_cross_channel_fit_is_a_ridge_regression_on_the_augmented_system():
    import numpy as np

    from avalanche_plugins.transport.keys import _cross_channel_fit

    g = torch.Generator().manual_seed(2)
    u = torch.randn(25, 3, generator=g, dtype=torch.float64)
    v = u @ torch.randn(3, 5, generator=g, dtype=torch.float64) + 0.1 * torch.randn(25, 5, generator=g, dtype=torch.float64)
    for ridge in (0.0, 0.3):
        a = _anchors(u, v, "cross_channel", ridge)
        fit = _cross_channel_fit(a)
        uc, vc = a.Uc.numpy(), a.Vc.numpy()
        lhs = np.vstack([uc, np.sqrt(a.lam) * np.eye(3)])
        rhs = np.vstack([vc, np.zeros((3, 5))])
        m_t, *_ = np.linalg.lstsq(lhs, rhs, rcond=None)
        assert fit["weight"].shape == (5, 3)
        np.testing.assert_allclose(fit["weight"].numpy(), m_t.T, rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(fit["bias"].numpy(), a.mu_v.numpy() - m_t.T @ a.mu_u.numpy(), rtol=1e-9, atol=1e-11)


def test_procrustes_fit_is_scipys_orthogonal_procrustes():
    import numpy as np
    from scipy.linalg import orthogonal_procrustes

    from avalanche_plugins.transport.keys import _procrustes_fit

    g = torch.Generator().manual_seed(3)
    u = torch.randn(40, 4, generator=g, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=torch.float64))
    v = u @ q + 0.05 * torch.randn(40, 4, generator=g, dtype=torch.float64) + 2.0
    a = _anchors(u, v, "procrustes", 0.0)
    fit = _procrustes_fit(a)
    r, _ = orthogonal_procrustes(a.Uc.numpy(), a.Vc.numpy())  # argmin ‖Ũ R − Ṽ‖ over orthogonal R
    np.testing.assert_allclose(fit["weight"].numpy(), r.T, atol=1e-10)
    np.testing.assert_allclose(fit["bias"].numpy(), a.mu_v.numpy() - r.T @ a.mu_u.numpy(), atol=1e-10)


def test_relative_residual_is_the_unexplained_variance_fraction():
    import math

    from avalanche_plugins.transport.keys import _relative_residual

    g = torch.Generator().manual_seed(4)
    u, v = torch.randn(10, 2, generator=g), torch.randn(10, 2, generator=g)
    a = _anchors(u, v)
    fitted = a.V + 0.5
    assert abs(_relative_residual(a, fitted) - 0.25 * 20 / float(((a.V - a.V.mean(0)) ** 2).sum())) < 1e-12
    assert _relative_residual(a, a.mu_v.expand_as(a.V)) == 1.0
    const = _anchors(u, torch.full((10, 2), 3.0))
    assert _relative_residual(const, const.V) == 0.0 and _relative_residual(const, const.V + 1) == math.inf


def test_option_groups_are_the_flat_keywords():
    import pickle

    import pytest

    from avalanche_plugins.layer_adaptive import CurvatureOptions, FisherOptions
    from avalanche_plugins.layer_adaptive.ewc_plugin import LayerAdaptiveEWCPlugin
    from avalanche_plugins.layer_adaptive.lr_plugin import LayerAdaptiveLRPlugin

    flat = LayerAdaptiveEWCPlugin(10.0, schedule="smoothed", curvature="hessian", spectrum_samples=32,
                                  spectrum_max_iter=7, fisher="expected", fisher_chunk_size=4, seed=3)
    grouped = LayerAdaptiveEWCPlugin(10.0, schedule="smoothed",
                                     curvature_options=CurvatureOptions("hessian", 32, spectrum_max_iter=7, seed=3),
                                     fisher_options=FisherOptions("expected", fisher_chunk_size=4))
    keys = ("curvature", "spectrum_samples", "spectrum_chunk_size", "spectrum_max_iter", "spectrum_tol", "seed",
            "fisher", "fisher_samples", "fisher_chunk_size")
    assert {k: getattr(flat, k) for k in keys} == {k: getattr(grouped, k) for k in keys}
    assert pickle.loads(pickle.dumps(grouped)).spectrum_samples == 32
    assert LayerAdaptiveLRPlugin(curvature_options=CurvatureOptions(spectrum_samples=16)).spectrum_samples == 16
    with pytest.raises(ValueError, match="give either curvature_options or the keywords spectrum_samples"):
        LayerAdaptiveEWCPlugin(1.0, spectrum_samples=8, curvature_options=CurvatureOptions())
    with pytest.raises(ValueError, match="spectrum_samples"):
        CurvatureOptions(spectrum_samples=0)
    with pytest.raises(ValueError, match="fisher"):
        FisherOptions(fisher="diagonal")
