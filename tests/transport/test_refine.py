"""``transport.refine``: the Levenberg–Marquardt steps against linear least squares."""

from __future__ import annotations

import torch


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
