"""Tuple- and dict-returning models: ``core.outputs.logits_of`` and ``split_model(output_transform=)``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from avalanche_plugins.core.outputs import OutputTransform, logits_of
from avalanche_plugins.core.split import split_model, split_points


class TupleHead(nn.Module):
    """A head returning ``(logits, features)``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, h):
        return self.fc(h), h


class DictNet(nn.Module):
    """A forward that packs the head's logits into a dict (HF style)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        features = self.body(x)
        return {"logits": self.head(features), "features": features}


class PackedTuple(DictNet):
    def forward(self, x):
        out = super().forward(x)
        return out["logits"], out["features"]


X = torch.randn(6, 4)


def test_logits_of():
    t = torch.randn(2, 3)
    assert logits_of(t) is t
    assert logits_of((t, 1), lambda out: out[0]) is t
    with pytest.raises(ValueError, match=r"the model returned a tuple of 2 \(Tensor\(2, 3\), int\), not a tensor: "
                                         r"pass output_transform=.*lambda out: out\[0\]"):
        logits_of((t, 1))
    with pytest.raises(ValueError, match=r"a dict with keys \['aux', 'logits'\].*output_transform=lambda out: "
                                         r"out\['logits'\]"):
        logits_of({"aux": t, "logits": t})
    with pytest.raises(ValueError, match="output_transform must return the logits tensor, got a tuple"):
        logits_of((t, t), lambda out: out)
    with pytest.raises(TypeError, match="output_transform must be callable"):
        logits_of(t, "logits")


def test_split_model_with_a_tuple_returning_head():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), TupleHead())
    with pytest.raises(ValueError, match="output_transform"):  # was: 'tuple' object has no attribute 'shape'
        split_model(model, "0", X)
    first = lambda out: out[0]  # noqa: E731
    assert split_points(model, X, output_transform=first) == ["0", "1"]
    for at in ("0", "1"):
        early, late = split_model(model, at, X, output_transform=first)
        x = torch.randn(5, 4)
        assert torch.equal(late(early(x)), model(x)[0])
        assert {id(p) for p in late.parameters()} <= {id(p) for p in model.parameters()}  # shared, not copied


@pytest.mark.parametrize(("cls", "transform"), [(DictNet, lambda out: out["logits"]), (PackedTuple, lambda out: out[0])])
def test_split_model_with_a_forward_that_packs_the_logits(cls, transform):
    torch.manual_seed(0)
    model = cls()
    with pytest.raises(ValueError, match="output_transform"):
        split_model(model, "body", X)
    assert "body.1" in split_points(model, X, output_transform=transform)
    for at in ("body", "body.1"):
        early, late = split_model(model, at, X, output_transform=transform)
        x = torch.randn(5, 4)
        assert torch.equal(late(early(x)), transform(model(x)))
    with pytest.raises(ValueError, match="nothing would remain"):
        split_model(model, "head", X, output_transform=transform)


def test_split_model_plain_models_unchanged_with_a_transform():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    early, late = split_model(model, "1", X, output_transform=lambda out: 2 * out)
    assert torch.equal(late(early(X)), 2 * model(X))
    early, late = split_model(model, "1", X)
    assert torch.equal(late(early(X)), model(X)) and not isinstance(late[-1], OutputTransform)


class OpaqueHead(nn.Module):
    """A leaf head (no submodules) returning a dict: the late part ends with it, wrapped in the transform."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 8))

    def forward(self, h):
        return {"logits": h @ self.weight.T}


def test_split_model_wraps_a_leaf_head_in_the_transform():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), OpaqueHead())
    early, late = split_model(model, "1", X, output_transform=lambda out: out["logits"])
    assert isinstance(late[-1], OutputTransform) and late[-1].module is model[2]
    assert torch.equal(late(early(X)), model(X)["logits"])
