"""The shared layer map: order, names, widths, norms, and exact splitting."""

import pytest
import torch
import torchvision
from avalanche.models import IncrementalClassifier, MTSimpleMLP, SimpleMLP
from torch import nn

from avalanche_plugins.core.layers import discover_layers
from avalanche_plugins.core.split import split_model, split_points
from tests.cases import build_model

X28 = torch.randn(3, 1, 28, 28)


def summary(layer_map):
    return [(layer.name, layer.in_units, layer.out_units, layer.norm) for layer in layer_map]


def test_mlp_order_names_widths():
    model = build_model("mlp", (1, 28, 28), 10, hidden=(64, 32))
    assert summary(discover_layers(model, X28)) == [
        ("features.1", 784, 64, None),
        ("features.3", 64, 32, None),
        ("head", 32, 10, None),
    ]


def test_execution_order_not_registration_order():
    class Reversed(nn.Module):
        def __init__(self):
            super().__init__()
            self.last = nn.Linear(8, 2)  # registered first, runs last
            self.first = nn.Linear(4, 8)

        def forward(self, x):
            return self.last(torch.relu(self.first(x)))

    lm = discover_layers(Reversed(), torch.randn(2, 4))
    assert lm.names == ["first", "last"]
    assert [layer.depth for layer in lm] == [1, 2]
    assert set(lm[0].params) == {"first.weight", "first.bias"}


def test_cnn_with_batchnorm_reports_following_norm():
    model = build_model("cnn", (1, 28, 28), 10, widths=(8, 16))
    lm = discover_layers(model, X28)
    assert summary(lm) == [
        ("features.0.0", 1, 8, "features.0.1"),
        ("features.1.0", 8, 16, "features.1.1"),
        ("head", 16, 10, None),
    ]
    assert lm.unassigned["features.0.1.weight"] == "normalisation layer"
    assert [layer.kind for layer in lm] == ["conv", "conv", "linear"]


def test_torchvision_resnet18():
    model = torchvision.models.resnet18(num_classes=7)
    lm = discover_layers(model, torch.randn(2, 3, 32, 32))
    assert len(lm) == 21  # 20 convs (incl. 3 downsample) + fc
    assert lm.names[:3] == ["conv1", "layer1.0.conv1", "layer1.0.conv2"]
    assert lm[0].norm == "bn1" and lm[-1].name == "fc" and lm[-1].out_units == 7
    down = lm["layer2.0.downsample.0"]
    assert (down.in_units, down.out_units, down.norm) == (64, 128, "layer2.0.downsample.1")
    # every parameter is either in a layer or a normalisation parameter
    assigned = set(lm.param_to_layer())
    assert assigned | set(lm.unassigned) == {n for n, _ in model.named_parameters()}
    assert set(lm.unassigned.values()) == {"normalisation layer"}


def test_tiny_vit_and_torch_attention():
    vit = build_model("vit", (1, 28, 28), 10, dim=32, depth=2, heads=4)
    lm = discover_layers(vit, X28)
    assert lm.names[:5] == ["embed.proj", "blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.0", "blocks.0.mlp.2"]
    assert lm["blocks.0.attn.qkv"].out_units == 96
    assert lm.unassigned["embed.cls_token"].startswith("parameter of a container")
    # nn.MultiheadAttention never calls its out_proj: the whole module is one layer
    tv = torchvision.models.VisionTransformer(image_size=28, patch_size=7, num_layers=1, num_heads=2,
                                              hidden_dim=16, mlp_dim=32, num_classes=10)
    lm = discover_layers(tv, torch.randn(2, 3, 28, 28))
    attn = lm["encoder.layers.encoder_layer_0.self_attention"]
    assert attn.kind == "attention" and (attn.in_units, attn.out_units) == (16, 16)
    assert "encoder.layers.encoder_layer_0.self_attention.out_proj.weight" in attn.params


def test_avalanche_models_and_heads():
    lm = discover_layers(SimpleMLP(num_classes=10, input_size=784, hidden_size=64), X28.view(3, -1))
    assert summary(lm) == [("features.0", 784, 64, None), ("classifier", 64, 10, None)]
    lm = discover_layers(MTSimpleMLP(input_size=784, hidden_size=64), X28.view(3, -1))
    assert summary(lm) == [("features.0", 784, 64, None), ("classifier.classifiers.0.classifier", 64, 2, None)]
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), IncrementalClassifier(32, 2))
    assert summary(discover_layers(model, X28))[-1] == ("3.classifier", 32, 2, None)
    multi = build_model("mlp", (1, 28, 28), 2, multihead=True, hidden=(16,))
    lm = discover_layers(multi, X28)
    assert lm.names == ["trunk.features.1", "head.classifiers.0.classifier"]


