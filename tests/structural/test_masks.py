"""UnitMasks: exact masking under SGD/Adam, prune/rewind, grow selection, interventions, pickling."""

import copy
import pickle

import pytest
import torch
from torch import nn

from avalanche_plugins.core import consumers
from avalanche_plugins.core.calls import eval_mode
from avalanche_plugins.core.layers import discover_layers
from avalanche_plugins.structural import (
    Interventions,
    UnitMasks,
    highest_masked,
    lowest_active,
    remove_mask_hooks,
    unit_scores,
)
from tests.cases import small_bn_cnn, small_mlp

torch.set_num_threads(1)


def mlp_and_data(seed=0):
    model = small_mlp(seed)  # Linear(6,10) Tanh Linear(10,8) ReLU Linear(8,3)
    g = torch.Generator().manual_seed(seed)
    return model, torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g)


def cnn_and_data(seed=0):
    model = small_bn_cnn(seed)  # Conv BN ReLU Conv BN ReLU Flatten Linear
    g = torch.Generator().manual_seed(seed)
    return model, torch.randn(64, 1, 8, 8, generator=g), torch.randint(0, 3, (64,), generator=g)


MASKED_UNITS = {"mlp": {"0": [1, 4, 7], "2": [0, 5]}, "cnn": {"0": [1], "3": [2, 3]}}
HIDDEN_OUT = {"mlp": {"0": 2, "2": 4}, "cnn": {"0": 3, "3": 6}}  # module index after the activation
UNIT_TENSORS = {  # (module index, attribute, unit dim) frozen for layer's units; consumer columns below
    "mlp": {"0": [(0, "weight", 0), (0, "bias", 0), (2, "weight", 1)],
            "2": [(2, "weight", 0), (2, "bias", 0), (4, "weight", 1)]},
    "cnn": {"0": [(0, "weight", 0), (0, "bias", 0), (1, "weight", 0), (1, "bias", 0),
                  (1, "running_mean", 0), (1, "running_var", 0), (3, "weight", 1)],
            "3": [(3, "weight", 0), (3, "bias", 0), (4, "weight", 0), (4, "bias", 0),
                  (4, "running_mean", 0), (4, "running_var", 0)]},
}


def masked_entries(model, kind):
    """Independent list of the masked units' entries: (tensor, index tuple)."""
    out = []
    for layer, units in MASKED_UNITS[kind].items():
        for module_index, attr, dim in UNIT_TENSORS[kind][layer]:
            tensor = getattr(model[module_index], attr)
            for u in units:
                if kind == "cnn" and layer == "3" and dim == 1:
                    continue
                index = (u,) if dim == 0 else (slice(None), u)
                out.append((tensor, index))
        if kind == "cnn" and layer == "3":  # Flatten: channel u feeds columns 16u .. 16u+15 of the head
            for u in units:
                out.append((model[7].weight, (slice(None), slice(16 * u, 16 * u + 16))))
    return out


def make_masks(kind):
    model, x, y = mlp_and_data() if kind == "mlp" else cnn_and_data()
    masks = UnitMasks(model, x[:2])
    full = masks.sizes()
    masks.set_masks({name: torch.tensor([u not in MASKED_UNITS[kind][name] for u in range(n)])
                     for name, n in full.items()})
    return model, masks, x, y


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_masked_units_output_zero_and_stay_fixed_while_others_train(kind, optimizer):
    model, masks, x, y = make_masks(kind)
    assert masks.names == list(MASKED_UNITS[kind])
    entries = masked_entries(model, kind)
    before = [t[i].detach().clone() for t, i in entries]
    initial = copy.deepcopy(model.state_dict())
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-2)
    model.train()
    for _ in range(50):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        masks.step(opt)
    for (t, i), b in zip(entries, before):
        assert torch.equal(t[i], b)
    # unmasked units trained
    for layer, units in MASKED_UNITS[kind].items():
        keep = [u for u in range(masks.sizes()[layer]) if u not in units]
        name = f"{layer}.weight"
        assert not torch.equal(model.state_dict()[name][keep], initial[name][keep])
    # masked units output exactly zero, in train and eval mode
    for mode in (True, False):
        model.train(mode)
        for layer, units in MASKED_UNITS[kind].items():
            hidden = model[: HIDDEN_OUT[kind][layer]](x)
            assert torch.all(hidden[:, units] == 0)
            others = [u for u in range(hidden.shape[1]) if u not in units]
            assert hidden[:, others].abs().sum() > 0


