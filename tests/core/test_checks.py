"""Every public estimator refuses bad inputs up front with the shared error style of
``core.checks``: labels out of range, negative or float; an empty batch; float32 inputs to a
float64 model; a model on the meta device. Each message names the argument and what was expected."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from avalanche_plugins.ads import architecture_driven_shift
from avalanche_plugins.ads.shift import update_direction
from avalanche_plugins.core.checks import (
    check_labels,
    check_model_inputs,
    check_nonempty,
    check_targets,
)
from avalanche_plugins.core.layers import discover_layers
from avalanche_plugins.core.split import split_model
from avalanche_plugins.layer_adaptive import layer_curvature, layer_top_eigenvalues
from avalanche_plugins.layer_adaptive.fisher import (
    batched_fisher,
    empirical_fisher,
    expected_fisher,
    fisher_diagonal,
)
from avalanche_plugins.layer_adaptive.fisher_blocks import layer_fisher_eigenvalues
from avalanche_plugins.readiness import optimization_readiness
from avalanche_plugins.readiness.baselines import (
    active_unit_fraction,
    dormant_unit_fraction,
    entk_energy_rank,
    hessian_energy_rank,
    hidden_features,
    representation_ranks,
)
from avalanche_plugins.readiness.lookahead import curvature_readiness, lookahead_readiness
from avalanche_plugins.structural import UnitMasks
from avalanche_plugins.transport import fit_transport_key, gauss_newton_key, refine_key, stitch

CE = nn.CrossEntropyLoss()
N_CLASSES = 3


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, N_CLASSES))


def _data(n=12):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 4, generator=g), torch.randint(0, N_CLASSES, (n,), generator=g)


# estimators taking (model, loss, inputs, labels): each as f(model, x, y); ``name`` the labels' name
LABELLED = {
    "layer_curvature/fisher": (lambda m, x, y: layer_curvature(m, CE, x, y, method="fisher"), "targets"),
    "layer_curvature/hessian": (lambda m, x, y: layer_curvature(m, CE, x, y, method="hessian", max_iter=3), "targets"),
    "layer_top_eigenvalues": (lambda m, x, y: layer_top_eigenvalues(m, CE, x, y, max_iter=3), "targets"),
    "layer_fisher_eigenvalues/true": (lambda m, x, y: layer_fisher_eigenvalues(m, CE, x, y, labels="true"), "targets"),
    "empirical_fisher": (lambda m, x, y: empirical_fisher(m, CE, x, y), "targets"),
    "batched_fisher": (lambda m, x, y: batched_fisher(m, CE, [(x[:6], y[:6]), (x[6:], y[6:])]), "targets"),
    "fisher_diagonal/batched": (lambda m, x, y: fisher_diagonal("batched", m, CE, x, y), "targets"),
    "optimization_readiness": (lambda m, x, y: optimization_readiness(m, CE, x, y, n_batches=4), "targets"),
    "hessian_energy_rank": (lambda m, x, y: hessian_energy_rank(m, CE, x, y), "targets"),
    "lookahead_readiness": (lambda m, x, y: lookahead_readiness(m, CE, x, y, lr=0.1, k=2, n_runs=2), "targets"),
    "curvature_readiness": (lambda m, x, y: curvature_readiness(m, CE, x, y, lr=0.1), "targets"),
    "update_direction": (lambda m, x, y: update_direction(m, CE, x, y), "new_targets"),
    "architecture_driven_shift": (lambda m, x, y: architecture_driven_shift(m, CE, x, x, y, lr=0.01, steps=5),
                                  "new_targets"),
}


def _stitched(like):
    """A key and a stitched model of two real nets, on ``like``'s device and dtype."""
    net, x = _net(), _data()[0]
    u = net[:2](x).detach()
    key = fit_transport_key(u, u, "channel")
    p = next(like.parameters())
    return key, stitch(net, _net(), "1", key).to(device=p.device, dtype=p.dtype)


# estimators taking only (model, inputs)
UNLABELLED = {
    "expected_fisher": (lambda m, x: expected_fisher(m, x), "inputs"),
    "hidden_features": (lambda m, x: hidden_features(m, x), "inputs"),
    "representation_ranks": (lambda m, x: representation_ranks(m, x), "inputs"),
    "active_unit_fraction": (lambda m, x: active_unit_fraction(m, x), "inputs"),
    "dormant_unit_fraction": (lambda m, x: dormant_unit_fraction(m, x), "inputs"),
    "entk_energy_rank": (lambda m, x: entk_energy_rank(m, x), "inputs"),
    "refine_key": (lambda m, x: refine_key(*_stitched(m), x, steps=1), "anchors"),
    "gauss_newton_key": (lambda m, x: gauss_newton_key(*_stitched(m), x, iterations=1), "anchors"),
    "UnitMasks": (lambda m, x: UnitMasks(m, x), "example_input"),
    "discover_layers": (lambda m, x: discover_layers(m, x), "example_input"),
    "split_model": (lambda m, x: split_model(m, "1", x), "example_input"),
}
INPUTS_NAME = {"update_direction": "new_inputs", "architecture_driven_shift": "old_inputs"}  # checked first
ALL = {**{k: (lambda m, x, f=f: f(m, x, _data(x.shape[0])[1].to(x.device)), INPUTS_NAME.get(k, "inputs"))
          for k, (f, _) in LABELLED.items()},
       **UNLABELLED}


