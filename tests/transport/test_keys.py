"""Transport keys: exact recovery of known drifts, controls, layouts, closed forms, bad input."""

import copy
import math

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from avalanche_plugins.transport import (
    TransportKey,
    channel_permutation,
    class_balanced_anchors,
    correspondence_break,
    fit_transport_key,
    gauss_newton_key,
    recovery,
    refine_key,
    stage_activations,
    stitch,
    stitched_accuracy,
)

STAGE = "3"  # output of the 3x3 conv "3", read only by the 1x1 conv "4": a linear map follows


@pytest.fixture(scope="module")
def digits():
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target)
    return x, y


@pytest.fixture(scope="module")
def trained_cnn(digits):
    """A small CNN trained for 150 Adam steps on the 8x8 digits (train/test split 1500/297)."""
    x, y = digits
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 12, 1), nn.BatchNorm2d(12), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(48, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(150):
        idx = torch.randint(0, 1500, (64,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
        opt.step()
    net.zero_grad(set_to_none=True)
    return net.eval()


def drifted(net, a, b):
    """Copy of ``net`` whose stage output becomes ``A v + b`` while the network function is unchanged:
    conv "3" is composed with (A, b) and conv "4" (1x1, linear) with the inverse."""
    out = copy.deepcopy(net)
    conv, mix = out[3], out[4]
    a_inv = torch.linalg.inv(a)
    with torch.no_grad():
        conv.weight.copy_(torch.einsum("oc,cikl->oikl", a, conv.weight))
        conv.bias.copy_(a @ conv.bias + b)
        w = mix.weight[:, :, 0, 0] @ a_inv
        mix.bias.copy_(mix.bias - w @ b)
        mix.weight.copy_(w[:, :, None, None])
    return out


def channel_drift(seed=1, c=8):
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.empty(c).uniform_(-1.5, 1.5, generator=g))
    return torch.diag(scale), 2.0 * torch.randn(c, generator=g)


def channel_mixing(seed=2, c=8):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(c, c, generator=g))
    return q @ torch.diag(torch.exp(torch.empty(c).uniform_(-1, 1, generator=g))), torch.zeros(c)


def stitched_result(net, updated, family, x_anchor, x_test, y_test, ridge=0.0):
    u = stage_activations(updated, STAGE, x_anchor)
    v = stage_activations(net, STAGE, x_anchor)
    key = fit_transport_key(u.detach(), v.detach(), family, ridge=ridge)
    model = stitch(updated, net, STAGE, key)
    return key, model, stitched_accuracy(model, x_test, y_test)


def test_drifted_network_is_the_same_function(trained_cnn, digits):
    x, _ = digits
    for a, b in (channel_drift(), channel_mixing()):
        updated = drifted(trained_cnn, a, b)
        with torch.no_grad():
            torch.testing.assert_close(updated(x[1500:]), trained_cnn(x[1500:]), atol=1e-4, rtol=1e-4)


def test_channel_key_recovers_a_per_channel_drift_exactly(trained_cnn, digits):
    x, y = digits
    acc_a = stitched_accuracy(trained_cnn, x[1500:], y[1500:])
    assert acc_a > 0.7
    updated = drifted(trained_cnn, *channel_drift())
    x_anchor, _ = class_balanced_anchors((x[:1500], y[:1500]), 50, seed=0)
    key, model, acc_channel = stitched_result(trained_cnn, updated, "channel", x_anchor, x[1500:], y[1500:])
    assert abs(acc_channel - acc_a) <= 1e-4
    assert key.residual < 1e-8
    with torch.no_grad():
        torch.testing.assert_close(model(x[1500:]), trained_cnn(x[1500:]), atol=1e-3, rtol=1e-3)
    _, _, acc_identity = stitched_result(trained_cnn, updated, "identity", x_anchor, x[1500:], y[1500:])
    assert acc_identity < acc_a - 0.2


def test_cross_channel_key_recovers_a_mixing_and_channel_key_does_not(trained_cnn, digits):
    x, y = digits
    acc_a = stitched_accuracy(trained_cnn, x[1500:], y[1500:])
    updated = drifted(trained_cnn, *channel_mixing())
    x_anchor, _ = class_balanced_anchors((x[:1500], y[:1500]), 50, seed=0)
    _, _, acc_cross = stitched_result(trained_cnn, updated, "cross_channel", x_anchor, x[1500:], y[1500:])
    assert abs(acc_cross - acc_a) <= 1e-4
    _, _, acc_channel = stitched_result(trained_cnn, updated, "channel", x_anchor, x[1500:], y[1500:])
    assert acc_channel < acc_a - 0.1
    # the default relative ridge barely moves the answer
    _, _, acc_ridge = stitched_result(trained_cnn, updated, "cross_channel", x_anchor, x[1500:], y[1500:],
                                      ridge=1e-4)
    assert acc_ridge >= acc_a - 0.01


def test_controls_lose_what_the_key_recovered(trained_cnn, digits):
    x, y = digits
    acc_a = stitched_accuracy(trained_cnn, x[1500:], y[1500:])
    updated = drifted(trained_cnn, *channel_mixing())
    # a flat stage (the pooled features) so that mispairing anchors breaks every sample's pairing
    x_anchor, y_anchor = class_balanced_anchors((x[:1500], y[:1500]), 200, seed=0)
    u, v = stage_activations(updated, "8", x_anchor), stage_activations(trained_cnn, "8", x_anchor)
    key = fit_transport_key(u, v, "cross_channel", ridge=1e-4)
    shuffled = correspondence_break(u, v, "cross_channel", mode="global", seed=0)
    acc_shuffled = stitched_accuracy(stitch(updated, trained_cnn, "8", shuffled), x[1500:], y[1500:])
    assert acc_shuffled < 0.25  # near chance (0.1 for ten classes)
    within = correspondence_break(u, v, "cross_channel", mode="within_class", labels=y_anchor, seed=0)
    acc_within = stitched_accuracy(stitch(updated, trained_cnn, "8", within), x[1500:], y[1500:])
    assert acc_shuffled < acc_within  # class statistics survive a within-class shuffle
    # at the conv stage, the permuted-channel control loses the recovery
    u3, v3 = stage_activations(updated, STAGE, x_anchor), stage_activations(trained_cnn, STAGE, x_anchor)
    key3 = fit_transport_key(u3, v3, "cross_channel")
    acc_perm = stitched_accuracy(stitch(updated, trained_cnn, STAGE, channel_permutation(key3, seed=0)),
                                 x[1500:], y[1500:])
    assert acc_perm < acc_a - 0.2
    assert key.residual < shuffled.residual


def test_refine_key_reduces_logit_mismatch_without_touching_the_models(trained_cnn, digits):
    x, y = digits
    updated = drifted(trained_cnn, *channel_mixing())
    with torch.no_grad():  # an imperfect starting key: channel family on a mixing drift
        updated[3].bias.add_(0.5)
    x_anchor, _ = class_balanced_anchors((x[:1500], y[:1500]), 50, seed=0)
    u, v = stage_activations(updated, STAGE, x_anchor).detach(), stage_activations(trained_cnn, STAGE, x_anchor).detach()
    key = fit_transport_key(u, v, "channel")
    model = stitch(updated, trained_cnn, STAGE, key)
    before = {k: t.clone() for k, t in trained_cnn.state_dict().items()}

    def mismatch():
        with torch.no_grad():
            return float(((model(x_anchor) - trained_cnn(x_anchor)) ** 2).mean())

    start = mismatch()
    refine_key(key, model, x_anchor, steps=30, lr=1e-2)
    assert mismatch() < 0.8 * start
    for k, t in trained_cnn.state_dict().items():
        assert torch.equal(t, before[k])
    assert all(p.grad is None for p in trained_cnn.parameters())
    assert all(not p.requires_grad for p in key.parameters())


def _dense_gauss_newton_step(key, stitched, x, damping):
    """Reference LM step from the dense Jacobian (``torch.func.jacrev``) of the stitched logits."""
    names = [n for n, _ in key.named_parameters()]
    params = tuple(p.detach().clone() for p in key.parameters())
    u = stage_activations(stitched.early_model, stitched.stage, x).detach()
    with torch.no_grad():
        target = stitched.late_model(x)

    def logits(*ps):
        return stitched.forward_from_stage(torch.func.functional_call(key, dict(zip(names, ps)), (u,)), x)

    jac = torch.cat([j.detach().flatten(2) for j in torch.func.jacrev(logits, argnums=tuple(range(len(params))))(*params)],
                    2).flatten(0, 1).double()
    res = (target - logits(*params)).detach().flatten().double()
    gram = jac @ jac.T if jac.shape[0] < jac.shape[1] else jac.T @ jac
    lam = damping * float(gram.diagonal().mean())
    step = torch.linalg.solve(jac.T @ jac + lam * torch.eye(jac.shape[1], dtype=jac.dtype), jac.T @ res)
    return torch.cat([p.flatten() for p in params]).double() + step


def _tiny_pair(kind):
    torch.manual_seed(1)
    if kind == "flat":
        make = lambda: nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))  # noqa: E731
        return make().eval(), make().eval(), torch.randn(12, 6), "1"
    if kind == "strided":  # 6 channels on 2 x 2: a cross-channel key has more numbers (42) than h (24)
        make = lambda: nn.Sequential(nn.Conv2d(1, 6, 3, stride=2), nn.Tanh(), nn.Flatten(), nn.Linear(24, 3))  # noqa: E731
        return make().eval(), make().eval(), torch.randn(3, 1, 6, 6), "1"
    make = lambda: nn.Sequential(nn.Conv2d(1, 3, 3), nn.Tanh(), nn.Conv2d(3, 4, 3), nn.Tanh(),  # noqa: E731
                                 nn.Flatten(), nn.Linear(16, 3))
    return make().eval(), make().eval(), torch.randn(3 if kind == "conv3" else 5, 1, 6, 6), "1"