def test_prune_removes_lowest_scoring_and_rewind_is_bit_exact():
    model, x, y = mlp_and_data()
    masks = UnitMasks(model, x[:2])
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    # weight-norm scores by hand: norms of the incoming rows of layer "0"
    norms = model[0].weight.detach().norm(dim=1)
    expected = sorted(torch.argsort(norms)[:4].tolist())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(5):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        masks.step(opt)
    scores = {"0": norms, "2": torch.arange(8.0)}
    removed = masks.prune(scores, {"0": 6, "2": 5})
    assert removed["0"].tolist() == expected
    assert removed["2"].tolist() == [0, 1, 2]
    assert masks.active_counts() == {"0": 6, "2": 5}
    masks.rewind(saved)
    assert masks.mask_keys() == ["0.unit_mask", "2.unit_mask"]
    for key, value in model.state_dict().items():
        if key not in masks.mask_keys():  # rewinding restores the weights, not the masks
            assert torch.equal(value, saved[key]), key
    assert masks.compactness() == pytest.approx(11 / 18)


def test_selection_functions_by_hand():
    scores = torch.tensor([0.3, 0.9, 0.1, 0.5, 0.7, 0.2])
    mask = torch.tensor([True, True, False, True, False, False])
    assert lowest_active(scores, mask, 2).tolist() == [0, 3]
    assert highest_masked(scores, mask, 2).tolist() == [4, 5]
    with pytest.raises(ValueError, match="only 3 are masked"):
        highest_masked(scores, mask, 4)


def tiny_net():
    net = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 2))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [1.0, 1.0]]))
        net[0].bias.copy_(torch.tensor([0.0, -0.5, 0.0, -1.0]))
        net[2].weight.copy_(torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 0.0, 2.0]]))
        net[2].bias.zero_()
    return net


X_TINY = torch.tensor([[1.0, 1.0], [2.0, 0.0], [-1.0, 2.0], [0.5, 0.5]])
Y_TINY = torch.tensor([0, 1, 1, 0])


def test_grow_activation_score_matches_hand_computation():
    net = tiny_net()
    masks = UnitMasks(net, X_TINY[:2])
    masks.set_masks({"0": torch.tensor([True, False, False, False])})
    # pre-activations z = x W^T + b, fraction with relu(z) > 0.2, by hand:
    # unit1: x2-0.5 = [0.5, -0.5, 1.5, 0.0] -> 2/4 ; unit2: -x1 = [-1, -2, 1, -0.5] -> 1/4
    # unit3: x1+x2-1 = [1, 1, 0, 0] -> 2/4  (unit0 active: x1 = [1, 2, -1, .5] -> 3/4)
    scores = unit_scores(masks, "activation", X_TINY, threshold=0.2)["0"]
    assert scores.tolist() == [0.75, 0.5, 0.25, 0.5]
    recruited = masks.grow({"0": scores}, {"0": 3})
    assert recruited["0"].tolist() == [1, 3]  # highest masked; tie 1 vs 3 both taken
    recruited = masks.grow(unit_scores(masks, "activation", X_TINY, threshold=0.2), {"0": 4})
    assert recruited["0"].tolist() == [2]


def test_grow_gradient_score_matches_hand_computation():
    net = tiny_net()
    masks = UnitMasks(net, X_TINY[:2])
    masks.set_masks({"0": torch.tensor([True, False, False, True])})
    scores = unit_scores(masks, "gradient", X_TINY, Y_TINY, loss_fn=nn.functional.cross_entropy)["0"]
    # by hand: the network with masked units' outgoing weights zero, delta = dL/dlogits,
    # score_u = || sum_n delta_n * relu(z_nu) || over the 2 outputs
    with torch.no_grad():
        a = torch.relu(X_TINY @ net[0].weight.T + net[0].bias)
        w_out = net[2].weight.clone()
        w_out[:, [1, 2]] = 0
        logits = (a * torch.tensor([1.0, 0.0, 0.0, 1.0])) @ w_out.T  # masked units' output is 0 anyway
        delta = (torch.softmax(logits, 1) - nn.functional.one_hot(Y_TINY, 2)) / len(Y_TINY)
        expected = (delta.T @ a).norm(dim=0)
    assert torch.allclose(scores, expected, atol=1e-6)
    assert highest_masked(scores, masks.masks["0"], 1).item() == (1 if expected[1] > expected[2] else 2)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_zero_outgoing_growth_preserves_the_function(kind):
    model, masks, x, y = make_masks(kind)
    model.eval()
    probe = torch.randn_like(x) * 3
    before = model(probe).clone()
    iv = Interventions(outgoing="zero", incoming="reinit")
    masks.grow({n: torch.rand(s) for n, s in masks.sizes().items()}, masks.sizes(), interventions=iv)
    assert masks.compactness() == 1.0
    assert torch.equal(model(probe), before)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    layer = MASKED_UNITS[kind]
    first = next(iter(layer))
    # the newborns are not dead: their outgoing weights receive gradient at once
    consumer = masks.layers[first].outgoing.tensor
    cols = masks.layers[first].outgoing.indices(torch.tensor(layer[first]))
    assert consumer.grad[:, cols].abs().sum() > 0


