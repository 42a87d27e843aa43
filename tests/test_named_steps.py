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