@pytest.mark.parametrize("kind", ["flat", "conv", "conv3", "strided"])
@pytest.mark.parametrize("family", ["channel", "cross_channel"])
@pytest.mark.parametrize("chunk_size", [1, 5, 256])
def test_gauss_newton_step_matches_a_dense_jacobian_computation(kind, family, chunk_size):
    """One accepted LM iteration equals the step solved from the dense Jacobian (jacrev), both in
    the primal (P ≤ N·K) and the dual (N·K < P: cross-channel keys on conv3 and strided) form, with
    the Jacobian's rows in chunks of one row, of a few anchors' logits or all at once."""
    checkpoint, updated, x, stage = _tiny_pair(kind)
    key = fit_transport_key(stage_activations(updated, stage, x), stage_activations(checkpoint, stage, x), family,
                            ridge=1e-3)
    stitched = stitch(updated, checkpoint, stage, key)
    expected = _dense_gauss_newton_step(key, stitched, x, damping=0.1)
    with torch.no_grad():
        before = float(((stitched(x) - checkpoint(x)) ** 2).sum())
    gauss_newton_key(key, stitched, x, iterations=1, damping=0.1, max_tries=1, chunk_size=chunk_size)
    got = torch.cat([p.flatten() for p in key.parameters()]).double()
    with torch.no_grad():
        after = float(((stitched(x) - checkpoint(x)) ** 2).sum())
    assert after < before  # the step was accepted ...
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)  # ... and is the dense one