def test_fresh_adam_gives_newborns_their_own_step_count():
    model, x, y = mlp_and_data()
    masks = UnitMasks(model, x[:2])
    masks.set_masks({"0": torch.arange(10) < 5})
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(30):  # a mature optimizer: step 30 for every tensor
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        masks.step(opt)
    masks.grow({"0": torch.arange(10.0)}, {"0": 7}, interventions=Interventions(optimizer_state="fresh"),
               optimizer=opt)
    newborn = masks.newborn()["0"].nonzero().reshape(-1)
    assert newborn.tolist() == [8, 9]
    # reference: a fresh Adam on a copy of the newborn rows, fed the same gradients
    row = model[0].weight.detach()[newborn].clone().requires_grad_(True)
    reference = torch.optim.Adam([row], lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        row.grad = model[0].weight.grad[newborn].clone()
        reference.step()
        masks.step(opt)
        assert torch.allclose(model[0].weight.detach()[newborn], row.detach(), atol=1e-6, rtol=1e-5)


def _group_settings(optimizer):
    """Every setting of every parameter group, the parameters by identity and order."""
    return [{k: ([id(p) for p in v] if k == "params" else copy.deepcopy(v)) for k, v in g.items()}
            for g in optimizer.param_groups]


@pytest.mark.parametrize("policy", ["keep", "zero", "fresh"])
@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_optimizer_state_policies_use_each_groups_settings_and_leave_the_groups_alone(kind, policy):
    """Layer "0" (the newborns' incoming rows) sits in the optimizer's *second* group, with its own
    lr / weight decay / momentum or betas; the newborns' outgoing columns (layer "2"'s weight) in
    the first. A fresh optimizer for each, built with that group's settings and fed the same
    gradients, is the reference for ``fresh`` (and for ``zero`` under SGD, where they agree)."""
    model, x, y = mlp_and_data()
    masks = UnitMasks(model, x[:2])
    masks.set_masks({"0": torch.arange(10) < 5})
    first = [model[2].weight, model[2].bias, model[4].weight, model[4].bias]
    if kind == "sgd":
        settings = ({"lr": 0.01, "momentum": 0.9, "weight_decay": 1e-3}, {"lr": 0.03, "momentum": 0.5, "weight_decay": 0.1})
        make = torch.optim.SGD
    else:
        settings = ({"lr": 1e-3, "betas": (0.9, 0.999), "weight_decay": 0.01},
                    {"lr": 0.03, "betas": (0.8, 0.95), "weight_decay": 0.1})
        make = torch.optim.AdamW
    opt = make([{"params": first, **settings[0]}, {"params": [model[0].weight, model[0].bias], **settings[1]}])
    for _ in range(20):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        masks.step(opt)
    groups = _group_settings(opt)
    kept = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in model.parameters()}
    masks.grow({"0": torch.arange(10.0)}, {"0": 7}, interventions=Interventions(optimizer_state=policy), optimizer=opt)
    newborn = [8, 9]
    assert masks.newborn()["0"].nonzero().reshape(-1).tolist() == newborn
    assert _group_settings(opt) == groups
    for name in ("momentum_buffer", "exp_avg", "exp_avg_sq"):
        for tensor, index in ((model[0].weight, (newborn,)), (model[2].weight, (slice(None), newborn))):
            if name not in opt.state[tensor]:
                continue
            if policy == "keep":
                assert torch.equal(opt.state[tensor][name], kept[id(tensor)][name])
            else:
                assert bool((opt.state[tensor][name][index] == 0).all()), (name, policy)
    rows = model[0].weight.detach()[newborn].clone().requires_grad_(True)
    cols = model[2].weight.detach()[:, newborn].clone().requires_grad_(True)
    references = [make([rows], **settings[1]), make([cols], **settings[0])]
    for _ in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        rows.grad, cols.grad = model[0].weight.grad[newborn].clone(), model[2].weight.grad[:, newborn].clone()
        for reference in references:
            reference.step()
        masks.step(opt)
        if policy == "fresh" or (policy == "zero" and kind == "sgd"):
            assert torch.allclose(model[0].weight.detach()[newborn], rows.detach(), atol=1e-6, rtol=1e-5)
            assert torch.allclose(model[2].weight.detach()[:, newborn], cols.detach(), atol=1e-6, rtol=1e-5)
    assert _group_settings(opt) == groups


