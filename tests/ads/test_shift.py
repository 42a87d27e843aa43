"""ADS core: the per-layer JVP decomposition against real optimizer steps and the kernel formula,
width scaling, the path factor, topology-only variant, ECE, direction consistency, bad input."""

import contextlib
import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, jvp

from avalanche_plugins.ads import (
    UNASSIGNED,
    architecture_driven_shift,
    layer_groups,
    layer_logit_changes,
    logit_shift,
    topology_only_shift,
    update_direction,
)
from avalanche_plugins.core.layers import discover_layers
from avalanche_plugins.core.stats import direction_consistency, expected_calibration_error
from avalanche_plugins.study.catalog.zoo import TinyViT
from tests.cases import small_mlp


def mlp_problem(seed=0, dtype=torch.float64):
    net = small_mlp(seed).to(dtype)
    g = torch.Generator().manual_seed(seed + 100)
    old = torch.randn(40, 6, generator=g, dtype=dtype)
    new = torch.randn(32, 6, generator=g, dtype=dtype) + 0.5
    y = torch.randint(0, 3, (32,), generator=g)
    return net, old, new, y


def one_real_step(net, new, y, lr, optimizer="sgd"):
    after = copy.deepcopy(net)
    opt = torch.optim.SGD(after.parameters(), lr=lr) if optimizer == "sgd" else \
        torch.optim.Adam(after.parameters(), lr=lr)
    opt.zero_grad()
    nn.CrossEntropyLoss()(after(new), y).backward()
    opt.step()
    return after


def test_layer_jvps_sum_to_first_order_change_and_match_one_sgd_step():
    net, old, new, y = mlp_problem()
    lr = 1e-4
    groups = layer_groups(net, discover_layers(net, old[:2]))
    assert [g.name for g in groups] == ["0", "2", "4"] and [g.fan_in for g in groups] == [6, 10, 8]
    direction, _, _ = update_direction(net, nn.CrossEntropyLoss(), new, y)
    changes = layer_logit_changes(net, old, direction, groups, chunk_size=16)
    total = sum(changes.values())

    params = {n: p.detach() for n, p in net.named_parameters()}
    _, full = jvp(lambda p: functional_call(net, p, (old,)), (params,), (direction,))
    torch.testing.assert_close(total, full, rtol=1e-10, atol=1e-12)

    after = one_real_step(net, new, y, lr)
    with torch.no_grad():
        actual = after(old) - net(old)
    rel = (lr * total - actual).norm() / actual.norm()
    assert rel < 1e-3, rel
    # the scalar summaries agree with the real step too
    res = architecture_driven_shift(net, nn.CrossEntropyLoss(), old, new, y, lr=lr, steps=1)
    assert lr * res.first_order_shift == pytest.approx(logit_shift(net, after, old), rel=1e-3)
    assert res.ads == pytest.approx(lr * sum(res.layer_shifts), rel=1e-12)
    assert res.ads >= lr * res.first_order_shift  # triangle inequality
    for g, d in zip(groups, res.data_terms):
        assert d == pytest.approx(changes[g.name].norm(dim=1).mean().item() / g.fan_in, rel=1e-10)


def test_last_layer_change_equals_kernel_formula():
    """Δz_L(x_a) = −η n_{L−1} (1/m) Σ_b k̂(x_a, x_b) r_b with k̂ = (h_aᵀh_b + 1)/n (bias adds the 1)."""
    net, old, new, y = mlp_problem(seed=1)
    groups = layer_groups(net, discover_layers(net, old[:2]))
    direction, _, _ = update_direction(net, nn.CrossEntropyLoss(), new, y)
    delta = layer_logit_changes(net, old, direction, groups)["4"]
    with torch.no_grad():
        h_old, h_new = net[:4](old), net[:4](new)
        residual = torch.softmax(net(new), dim=1) - nn.functional.one_hot(y, 3).to(h_new.dtype)
        n = h_old.shape[1]
        kernel = (h_old @ h_new.T + 1.0) / n
        expected = -n * kernel @ residual / new.shape[0]
    torch.testing.assert_close(delta, expected, rtol=1e-9, atol=1e-12)