@pytest.mark.parametrize("kind", ["flat", "conv", "conv3", "strided"])
@pytest.mark.parametrize("family", ["channel", "cross_channel", "procrustes"])
@pytest.mark.parametrize("chunk_size", [1, 256])
def test_gauss_newton_conjugate_gradient_step_matches_the_dense_solve(kind, family, chunk_size, monkeypatch):
    """The matrix-free solver (CG on the damped system, ``J v`` and ``Jᵀ w`` from the kept logit
    gradients or rows) gives the dense step in both forms; ``auto`` takes it above its cost bound."""
    from avalanche_plugins.transport import refine

    checkpoint, updated, x, stage = _tiny_pair(kind)
    keys = []
    for solver in ("cg", "auto"):
        monkeypatch.setattr(refine, "_DIRECT_MULTIPLY_ADDS", 0.0)  # auto: CG for any size
        key = fit_transport_key(stage_activations(updated, stage, x), stage_activations(checkpoint, stage, x),
                                family, ridge=1e-3)
        stitched = stitch(updated, checkpoint, stage, key)
        expected = _dense_gauss_newton_step(key, stitched, x, damping=0.1)
        gauss_newton_key(key, stitched, x, iterations=1, damping=0.1, max_tries=1, chunk_size=chunk_size,
                         solver=solver, cg_tol=1e-12, cg_max_iter=10_000)
        keys.append(torch.cat([p.flatten() for p in key.parameters()]).double())
        torch.testing.assert_close(keys[-1], expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(keys[1], keys[0])


def test_gauss_newton_conjugate_gradient_stops_at_its_iteration_cap():
    # one CG iteration is a preconditioned steepest-descent step: a different, still accepted, key
    checkpoint, updated, x, stage = _tiny_pair("conv3")
    keys = []
    for max_iter in (1, 10_000):
        key = fit_transport_key(stage_activations(updated, stage, x), stage_activations(checkpoint, stage, x),
                                "cross_channel", ridge=1e-3)
        gauss_newton_key(key, stitch(updated, checkpoint, stage, key), x, iterations=1, solver="cg",
                         cg_tol=1e-12, cg_max_iter=max_iter)
        keys.append(torch.cat([p.flatten() for p in key.parameters()]))
    assert not torch.allclose(keys[0], keys[1], rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize(("kind", "family", "form"), [
    ("conv", "channel", "primal"), ("conv3", "cross_channel", "dual, J rows kept"),
    ("strided", "cross_channel", "dual, stage gradients kept")])
def test_gauss_newton_chunked_equals_unchunked(kind, family, form, monkeypatch):
    # two LM iterations with J's rows one at a time, a few at a time or all at once: the same key
    # (float64 sums in another order) in both forms and with either kind of kept rows; the dual
    # Gram matrix is built from blocks of about two rows
    from avalanche_plugins.transport import refine
    from avalanche_plugins.transport.refine import _KeptRows

    checkpoint, updated, x, stage = _tiny_pair(kind)
    n_params = sum(
        p.numel() for p in fit_transport_key(stage_activations(updated, stage, x), stage_activations(updated, stage, x),
                                             family).parameters())
    h_size = stage_activations(updated, stage, x)[0].numel()
    rows = x.shape[0] * 3
    assert form == ("primal" if n_params <= rows else "dual, J rows kept" if n_params <= h_size
                    else "dual, stage gradients kept")
    keys = []
    for chunk_size, row_bytes in ((1, None), (3, None), (1000, None), (1000, 16 * n_params)):
        monkeypatch.undo()
        if chunk_size == 1:
            monkeypatch.setattr(_KeptRows, "block_bytes", 16 * n_params)
        if row_bytes is not None:  # long rows: two rows per pass whatever chunk_size says
            monkeypatch.setattr(refine, "_ROW_BYTES", row_bytes)
        key = fit_transport_key(stage_activations(updated, stage, x), stage_activations(checkpoint, stage, x),
                                family, ridge=1e-3)
        start = torch.cat([p.detach().flatten() for p in key.parameters()])
        gauss_newton_key(key, stitch(updated, checkpoint, stage, key), x, iterations=2, chunk_size=chunk_size)
        keys.append(torch.cat([p.detach().flatten() for p in key.parameters()]))
    # Not bit-equal: J's rows come from float32 jvp/vjp passes whose batched kernels sum in an order
    # that depends on the chunk (and on the CPU's vector width), the solve is float64, the key is
    # rounded back to float32. So the keys agree to a few float32 roundings of the LM step plus one
    # rounding of the key: measured <= 4.5 eps32 (||step|| + ||key||) under the AVX-512, AVX2 and
    # default kernels; 32 eps32 leaves room for the (small) conditioning of the damped solve. A
    # chunking bug (a row lost or counted twice) moves the step by a fraction of itself, ~1e5 x more.
    scale = float((keys[0] - start).norm() + keys[0].norm())
    eps = torch.finfo(torch.float32).eps
    for other in keys[1:]:
        assert float((other - keys[0]).norm()) <= 32 * eps * scale


@pytest.mark.parametrize("family", ["channel", "cross_channel", "procrustes"])
@pytest.mark.parametrize("shape", [(5, 4), (5, 3, 4), (5, 4, 3, 2)])
def test_closed_form_key_rows_equal_autograd(family, shape):
    # the rows ∇_θ ⟨g, key_θ(u)⟩ that Gauss–Newton builds in closed form, against autograd per row
    from avalanche_plugins.transport.refine import _linear_key_rows

    torch.manual_seed(0)
    u = torch.randn(*shape, dtype=torch.float64)
    key = fit_transport_key(u, u + 0.1 * torch.randn_like(u), family).double()
    names = [n for n, _ in key.named_parameters()]
    g = torch.randn(3, *key(u).shape, dtype=torch.float64)  # (logits, anchors, *h)
    rows = _linear_key_rows(key, names, u, g)
    for n in range(shape[0]):
        for k in range(3):
            params = tuple(p.detach().requires_grad_(True) for p in key.parameters())
            out = torch.func.functional_call(key, dict(zip(names, params)), (u[n:n + 1],))
            expected = torch.autograd.grad((out * g[k, n:n + 1]).sum(), params)
            for got, want in zip(rows, expected):
                torch.testing.assert_close(got[n, k], want.flatten(), rtol=1e-12, atol=1e-12)


def test_gauss_newton_solves_a_linear_late_part_in_one_step():
    """When the late part is one linear layer the logits are linear in the key, so one step with
    tiny damping reaches the least-squares optimum of the logit mismatch. The head (4 x 6) has full
    row rank, so the optimum is the projection of the target logits onto span[u, 1] (numpy lstsq)."""
    torch.manual_seed(0)
    checkpoint = nn.Sequential(nn.Linear(10, 6), nn.ReLU(), nn.Linear(6, 4)).eval()
    updated = nn.Sequential(nn.Linear(10, 6), nn.ReLU(), nn.Linear(6, 4)).eval()
    x = torch.randn(40, 10)
    u = stage_activations(updated, "1", x).detach()
    key = fit_transport_key(u, stage_activations(checkpoint, "1", x), "cross_channel")
    stitched = stitch(updated, checkpoint, "1", key)
    gauss_newton_key(key, stitched, x, iterations=1, damping=1e-9)
    design = np.hstack([u.double().numpy(), np.ones((len(u), 1))])
    target = checkpoint(x).detach().double().numpy()
    best = design @ np.linalg.lstsq(design, target, rcond=None)[0]
    with torch.no_grad():
        got = stitched(x).double().numpy()
    assert np.abs(got - best).max() < 1e-4
    assert np.abs(got - target).max() > 1e-2  # the optimum is not exact: the test is not vacuous


def test_gauss_newton_rejects_bad_arguments(trained_cnn, digits):
    x, _ = digits
    key = fit_transport_key(stage_activations(trained_cnn, STAGE, x[:20]), stage_activations(trained_cnn, STAGE, x[:20]))
    stitched = stitch(trained_cnn, trained_cnn, STAGE, key)
    with pytest.raises(ValueError, match="damping"):
        gauss_newton_key(key, stitched, x[:20], damping=0.0)
    with pytest.raises(ValueError, match="iterations"):
        gauss_newton_key(key, stitched, x[:20], iterations=-1)


@pytest.mark.parametrize("shape, layout_dim", [((30, 5), 1), ((6, 7, 5), 2), ((4, 5, 3, 3), 1)])
def test_every_layout_recovers_a_channel_affine_map(shape, layout_dim):
    torch.manual_seed(0)
    v = torch.randn(shape)
    c = shape[layout_dim]
    view = [1] * len(shape)
    view[layout_dim] = c
    scale, shift = torch.linspace(0.5, 2.0, c).reshape(view), torch.linspace(-1, 1, c).reshape(view)
    u = v * scale + shift
    for family in ("channel", "cross_channel"):
        key = fit_transport_key(u, v, family, ridge=0.0)
        torch.testing.assert_close(key(u), v, atol=1e-5, rtol=1e-5)
    mix = torch.randn(c, c) + 3 * torch.eye(c)
    u_mixed = torch.movedim(torch.movedim(v, layout_dim, -1) @ mix.T, -1, layout_dim)
    key = fit_transport_key(u_mixed, v, "cross_channel", ridge=0.0)
    torch.testing.assert_close(key(u_mixed), v, atol=1e-4, rtol=1e-4)


def test_cross_channel_fit_matches_numpy_least_squares():
    rng = np.random.default_rng(0)
    u = rng.normal(size=(50, 4))
    v = rng.normal(size=(50, 6))
    key = fit_transport_key(torch.tensor(u), torch.tensor(v), "cross_channel", ridge=0.0)
    design = np.hstack([u, np.ones((50, 1))])
    coef, *_ = np.linalg.lstsq(design, v, rcond=None)
    np.testing.assert_allclose(key.weight.numpy(), coef[:4].T, atol=1e-10)
    np.testing.assert_allclose(key.bias.numpy(), coef[4], atol=1e-10)
    resid = ((v - design @ coef) ** 2).sum() / ((v - v.mean(0)) ** 2).sum()
    assert key.residual == pytest.approx(resid, rel=1e-9)
    # channel key: per-channel simple regression
    key = fit_transport_key(torch.tensor(u), torch.tensor(v[:, :4]), "channel", ridge=0.0)
    for c in range(4):
        slope, intercept = np.polyfit(u[:, c], v[:, c], 1)
        assert key.scale[c].item() == pytest.approx(slope, rel=1e-9)
        assert key.bias[c].item() == pytest.approx(intercept, rel=1e-9, abs=1e-12)


def test_procrustes_recovers_a_rotation_and_dead_channels_are_guarded():
    torch.manual_seed(0)
    v = torch.randn(40, 5, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(5, 5, dtype=torch.float64))
    key = fit_transport_key(v @ q.T, v, "procrustes", ridge=0.0)
    torch.testing.assert_close(key(v @ q.T), v)
    u = v.clone()
    u[:, 2] = 3.0  # a dead channel: zero variance
    key = fit_transport_key(u, v, "channel", ridge=0.0)
    assert key.scale[2] == 0 and torch.isfinite(key.bias).all()


def test_key_state_dict_round_trip(tmp_path):
    u, v = torch.randn(20, 3, 4, 4), torch.randn(20, 3, 4, 4)
    key = fit_transport_key(u, v, "cross_channel")
    torch.save(key.state_dict(), tmp_path / "key.pt")
    loaded = TransportKey.from_state_dict(torch.load(tmp_path / "key.pt"))
    assert loaded.family == "cross_channel" and loaded.layout == "channels_first"
    assert loaded.residual == key.residual
    torch.testing.assert_close(loaded(u), key(u))
    with pytest.raises(ValueError, match="family"):
        TransportKey("channel", 3).load_state_dict(key.state_dict(), strict=False)


def test_anchors_are_class_balanced_and_seeded(digits):
    x, y = digits
    xa, ya = class_balanced_anchors((x, y), 50, seed=3)
    assert torch.bincount(ya).tolist() == [5] * 10
    xb, _ = class_balanced_anchors(torch.utils.data.TensorDataset(x, y), 50, seed=3)
    assert torch.equal(xa, xb)
    assert not torch.equal(xa, class_balanced_anchors((x, y), 50, seed=4)[0])
    with pytest.raises(ValueError, match="smaller than the number of classes"):
        class_balanced_anchors((x, y), 5)
    with pytest.raises(ValueError, match="class 1 has 1 samples"):
        class_balanced_anchors((x[:12], torch.tensor([0] * 11 + [1])), 4)


def test_recovery_formula_and_undefined_case():
    assert recovery(0.8, 0.5, 0.9).value == pytest.approx(0.75)
    assert recovery(0.4, 0.5, 0.9).value < 0
    undefined = recovery(0.8, 0.9, 0.9)
    assert math.isnan(undefined.value) and "nothing was forgotten" in undefined.reason
    with pytest.raises(ValueError, match="acc_key"):
        recovery(float("nan"), 0.5, 0.9)


def test_bad_input_gives_clear_errors(trained_cnn, digits):
    x, _ = digits
    with pytest.raises(ValueError, match="stage='nope' names no submodule"):
        stage_activations(trained_cnn, "nope", x[:4])
    with pytest.raises(ValueError, match="must pair the same anchors"):
        fit_transport_key(torch.randn(10, 3, 4, 4), torch.randn(10, 3, 2, 2))
    with pytest.raises(ValueError, match="must pair the same anchors"):
        fit_transport_key(torch.randn(10, 3), torch.randn(9, 3))
    with pytest.raises(ValueError, match="more samples than channels"):
        fit_transport_key(torch.randn(4, 8), torch.randn(4, 8), "cross_channel", ridge=0.0)
    fit_transport_key(torch.randn(4, 8), torch.randn(4, 8), "cross_channel", ridge=1e-2)  # fine with ridge
    with pytest.raises(ValueError, match="family must be one of"):
        fit_transport_key(torch.randn(10, 3), torch.randn(10, 3), "affine")
    with pytest.raises(ValueError, match="use family='cross_channel'"):
        fit_transport_key(torch.randn(10, 3), torch.randn(10, 4), "channel")
    with pytest.raises(ValueError, match="u is empty"):
        fit_transport_key(torch.randn(0, 3), torch.randn(0, 3))
    with pytest.raises(ValueError, match="ridge must be"):
        fit_transport_key(torch.randn(10, 3), torch.randn(10, 3), ridge=-1.0)
    with pytest.raises(ValueError, match="labels"):
        correspondence_break(torch.randn(10, 3), torch.randn(10, 3), mode="within_class")
    with pytest.raises(ValueError, match="stage='x'"):
        stitch(trained_cnn, trained_cnn, "x", TransportKey("identity", 8))


def test_chain_fast_path_equals_the_hook_path(trained_cnn, digits):
    x, y = digits
    updated = drifted(trained_cnn, *channel_mixing())
    u, v = stage_activations(updated, STAGE, x[:100]), stage_activations(trained_cnn, STAGE, x[:100])
    fast = stitch(updated, trained_cnn, STAGE, fit_transport_key(u, v, "cross_channel"))
    with torch.no_grad():
        out_fast = fast(x[1500:])
    assert fast._late_part is not None  # the Sequential was cut: only the late part runs
    slow = stitch(updated, trained_cnn, STAGE, fast.key)
    slow._chain_checked = True  # force the hook path
    with torch.no_grad():
        torch.testing.assert_close(slow(x[1500:]), out_fast)


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