def test_newborn_lr_multiplier_scales_the_step_by_age():
    model, x, y = mlp_and_data()
    masks = UnitMasks(model, x[:2])
    masks.set_masks({"0": torch.arange(10) < 5})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    iv = Interventions(newborn_lr=5.0, newborn_lr_halflife=2.0)
    masks.grow({"0": torch.arange(10.0)}, {"0": 6}, interventions=iv)
    for age in (1, 2, 3):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        grad = model[0].weight.grad.clone()
        start = model[0].weight.detach().clone()
        masks.step(opt)
        step = model[0].weight.detach() - start
        assert torch.allclose(step[9], -0.1 * grad[9] * (1 + 4 * 0.5 ** (age / 2)), atol=1e-7)
        assert torch.allclose(step[0], -0.1 * grad[0], atol=1e-7)  # incumbents: plain SGD


def test_pickle_round_trip_keeps_masks_and_hooks():
    model, masks, x, y = make_masks("cnn")
    model.eval()
    expected = model(x)
    clone = pickle.loads(pickle.dumps(masks))
    clone.attach()  # idempotent: hooks came with the model
    assert sum(len(m._forward_hooks) for m in clone.model.modules()) == 2
    assert torch.equal(clone.model(x), expected)
    assert clone.masks["0"].tolist() == masks.masks["0"].tolist()
    opt = torch.optim.SGD(clone.model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    frozen = clone.model[0].weight[1].detach().clone()
    clone.model.train()
    for _ in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(clone.model(x), y).backward()
        clone.step(opt)
    assert torch.equal(clone.model[0].weight[1], frozen)
    dense = copy.deepcopy(model)
    assert remove_mask_hooks(dense) == 2
    assert not torch.equal(dense(x), expected)


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="maskable hidden layer"):
        UnitMasks(nn.Sequential(nn.Flatten(), nn.Linear(6, 3)), torch.randn(2, 6))
    model, masks, _, _ = make_masks("mlp")
    with pytest.raises(ValueError, match="masks: no maskable layer named 'head'"):
        masks.set_masks({"head": torch.ones(3, dtype=torch.bool)})
    with pytest.raises(ValueError, match=r"masks\['0'\] must have shape \(10,\)"):
        masks.set_masks({"0": torch.ones(4, dtype=torch.bool)})
    with pytest.raises(ValueError, match="optimizer_state"):
        Interventions(optimizer_state="warm")
    with pytest.raises(ValueError, match="outgoing"):
        Interventions(outgoing="random")
    with pytest.raises(ValueError, match="score"):
        unit_scores(masks, "taylor")
    with pytest.raises(ValueError, match="needs the optimizer"):
        masks.grow({"0": torch.ones(10)}, {"0": 10}, interventions=Interventions(optimizer_state="zero"))