def test_unexecuted_heads_are_reported():
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(4, 8)
            self.heads = nn.ModuleList([nn.Linear(8, 2), nn.Linear(8, 2)])

        def forward(self, x):
            return self.heads[0](self.body(x))

    lm = discover_layers(TwoHeads(), torch.randn(2, 4))
    assert lm.names == ["body", "heads.0"]
    assert lm.unassigned["heads.1.weight"] == "module not executed by the example input"


def test_bad_models_raise():
    with pytest.raises(ValueError, match="no parametrised layer"):
        discover_layers(nn.Sequential(nn.ReLU()), torch.randn(2, 4))

    shared = nn.Linear(4, 4)
    with pytest.raises(ValueError, match="weight sharing"):
        discover_layers(nn.Sequential(shared, nn.ReLU(), shared), torch.randn(2, 4))
    with pytest.raises(TypeError, match="nn.Module"):
        discover_layers("not a model", torch.randn(2, 4))


def test_mode_is_restored():
    model = build_model("cnn", (1, 28, 28), 10)
    model.train()
    discover_layers(model, X28)
    assert model.training
    model.eval()
    split_model(model, "features.0", X28)
    assert not model.training


@pytest.mark.parametrize(
    ("model", "x", "at"),
    [
        (build_model("mlp", (1, 28, 28), 10, hidden=(32, 16)), X28, "features.2"),
        (build_model("cnn", (1, 28, 28), 10, widths=(8, 16)), X28, "features.0"),
        (build_model("vit", (1, 28, 28), 10, dim=32, depth=2, heads=4), X28, "blocks.0"),
        (torchvision.models.resnet18(num_classes=5), torch.randn(2, 3, 32, 32), "layer3"),
        (torchvision.models.resnet18(num_classes=5), torch.randn(2, 3, 32, 32), "layer1.0"),
        (SimpleMLP(num_classes=10, input_size=784, hidden_size=32), X28.view(3, -1), "features.0"),
    ],
)
def test_split_reproduces_forward_exactly(model, x, at):
    model.eval()
    early, late = split_model(model, at, x)
    fresh = torch.randn_like(x)  # a batch the split was not traced on, another batch size too
    with torch.no_grad():
        for batch in (x, fresh[:2]):
            assert torch.equal(late(early(batch)), model(batch))
    # parameters are shared, not copied
    assert any(p is q for p in early.parameters() for q in model.parameters())


def test_split_stitches_two_models():
    a = build_model("cnn", (1, 28, 28), 10, widths=(8, 16)).eval()
    b = build_model("cnn", (1, 28, 28), 10, widths=(8, 16)).eval()
    early_b, _ = split_model(b, "features.0", X28)
    _, late_a = split_model(a, "features.0", X28)
    with torch.no_grad():
        expected = a.head(a.features[1:](b.features[0](X28)))
        assert torch.allclose(late_a(early_b(X28)), expected)


def test_split_errors_list_valid_points():
    model = torchvision.models.resnet18(num_classes=5)
    x = torch.randn(2, 3, 32, 32)
    assert {"layer1", "layer2", "layer3", "layer4"} <= set(split_points(model, x))
    with pytest.raises(ValueError, match="not a chain.*layer2"):
        split_model(model, "layer2.0.conv1", x)
    with pytest.raises(ValueError, match="names no submodule"):
        split_model(model, "layer9", x)
    with pytest.raises(ValueError, match="last module"):
        split_model(model, "fc", x)
    with pytest.raises(TypeError, match="single tensor"):
        split_model(model, "layer1", (x,))


def test_attach_parameters_rules():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.token = nn.Parameter(torch.zeros(4))
            self.conv = nn.Conv2d(1, 4, 3)
            self.bn = nn.BatchNorm2d(4)
            self.heads = nn.ModuleList([nn.Linear(4, 2), nn.Linear(4, 2)])

        def forward(self, x):
            h = self.bn(self.conv(x)).mean((2, 3)) + self.token
            return self.heads[0](h)

    net = Net()
    index_of, leftovers = discover_layers(net, torch.randn(2, 1, 5, 5)).attach_parameters()
    assert index_of["bn.weight"] == index_of["conv.weight"] == 0
    assert index_of["heads.1.weight"] == index_of["heads.0.bias"] == 1
    assert leftovers == ["token"]


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