@pytest.mark.parametrize("name", sorted(LABELLED))
def test_estimators_run_on_good_inputs_and_refuse_bad_labels(name):
    estimator, labels = LABELLED[name]
    x, y = _data()
    estimator(_net(), x, y)  # the checks accept what the estimator can use
    bad = {"out of range": (y.clone().index_fill_(0, torch.tensor([2]), N_CLASSES),
                            ValueError, rf"{labels} must be class indices in \[0, 3\) for a model with 3 outputs; got values \[3\]"),
           "negative": (y.clone().index_fill_(0, torch.tensor([0]), -1),
                        ValueError, rf"{labels} must be class indices in \[0, 3\) for a model with 3 outputs; got values \[-1\]"),
           "float": (y.float(), TypeError, rf"{labels} must be class indices of an integer dtype \(torch.long\), "
                                           r"got torch.float32; convert with"),
           "bool": (y > 0, TypeError, rf"{labels} must be class indices of an integer dtype")}
    for case, (targets, error, message) in bad.items():
        with pytest.raises(error, match=message):
            estimator(_net(), x, targets)
        assert case


@pytest.mark.parametrize("name", sorted(ALL))
def test_estimators_refuse_empty_batches_dtype_mismatch_and_meta_models(name):
    estimator, inputs = ALL[name]
    x, _ = _data()
    estimator(_net(), x)  # good inputs pass
    empty = ("batches holds an empty minibatch" if name == "batched_fisher" else
             rf"{inputs} is empty \(shape \(0, 4\)\): at least one sample is needed")
    with pytest.raises(ValueError, match=empty):
        estimator(_net(), x[:0])
    with pytest.raises(TypeError, match=rf"{inputs} has dtype torch.float32 but the model's parameters are "
                                        r"torch.float64; convert one of them"):
        estimator(_net().double(), x)
    with pytest.raises(ValueError, match="model has parameters or buffers on the meta device"):
        estimator(_net().to("meta"), x)
    with pytest.raises(ValueError, match=rf"{inputs} is on the meta device"):
        estimator(_net(), x.to("meta"))


def test_fit_transport_key_refuses_empty_activations():
    u = torch.randn(5, 3)
    with pytest.raises(ValueError, match=r"u is empty \(shape \(0, 3\)\)"):
        fit_transport_key(u[:0], u[:0])
    with pytest.raises(ValueError, match=r"v is empty"):
        fit_transport_key(u, u[:0])
    with pytest.raises(TypeError, match="u must be a tensor, got list"):
        fit_transport_key([1.0], u)
    with pytest.raises(ValueError, match="u is on the meta device: it holds no values"):
        fit_transport_key(u.to("meta"), u)
    with pytest.raises(ValueError, match="v is on the meta device"):
        fit_transport_key(u, u.to("meta"), "cross_channel")


def test_checks_directly():
    check_labels(torch.tensor([0, -100, 2]), 3, ignore_index=-100)  # CrossEntropyLoss's ignore_index
    with pytest.raises(ValueError, match=r"y must be class indices >= 0; got values \[-1\]"):
        check_labels(torch.tensor([0, -1]), name="y")
    net, x = _net(), _data()[0]
    # float targets are class probabilities (N, C) or regression targets: not labels
    check_targets(net, x, torch.softmax(torch.randn(12, 3), 1), loss_fn=CE)
    check_targets(net, x, torch.randn(12, 3), loss_fn=nn.MSELoss())
    check_targets(net, x, torch.full((12,), -100), loss_fn=CE)
    with pytest.raises(ValueError, match=r"targets must be class indices in \[0, 3\) .* got values \[-100\]"):
        check_targets(net, x, torch.full((12,), -100), loss_fn=nn.MSELoss())  # no ignore_index outside CE/NLL
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        check_model_inputs(lambda t: t, x)
    with pytest.raises(ValueError, match="inputs is empty"):
        check_nonempty(torch.tensor(1.0))
    check_model_inputs(nn.Embedding(5, 2), torch.tensor([[1, 2]]))  # integer inputs: no dtype check
    assert net.training  # the one-sample forward of check_targets restores the train flags
    check_targets(net, x, torch.zeros(12, dtype=torch.long))
    assert net.training


def test_labels_are_checked_per_task_on_multi_head_models():
    from avalanche.models import MultiHeadClassifier, MultiTaskModule

    class Net(MultiTaskModule):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(4, 6)
            self.head = MultiHeadClassifier(6, initial_out_features=2)

        def forward_single_task(self, x, task_label):
            return self.head(torch.relu(self.body(x)), task_label)

    net = Net()
    x = torch.randn(6, 4)
    check_targets(net, x, torch.tensor([0, 1, 0, 1, 0, 1]), loss_fn=CE, task_labels=torch.zeros(6, dtype=torch.long))
    with pytest.raises(ValueError, match=r"in \[0, 2\) for a model with 2 outputs; got values \[2\]"):
        check_targets(net, x, torch.tensor([0, 1, 2, 1, 0, 1]), loss_fn=CE, task_labels=torch.zeros(6, dtype=torch.long))