class _CatNet(nn.Module):
    """Concatenates a probed branch with an unprobed one: a batch of one cannot broadcast there."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 3), nn.Linear(4, 2), nn.Linear(5, 2)

    def forward(self, x):
        return self.head(torch.relu(torch.cat([self.a(x), self.b(x)], dim=1)))


def _probe_models():
    import torchvision

    torch.manual_seed(0)
    resnet = torchvision.models.resnet18(num_classes=5)  # in-place residual adds, downsample branches
    resnet.layer3, resnet.layer4, resnet.fc = nn.Identity(), nn.Identity(), nn.Linear(128, 5)
    flat = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(64, 2))
    return [(resnet, torch.randn(2, 3, 16, 16)), (small_bn_cnn(0), torch.randn(2, 1, 8, 8)),
            (flat, torch.randn(2, 1, 8, 8)), (_CatNet(), torch.randn(2, 4))]


def test_broadcast_consumer_probe_matches_full_copies(monkeypatch):
    # the fast probe (copies start at the probed layer, forward stopped at the consumer) must find
    # the consumers and columns of the plain probe (2n+1 input copies through the whole model)
    for model, x in _probe_models():
        fast = UnitMasks(model, x)
        remove_mask_hooks(model)
        with monkeypatch.context() as patch:
            patch.setattr(consumers, "probe_starts", lambda model, point: [model])
            full = UnitMasks(model, x)
        remove_mask_hooks(model)
        assert list(fast.layers) == list(full.layers)
        for name, layer in full.layers.items():
            other = fast.layers[name]
            assert other.consumer == layer.consumer, name
            if layer.outgoing is not None:
                assert torch.equal(other.outgoing.columns, layer.outgoing.columns), name
        if "layer2.0.downsample.0" in full.layers:
            assert full.layers["layer2.0.downsample.0"].consumer == "layer2.1.conv1"


# --- the consumer probe (core.consumers) ----------------------------------------------------------


class _CReLUNet(nn.Module):
    """CReLU: unit i feeds the head's columns i and i + 4."""

    def __init__(self):
        super().__init__()
        self.hidden, self.head = nn.Linear(3, 4), nn.Linear(8, 2)

    def forward(self, x):
        h = self.hidden(x)
        return self.head(torch.cat([torch.relu(h), torch.relu(-h)], dim=1))


class _SoftmaxNet(nn.Module):
    """A softmax over the hidden units: every column of the head is fed by every unit."""

    def __init__(self):
        super().__init__()
        self.hidden, self.head = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.head(torch.softmax(self.hidden(x), dim=1))


def _consumer_of(model, x, name, point=None):
    layer_map = discover_layers(model, x)
    names = layer_map.names
    info = layer_map[name]
    return consumers.find_consumer(
        model, point if point is not None else info.module, n_units=info.out_units,
        unit_dim=-1 if info.kind == "linear" else 1, later=[layer_map[n] for n in names[names.index(name) + 1:]],
        run=model, x=x[:1])


def test_find_consumer_on_models_whose_consumers_are_known_by_hand():
    torch.manual_seed(0)
    flat = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(64, 2))
    x = torch.randn(2, 1, 8, 8)
    first = _consumer_of(flat, x, "0")
    assert first.layer.name == "2" and first.sources.tolist() == [0, 1, 2]
    assert first.columns().tolist() == [[0], [1], [2]]
    second = _consumer_of(flat, x, "2")  # Flatten: channel c feeds the 4 x 4 block of columns 16c ... 16c + 15
    assert second.layer.name == "4"
    assert second.columns().tolist() == [list(range(16 * c, 16 * c + 16)) for c in range(4)]
    assert _consumer_of(flat, x, "4") is None  # the head feeds no later layer

    crelu = _consumer_of(_CReLUNet(), torch.randn(2, 3), "hidden")
    assert crelu.layer.name == "head" and crelu.columns().tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]

    mixed = _consumer_of(_SoftmaxNet(), torch.randn(2, 3), "hidden")
    assert mixed.layer.name == "head" and mixed.sources.tolist() == [consumers.SEVERAL] * 4
    assert mixed.columns() is None

    cat = _CatNet()  # a batch of one cannot broadcast into the concatenation: copies from the input
    x = torch.randn(2, 4)
    assert _consumer_of(cat, x, "a").columns().tolist() == [[0], [1], [2]]
    assert _consumer_of(cat, x, "b").columns().tolist() == [[3], [4]]

    bn = small_bn_cnn(0)  # probed at the BatchNorm after the conv, as UnitMasks does
    found = _consumer_of(bn, torch.randn(2, 1, 8, 8), "0", point=bn[1])
    assert found.layer.name == "3" and found.columns().tolist() == [[0], [1], [2], [3]]


def _one_copy_per_unit(model, x, point, n_units, unit_dim, later):
    """The probe as it was before the grouped rows: ``2n+1`` input copies, unit i alone perturbed by
    ±1e4 in rows 1 + i and 1 + n + i; the (name, touched (n, features)) of the first later layer fed."""
    eye = torch.eye(n_units) * 1e4
    probes = torch.cat([torch.zeros(1, n_units), eye, -eye])
    hit = []

    def perturb(module, inputs, out):
        shape = [1] * out.dim()
        shape[unit_dim % out.dim()] = -1
        return out + probes.view(probes.shape[0], *shape[1:])

    def reached(module, inputs, info):
        inp = inputs[0]
        feature_dim = inp.dim() - 1 if info.kind == "linear" else 1
        diff = (inp[1:] - inp[:1]).abs() > 1e-4 * (1 + inp[:1].abs())
        reduce = [d for d in range(1, diff.dim()) if d != feature_dim]
        touched = diff.any(dim=reduce) if reduce else diff
        touched = touched[:n_units] | touched[n_units:]
        if touched.any() and not hit:
            hit.append((info.name, touched))

    handles = [info.module.register_forward_pre_hook(lambda m, inp, info=info: reached(m, inp, info))
               for info in later] + [point.register_forward_hook(perturb)]
    try:
        with torch.no_grad(), eval_mode(model):
            model(x[:1].expand(probes.shape[0], *x.shape[1:]))
    finally:
        for h in handles:
            h.remove()
    return hit[0] if hit else None