def test_adam_direction_is_the_first_adam_step():
    net, old, new, y = mlp_problem(seed=2)
    lr = 1e-3
    direction, _, _ = update_direction(net, nn.CrossEntropyLoss(), new, y, optimizer="adam")
    after = one_real_step(net, new, y, lr, optimizer="adam")
    for (name, p), q in zip(net.named_parameters(), after.parameters()):
        torch.testing.assert_close(q.detach() - p.detach(), lr * direction[name], rtol=1e-6, atol=1e-12)
    res = architecture_driven_shift(net, nn.CrossEntropyLoss(), old, new, y, lr=lr, steps=1, optimizer="adam")
    assert lr * res.first_order_shift == pytest.approx(logit_shift(net, after, old), rel=2e-2)


def test_width_scaling_at_initialisation():
    """Doubling hidden widths doubles the architecture term of layers with a hidden fan-in; the
    data term stays in a band (loose: fixed seeds, mean over 3 initialisations, ratio in [0.6, 1.6];
    single initialisations fluctuate by ~±40 % at these widths)."""
    g = torch.Generator().manual_seed(0)
    old, new = torch.randn(128, 20, generator=g), torch.randn(128, 20, generator=g)
    y = (new @ torch.randn(20, 5, generator=g)).argmax(1)  # a learnable teacher task
    results = {}
    for width in (256, 512):
        runs = []
        for seed in range(3):
            torch.manual_seed(seed)
            net = nn.Sequential(nn.Linear(20, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                nn.Linear(width, 5))
            runs.append(architecture_driven_shift(net, nn.CrossEntropyLoss(), old, new, y, lr=0.01, steps=10))
        results[width] = runs
    assert results[256][0].architecture_terms == [20, 256, 256]
    assert results[512][0].architecture_terms == [20, 512, 512]

    def mean(width, attribute):
        return torch.tensor([getattr(r, attribute) for r in results[width]]).mean(0)

    data_ratio = mean(512, "data_terms") / mean(256, "data_terms")
    assert all(0.6 < r < 1.6 for r in data_ratio[1:].tolist()), data_ratio
    shift_ratio = mean(512, "layer_shifts") / mean(256, "layer_shifts")
    assert all(1.2 < r < 3.2 for r in shift_ratio[1:].tolist()), shift_ratio


def test_probe_path_fits_the_exact_geometric_decay():
    """Linear least squares with XᵀX/m = I/4: full-batch GD gradients shrink by ρ = 1 − η/2 per step."""
    net = nn.Sequential(nn.Linear(4, 1, bias=False))
    x = torch.eye(4).repeat(3, 1)
    y = torch.randn(12, 1, generator=torch.Generator().manual_seed(0))
    lr, steps = 0.2, 30
    res = architecture_driven_shift(net, nn.MSELoss(), x, x, y, lr=lr, steps=steps, path="probe", probe_steps=6)
    assert res.decay == pytest.approx(0.9, rel=1e-5)
    assert res.path_factor == pytest.approx(lr * (1 - 0.9 ** steps) / 0.1, rel=1e-4)
    budget = architecture_driven_shift(net, nn.MSELoss(), x, x, y, lr=lr, steps=steps)
    assert budget.path_factor == pytest.approx(lr * steps) and budget.decay is None
    assert res.ads == pytest.approx(budget.ads * res.path_factor / budget.path_factor, rel=1e-9)


@pytest.mark.parametrize("path", ["loss", "logit"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_loss_and_logit_paths_are_the_loss_to_go_over_a_first_order_speed_capped_by_the_budget(path, optimizer):
    """P = min(ηT, (L − L*) / speed): speed = −⟨∇L, u⟩ (loss path) from plain autograd, or
    mean_b ‖J(x_b) u‖ (logit path) from a dense jacrev on the new inputs."""
    net, old, new, y = mlp_problem(seed=3 if path == "loss" else 4)
    params = {n: p.detach() for n, p in net.named_parameters()}
    loss = nn.CrossEntropyLoss()(net(new), y)
    grads = dict(zip(params, torch.autograd.grad(loss, list(net.parameters()))))
    eps = 1e-8
    u = {n: -g if optimizer == "sgd" else -g / (g.abs() + eps) for n, g in grads.items()}
    if path == "loss":
        speed = sum(float((-grads[n] * u[n]).sum()) for n in params)
    else:
        jac = torch.func.jacrev(lambda p: functional_call(net, p, (new,)))(params)  # (m, C, *param)
        speed = float(torch.stack([sum(jac[n][b].reshape(jac[n].shape[1], -1) @ u[n].reshape(-1) for n in params)
                                   for b in range(new.shape[0])]).norm(dim=1).mean())
    lr = 1e-3

    def run(steps, **kwargs):
        return architecture_driven_shift(net, nn.CrossEntropyLoss(), old, new, y, lr=lr, steps=steps,
                                         optimizer=optimizer, eps=eps, **kwargs)

    long = run(10**6, path=path)
    assert long.path_factor == pytest.approx(float(loss) / speed, rel=1e-5)
    measured = long.descent_rate if path == "loss" else long.new_first_order_shift
    assert measured == pytest.approx(speed, rel=1e-5)
    budget = run(10**6)
    assert budget.new_first_order_shift is None
    assert long.ads == pytest.approx(budget.ads * long.path_factor / budget.path_factor, rel=1e-9)
    assert run(1, path=path).path_factor == pytest.approx(lr)  # the budget ends before the loss is fitted
    half = run(10**6, path=path, target_loss=float(loss) / 2)
    assert half.path_factor == pytest.approx(long.path_factor / 2, rel=1e-5)
    fitted = run(10, path=path, target_loss=float(loss) + 1)
    assert fitted.path_factor == 0.0 and fitted.ads == 0.0


def math_attention():
    """Scaled-dot-product attention's fused CPU kernels (torch >= 2.3) have no forward-mode
    derivative; the math backend has one."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return contextlib.nullcontext()
    return sdpa_kernel(SDPBackend.MATH)


def test_stacked_group_jvps_equal_one_plain_jvp_per_group():
    """All groups in one vmapped call (chunk_size=None), runs of 4 on input chunks of 10 and 2
    (chunk_size=40), of 4 on single inputs (chunk_size=5) and of 3 on single inputs (chunk_size=3)
    all equal a plain jvp per group."""
    torch.manual_seed(0)
    net = TinyViT(image_size=8, patch=4, n_classes=4, dim=16, depth=2, heads=2).double()
    x, y = torch.randn(12, 1, 8, 8, dtype=torch.float64), torch.randint(0, 4, (12,))
    groups = layer_groups(net, discover_layers(net, x[:2]))
    direction, _, _ = update_direction(net, nn.CrossEntropyLoss(), x, y)
    params = {n: p.detach() for n, p in net.named_parameters()}
    variants = [layer_logit_changes(net, x, direction, groups, chunk_size=c) for c in (None, 40, 5, 3)]
    assert len(groups) > 3
    for g in groups:
        tangent = {n: direction[n] if n in g.params else torch.zeros_like(p) for n, p in params.items()}
        with math_attention():
            _, plain = jvp(lambda p: functional_call(net, p, (x,)), (params,), (tangent,))
        for changes in variants:
            torch.testing.assert_close(changes[g.name], plain, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("path", ["logit", "probe"])
def test_ads_does_not_depend_on_chunk_size(path):
    # the new-task gradients over chunks (sample-weighted) and the JVPs in any grouping give the
    # values of one pass over everything
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    old, new = torch.randn(11, 5, dtype=torch.float64), torch.randn(13, 5, dtype=torch.float64)
    y = torch.randint(0, 3, (13,))
    results = [architecture_driven_shift(net, nn.CrossEntropyLoss(), old, new, y, lr=0.01, steps=50, path=path,
                                         chunk_size=c) for c in (None, 1, 4, 64)]
    for res in results[1:]:
        assert res.ads == pytest.approx(results[0].ads, rel=1e-12)
        assert res.new_loss == pytest.approx(results[0].new_loss, rel=1e-12)
        assert res.data_terms == pytest.approx(results[0].data_terms, rel=1e-12)
        assert res.path_factor == pytest.approx(results[0].path_factor, rel=1e-12)


def test_transformer_groups_cover_every_parameter_and_topology_only_variant():
    torch.manual_seed(0)
    vit = TinyViT(image_size=8, patch=4, n_classes=4, dim=16, depth=1, heads=2)
    x = torch.randn(12, 1, 8, 8)
    y = torch.randint(0, 4, (12,))
    res = architecture_driven_shift(vit, nn.CrossEntropyLoss(), x, x, y, lr=0.01, steps=5)
    groups = layer_groups(vit, discover_layers(vit, x[:2]))
    covered = [p for g in groups for p in g.params]
    assert sorted(covered) == sorted(n for n, _ in vit.named_parameters())
    assert res.layer_names[-1] == UNASSIGNED and res.architecture_terms[0] == 16  # patch conv 1×4×4
    assert res.ads > 0

    wider = TinyViT(image_size=8, patch=4, n_classes=4, dim=32, depth=1, heads=2)
    topo = topology_only_shift(wider, x[:2], res)
    fan_ins = [g.fan_in for g in layer_groups(wider, discover_layers(wider, x[:2]))]
    assert topo == pytest.approx(res.path_factor * sum(n * d for n, d in zip(fan_ins, res.data_terms)))
    deeper = TinyViT(image_size=8, patch=4, n_classes=4, dim=16, depth=2, heads=2)
    with pytest.raises(ValueError, match="same design"):
        topology_only_shift(deeper, x[:2], res)


def test_model_is_not_changed_and_no_grad_written():
    net, old, new, y = mlp_problem(seed=3, dtype=torch.float32)
    net.train()
    state = copy.deepcopy(net.state_dict())
    rng = torch.get_rng_state()
    architecture_driven_shift(net, nn.CrossEntropyLoss(), old, new, y, lr=0.1, steps=3, path="probe")
    assert all(torch.equal(v, state[k]) for k, v in net.state_dict().items())
    assert all(p.grad is None for p in net.parameters()) and net.training
    assert torch.equal(rng, torch.get_rng_state())


def test_expected_calibration_error_by_hand():
    # confidences 0.95 (right), 0.85 (wrong), 0.55 (right), 0.58 (wrong), 0.45 (right) on 3 classes
    probs = torch.tensor([[0.95, 0.03, 0.02], [0.85, 0.10, 0.05], [0.55, 0.30, 0.15],
                          [0.16, 0.58, 0.26], [0.45, 0.35, 0.20]], dtype=torch.float64)
    targets = torch.tensor([0, 1, 0, 2, 0])
    # 15 bins of width 1/15: 0.95 -> bin 15, 0.85 -> bin 13, 0.55 and 0.58 -> bin 9 (8/15, 9/15], 0.45 -> bin 7
    by_hand = (abs(1 - 0.95) + abs(0 - 0.85) + 2 * abs(0.5 - (0.55 + 0.58) / 2) + abs(1 - 0.45)) / 5
    assert expected_calibration_error(probs.log(), targets) == pytest.approx(by_hand, rel=1e-9)
    # one bin: |accuracy − mean confidence|
    assert expected_calibration_error(probs.log(), targets, n_bins=1) == pytest.approx(
        abs(3 / 5 - (0.95 + 0.85 + 0.55 + 0.58 + 0.45) / 5), rel=1e-9)
    perfect = torch.tensor([[10.0, -10.0], [-10.0, 10.0]])
    assert expected_calibration_error(perfect, torch.tensor([0, 1])) < 1e-8


def test_direction_consistency_handmade_pairs():
    ads = {"a": 1.0, "b": 2.0, "c": 2.0, "d": 0.5}
    shift = {"a": 0.3, "b": 0.6, "c": 0.1, "d": 0.3}
    # (a,b) same direction: 1; (b,c) ADS tie, shifts differ: ½; (c,d) ADS down, shift up: 0;
    # (a,d) shift tie: skipped
    assert direction_consistency([("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")], ads, shift) == 0.5
    assert direction_consistency([(0, 1)], [2.0, 1.0], [5.0, 4.0]) == 1.0
    with pytest.raises(ValueError, match="equal true shifts"):
        direction_consistency([("a", "d")], ads, shift)
    with pytest.raises(ValueError, match="missing"):
        direction_consistency([("a", "z")], ads, shift)


def test_logit_shift_by_hand():
    before = nn.Linear(3, 2)
    after = copy.deepcopy(before)
    with torch.no_grad():
        after.weight[0, 0] += 1.0  # z_0 changes by x_0
    x = torch.tensor([[3.0, 0.0, 0.0], [-4.0, 1.0, 1.0]])
    assert logit_shift(before, after, x) == pytest.approx(3.5)
    with pytest.raises(ValueError, match="shape"):
        logit_shift(before, nn.Linear(3, 4), x)


@pytest.mark.parametrize("case, match", [
    ("empty_old", "old_inputs is empty"),
    ("empty_new", "new_inputs is empty"),
    ("target_too_large", r"class indices in \[0, 3\)"),
    ("negative_target", r"class indices in \[0, 3\)"),
    ("mismatched_targets", "targets has"),
    ("no_layers", "no parametrised layer"),
    ("frozen", "no trainable parameters"),
    ("lr", "lr"),
    ("steps", "steps"),
    ("optimizer", "optimizer"),
    ("path", "path"),
    ("probe_steps", "probe_steps"),
])
def test_bad_input(case, match):
    net, old, new, y = mlp_problem(dtype=torch.float32)
    kwargs = {"lr": 0.1, "steps": 2}
    if case == "empty_old":
        old = old[:0]
    elif case == "empty_new":
        new, y = new[:0], y[:0]
    elif case == "target_too_large":
        y = y.clone()
        y[3] = 3
    elif case == "negative_target":
        y = y.clone()
        y[0] = -1
    elif case == "mismatched_targets":
        y = y[:-1]
    elif case == "no_layers":
        net = nn.Sequential(nn.Flatten(), nn.ReLU())
    elif case == "frozen":
        net.requires_grad_(False)
    elif case == "lr":
        kwargs["lr"] = 0.0
    elif case == "steps":
        kwargs["steps"] = 0
    elif case == "optimizer":
        kwargs["optimizer"] = "rmsprop"
    elif case == "path":
        kwargs["path"] = "exact"
    elif case == "probe_steps":
        kwargs["probe_steps"] = 1
    with pytest.raises(ValueError, match=match):
        architecture_driven_shift(net, nn.CrossEntropyLoss(), old, new, y, **kwargs)


def test_bad_input_of_the_evaluation_functions():
    logits, targets = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    with pytest.raises(ValueError, match="n_bins"):
        expected_calibration_error(logits, targets, n_bins=0)
    with pytest.raises(ValueError, match="logits is empty"):
        expected_calibration_error(logits[:0], targets[:0])
    with pytest.raises(ValueError, match=r"class indices in \[0, 3\)"):
        expected_calibration_error(logits, torch.tensor([0, 1, 3, 0]))
    with pytest.raises(ValueError, match="pairs is empty"):
        direction_consistency([], [1.0], [1.0])
    with pytest.raises(ValueError, match="inputs is empty"):
        logit_shift(nn.Linear(2, 2), nn.Linear(2, 2), torch.zeros(0, 2))
