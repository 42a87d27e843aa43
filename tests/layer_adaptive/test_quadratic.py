"""``layer_adaptive.quadratic``: folded quadratic penalties against their sums."""

from __future__ import annotations

import torch


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