def test_grouped_probe_matches_one_copy_per_unit():
    # the 1 + 4k grouped rows find, for every unit, the features that its own pair of rows finds
    for model, x in _probe_models() + [(_CReLUNet(), torch.randn(2, 3)), (_SoftmaxNet(), torch.randn(2, 3))]:
        layer_map = discover_layers(model, x)
        names = layer_map.names
        for name in names:
            info = layer_map[name]
            if info.kind not in ("linear", "conv"):
                continue
            point = layer_map.norms.get(info.norm, info.module) if info.norm is not None else info.module
            unit_dim = -1 if info.kind == "linear" else 1
            later = [layer_map[n] for n in names[names.index(name) + 1:]]
            found = consumers.find_consumer(model, point, n_units=info.out_units, unit_dim=unit_dim,
                                            later=later, run=model, x=x[:1])
            reference = _one_copy_per_unit(model, x, point, info.out_units, unit_dim, later)
            if reference is None:
                assert found is None, name
                continue
            ref_name, touched = reference
            assert found.layer.name == ref_name, name
            expected = torch.where(touched.sum(0) > 1, consumers.SEVERAL,
                                   torch.where(touched.any(0), touched.long().argmax(0), consumers.NONE))
            assert torch.equal(found.sources, expected), name


TORCHVISION_BUILD_SECONDS = 20.0  # measured ~1 s (shufflenet), ~1.4 s (mobilenet), ~7 s (efficientnet)


@pytest.mark.parametrize("arch", ["efficientnet_b0", "mobilenet_v3_small", "shufflenet_v2_x0_5"])
def test_unit_masks_build_fast_on_torchvision_models(arch):
    # issue 23: UnitMasks on efficientnet_b0 at 32 x 32 took over a minute (2n+1 probe copies per layer)
    import time

    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(weights=None, num_classes=10)
    x = torch.randn(2, 3, 32, 32)
    start = time.perf_counter()
    masks = UnitMasks(model, x)
    seconds = time.perf_counter() - start
    assert seconds < TORCHVISION_BUILD_SECONDS, f"{arch}: UnitMasks took {seconds:.1f} s"
    assert any(layer.outgoing is not None for layer in masks.layers.values())
    remove_mask_hooks(model)


def test_masked_units_read_exactly_zero_at_their_consumers_in_shufflenet():
    # independent of the mask hook: the consumer's own input, read by a pre-hook, holds 0 at the
    # columns of every masked unit (train and eval mode), and the unmasked columns are not all 0
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.shufflenet_v2_x0_5(weights=None, num_classes=10)
    masks = UnitMasks(model, torch.randn(2, 3, 32, 32))
    with_consumer = {name: layer for name, layer in masks.layers.items() if layer.outgoing is not None}
    assert len(with_consumer) >= 10
    masks.set_masks({name: torch.arange(layer.size) % 3 != 1 for name, layer in with_consumer.items()})
    seen = {}
    handles = [model.get_submodule(layer.consumer).register_forward_pre_hook(
        lambda m, inp, name=name: seen.setdefault(name, inp[0].detach().clone()))
        for name, layer in with_consumer.items()]
    try:
        for training in (True, False):
            seen.clear()
            model.train(training)
            with torch.no_grad():
                model(torch.randn(4, 3, 32, 32))
            for name, layer in with_consumer.items():
                inp = seen[name]
                dim = inp.dim() - 1 if isinstance(model.get_submodule(layer.consumer), nn.Linear) else 1
                off = layer.outgoing.indices(torch.arange(1, layer.size, 3))
                on = layer.outgoing.indices(torch.arange(0, layer.size, 3))
                assert bool((inp.index_select(dim, off) == 0).all()), (name, training)
                assert bool((inp.index_select(dim, on) != 0).any()), (name, training)
    finally:
        for h in handles:
            h.remove()
