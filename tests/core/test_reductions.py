"""Mean- and sum-reduced losses, whatever the chunking (issue 38, "Reductions").

The conventions under test (:mod:`avalanche_plugins.core.reductions`):

* the curvature estimators of ``layer_adaptive`` return the curvature of the loss as ``loss_fn``
  defines it on all N samples, ``L = loss_fn(f(X), Y)``: mean-loss curvature for ``"mean"``,
  sum-loss curvature for ``"sum"`` (as curvlinops does), whatever ``chunk_size``;
* the readiness and ADS diagnostics are of the per-sample mean loss whatever the reduction (their
  definitions are for a mean loss), so a sum-reduced loss gives the mean-reduced numbers when the
  per-sample losses agree;
* ``reduction="none"`` and a callable whose reduction cannot be read are refused with a
  ``ValueError`` naming the estimator and the fix.

The table, as curvlinops' ``test/cases.py``: case (model × loss × output shape) × reduction × chunk
size, each estimator against a dense float64 reference computed here without the package's code
(``torch.autograd.functional.hessian`` of the whole loss, per-sample gradients one sample at a
time, curvlinops' ``GGNLinearOperator``). Tolerances: float64 throughout; the references and the
estimators sum the same O(N·P) float64 terms in different orders (relative error ~1e-15), and the
Lanczos runs stop at breakdown (the blocks have at most 24 parameters), so 1e-9 relative to the
block's largest eigenvalue leaves six orders of magnitude of margin.
"""

from __future__ import annotations

import functools

import pytest
import torch
from curvlinops import GGNLinearOperator
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from avalanche_plugins.ads import architecture_driven_shift, update_direction
from avalanche_plugins.core.calls import eval_mode
from avalanche_plugins.core.layers import discover_layers
from avalanche_plugins.layer_adaptive import (
    batched_fisher,
    empirical_fisher,
    fisher_diagonal,
    layer_curvature,
    layer_fisher_eigenvalues,
    layer_top_eigenvalues,
)
from avalanche_plugins.readiness import hessian_energy_rank, k_step_gain, optimization_readiness
from avalanche_plugins.readiness.lookahead import curvature_readiness, lookahead_readiness

N = 6
CHUNKS = (None, 1, 3, 4)  # 4 leaves a last chunk of 2: unequal chunks
REDUCTIONS = ("mean", "sum")
LOSSES = {"ce": nn.CrossEntropyLoss, "bce": nn.BCEWithLogitsLoss, "mse": nn.MSELoss}
RTOL = 1e-9


def _mlp(n_out, *tail, hidden=3, middle=()):
    return nn.Sequential(nn.Linear(4, hidden), *middle, nn.Tanh(), nn.Linear(hidden, n_out), *tail)


def _cnn():
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8, 2))


def _batchnorm():
    model = _mlp(3, middle=(nn.BatchNorm1d(3),))
    bn = model[1]
    with torch.no_grad():  # running statistics and affine parameters away from the identity
        bn.running_mean.copy_(torch.randn(3) * 0.3)
        bn.running_var.copy_(torch.rand(3) + 0.5)
        bn.weight.copy_(torch.rand(3) + 0.5)
        bn.bias.copy_(torch.randn(3) * 0.1)
    return model


def _dropout():
    return _mlp(3, middle=(nn.Dropout(0.5),)).train()  # the estimators evaluate in eval mode


# name: (model builder, input shape, loss, output shape per sample)
CASES = {
    "mlp-ce": (lambda: _mlp(3), (4,), "ce", (3,)),
    "mlp-bce": (lambda: _mlp(3), (4,), "bce", (3,)),
    "mlp-mse": (lambda: _mlp(3), (4,), "mse", (3,)),
    "seq-ce": (lambda: _mlp(6, nn.Unflatten(1, (3, 2))), (4,), "ce", (3, 2)),  # (N, C, d) logits
    "seq-bce": (lambda: _mlp(6, nn.Unflatten(1, (2, 3))), (4,), "bce", (2, 3)),
    "seq-mse": (lambda: _mlp(6, nn.Unflatten(1, (2, 3))), (4,), "mse", (2, 3)),  # (N, d, k) outputs
    "cnn-ce": (_cnn, (1, 6, 6), "ce", (2,)),  # max-pooling
    "dropout-ce": (_dropout, (4,), "ce", (3,)),
    "batchnorm-ce": (_batchnorm, (4,), "ce", (3,)),
}
CE_2D = [name for name, (_, _, loss, out) in CASES.items() if loss == "ce" and len(out) == 1]


@functools.cache
def case(name: str):
    """``(model, x, y)`` of a case, float64, fixed by the case's name."""
    build, in_shape, loss, out_shape = CASES[name]
    torch.manual_seed(sorted(CASES).index(name))
    model = build().double()
    x = torch.randn(N, *in_shape, dtype=torch.float64)
    if loss == "ce":
        y = torch.randint(0, out_shape[0], (N, *out_shape[1:]))
    elif loss == "bce":
        y = torch.rand(N, *out_shape, dtype=torch.float64)
    else:
        y = torch.randn(N, *out_shape, dtype=torch.float64)
    return model, x, y


def loss_of(name: str, reduction: str):
    return LOSSES[CASES[name][2]](reduction=reduction)


def _layers(model, x):
    return [list(layer.params) for layer in discover_layers(model, x[:2])]


@functools.cache
def dense_hessian_tops(name: str, reduction: str):
    """``(λ_max, max |λ|)`` of every layer's Hessian block of ``loss_fn(model(X), Y)``, the whole
    data in one call (no chunks), by ``torch.autograd.functional.hessian``."""
    model, x, y = case(name)
    loss_fn = loss_of(name, reduction)
    out = []
    with eval_mode(model):
        state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        state = {k: v.detach() for k, v in state.items()}
        for names in _layers(model, x):
            shapes = [state[n].shape for n in names]
            flat = torch.cat([state[n].flatten() for n in names])

            def loss(flat, names=names, shapes=shapes):
                block = dict(zip(names, (p.view(s) for p, s in zip(flat.split([s.numel() for s in shapes]), shapes))))
                return loss_fn(functional_call(model, {**state, **block}, (x,)), y)

            values = torch.linalg.eigvalsh(torch.autograd.functional.hessian(loss, flat))
            out.append((float(values[-1]), float(values.abs().max())))
    return out


@functools.cache
def per_sample_gradients(name: str, reduction: str) -> dict[str, torch.Tensor]:
    """``{parameter: (N, numel)}``: the gradient of ``loss_fn`` on each sample alone (a Python loop)."""
    model, x, y = case(name)
    loss_fn = loss_of(name, reduction)
    params = dict(model.named_parameters())
    rows = {n: [] for n in params}
    with eval_mode(model):
        for i in range(N):
            grads = torch.autograd.grad(loss_fn(model(x[i:i + 1]), y[i:i + 1]), list(params.values()))
            for n, g in zip(params, grads):
                rows[n].append(g.flatten())
    return {n: torch.stack(r) for n, r in rows.items()}


def scale(reduction: str) -> float:
    """``c`` of ``L = c Σ_i ℓ_i``: the loss as the user reduced it."""
    return 1.0 / N if reduction == "mean" else 1.0


def dense_ef_tops(name: str, reduction: str, *, debias: bool):
    """Top eigenvalue of every layer's empirical Fisher block ``c Σ_i g_i g_iᵀ`` (debiased: ``c·N/(N−1)
    λ_max(G − diag G)`` of the Gram ``G = M Mᵀ``)."""
    model, x, _ = case(name)
    grads = per_sample_gradients(name, reduction)
    out = []
    for names in _layers(model, x):
        m = torch.cat([grads[n] for n in names], dim=1)
        gram = m @ m.T
        if debias:
            value = torch.linalg.eigvalsh(gram - torch.diag(gram.diagonal()))[-1] * N / (N - 1)
        else:
            value = torch.linalg.eigvalsh(m.T @ m)[-1]
        out.append(scale(reduction) * float(value))
    return out


@functools.cache
def dense_ggn(name: str, reduction: str) -> list[torch.Tensor]:
    """Every layer's generalised Gauss–Newton block of the loss as reduced, by curvlinops (dense)."""
    model, x, y = case(name)
    out = []
    with eval_mode(model):
        for names in _layers(model, x):
            params = [dict(model.named_parameters())[n] for n in names]
            op = GGNLinearOperator(model, loss_of(name, reduction), params, [(x, y)], check_deterministic=False)
            size = sum(p.numel() for p in params)
            out.append(op @ torch.eye(size, dtype=torch.float64))
    return out


def close(actual, expected, reference_scale):
    return abs(actual - expected) <= RTOL * reference_scale


def chunk_options(chunk):
    return {} if chunk is None else {"chunk_size": chunk}


# ------------------------------------------------------------------------------------------ the table


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", list(CASES))
def test_exact_blocks_are_the_hessian_blocks_of_the_loss_as_reduced(name, reduction, chunk):
    model, x, y = case(name)
    training = model.training
    spec = layer_top_eigenvalues(model, loss_of(name, reduction), x, y, chunk_size=chunk, tol=1e-12,
                                 max_iter=60, layer_chunk_size=None)
    assert model.training == training
    for layer, value, (top, largest) in zip(spec.names, spec.top, dense_hessian_tops(name, reduction)):
        assert close(float(value), top, largest), (layer, float(value), top)


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", list(CASES))
def test_fisher_blocks_with_true_labels_are_the_empirical_fisher_blocks_of_the_loss_as_reduced(name, reduction,
                                                                                               chunk):
    model, x, y = case(name)
    for debias in (False, True):
        spec = layer_fisher_eigenvalues(model, loss_of(name, reduction), x, y, labels="true", debias=debias,
                                        **chunk_options(chunk))
        expected = dense_ef_tops(name, reduction, debias=debias)
        for layer, value, top in zip(spec.names, spec.top, expected):
            assert close(float(value), top, max(expected)), (layer, debias, float(value), top)


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", CE_2D)
def test_fisher_blocks_with_expected_labels_are_the_gauss_newton_blocks_of_the_loss_as_reduced(name, reduction,
                                                                                              chunk):
    model, x, y = case(name)
    spec = layer_fisher_eigenvalues(model, loss_of(name, reduction), x, y, labels="expected", debias=False,
                                    **chunk_options(chunk))
    expected = [float(torch.linalg.eigvalsh(g)[-1]) for g in dense_ggn(name, reduction)]
    for layer, value, top in zip(spec.names, spec.top, expected):
        assert close(float(value), top, max(expected)), (layer, float(value), top)


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", list(CASES))
def test_empirical_fisher_is_the_diagonal_of_the_empirical_fisher_of_the_loss_as_reduced(name, reduction, chunk):
    model, x, y = case(name)
    grads = per_sample_gradients(name, reduction)
    expected = {n: scale(reduction) * g.pow(2).sum(0) for n, g in grads.items()}
    largest = max(float(v.max()) for v in expected.values())
    for result in (empirical_fisher(model, loss_of(name, reduction), x, y, **chunk_options(chunk)),
                   fisher_diagonal("empirical", model, loss_of(name, reduction), x, y, **chunk_options(chunk))):
        for n, value in result.items():
            assert (value.flatten() - expected[n]).abs().max() <= RTOL * largest, n


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", CE_2D)
def test_expected_fisher_diagonal_is_the_gauss_newton_diagonal_of_the_loss_as_reduced(name, reduction):
    model, x, y = case(name)
    result = fisher_diagonal("expected", model, loss_of(name, reduction), x, y, chunk_size=4)
    for names, ggn in zip(_layers(model, x), dense_ggn(name, reduction)):
        value = torch.cat([result[n].flatten() for n in names])
        assert (value - ggn.diagonal()).abs().max() <= RTOL * float(ggn.diagonal().max()), names


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_sampled_fisher_blocks_scale_with_the_reduction_and_not_with_the_chunks(reduction):
    """Monte-Carlo labels have no dense reference; the same labels (seed) give the mean-loss Fisher
    times ``N·c`` and one value whatever the chunking."""
    model, x, y = case("cnn-ce")
    mean = layer_fisher_eigenvalues(model, loss_of("cnn-ce", "mean"), x, y, chunk_size=N).top
    for chunk in (1, 4):
        spec = layer_fisher_eigenvalues(model, loss_of("cnn-ce", reduction), x, y, chunk_size=chunk)
        assert torch.allclose(torch.as_tensor(spec.top), torch.as_tensor(mean) * N * scale(reduction),
                              rtol=RTOL, atol=0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_layer_curvature_hessian_follows_the_reduction(reduction):
    model, x, y = case("mlp-ce")
    spec = layer_curvature(model, loss_of("mlp-ce", reduction), x, y, method="hessian", chunk_size=4, tol=1e-12,
                           max_iter=60)
    for value, (top, largest) in zip(spec.top, dense_hessian_tops("mlp-ce", reduction)):
        assert close(float(value), top, largest)


# ------------------------------------------------------------------------------------- callables


def _sum_ce(out, y):
    return F.cross_entropy(out, y, reduction="sum")


@pytest.mark.parametrize(("callable_loss", "reduction", "factor"), [
    (F.cross_entropy, "mean", 1.0),
    (_sum_ce, "sum", 1.0),
    (lambda out, y: F.cross_entropy(out, y, reduction="sum") / 3.0, "sum", 1 / 3.0),  # a sum of ℓ_i / 3
])
def test_a_plain_callable_is_read_by_probing_it(callable_loss, reduction, factor):
    model, x, y = case("mlp-ce")
    spec = layer_top_eigenvalues(model, callable_loss, x, y, chunk_size=4, tol=1e-12, max_iter=60)
    for value, (top, largest) in zip(spec.top, dense_hessian_tops("mlp-ce", reduction)):
        assert close(float(value), factor * top, largest)
    fisher = empirical_fisher(model, callable_loss, x, y, chunk_size=4)
    reference = empirical_fisher(model, loss_of("mlp-ce", reduction), x, y)
    for n in fisher:
        assert torch.allclose(fisher[n], factor**2 * reference[n], rtol=1e-12, atol=0)


def test_a_callable_may_declare_its_reduction():
    def declared(out, y):
        return F.cross_entropy(out, y, reduction="sum")

    declared.reduction = "sum"
    model, x, y = case("mlp-ce")
    spec = layer_top_eigenvalues(model, declared, x, y, chunk_size=1, tol=1e-12, max_iter=60)
    for value, (top, largest) in zip(spec.top, dense_hessian_tops("mlp-ce", "sum")):
        assert close(float(value), top, largest)


# -------------------------------------------------------------------------------------- refusals


def _none_loss(out, y):
    return F.cross_entropy(out, y, reduction="none")


def _root_n_loss(out, y):  # normalised by √n: neither the mean nor the sum of per-sample losses
    return F.cross_entropy(out, y, reduction="sum") / out.shape[0] ** 0.5


def _estimators():
    """``{name: call(loss_fn)}`` for every estimator taking ``loss_fn``, on the mlp-ce case."""
    model, x, y = case("mlp-ce")
    return {
        "layer_top_eigenvalues": lambda f: layer_top_eigenvalues(model, f, x, y),
        "layer_fisher_eigenvalues": lambda f: layer_fisher_eigenvalues(model, f, x, y, labels="true"),
        "empirical_fisher": lambda f: empirical_fisher(model, f, x, y),
        "fisher_diagonal": lambda f: fisher_diagonal("expected", model, f, x, y),
        "batched_fisher": lambda f: batched_fisher(model, f, [(x, y)]),
        "optimization_readiness": lambda f: optimization_readiness(model, f, x, y, batch_size=2, n_batches=2),
        "k_step_gain": lambda f: k_step_gain(model, f, x, y, x, y, k=1, lr=0.1, batch_size=2, n_runs=2),
        "lookahead_readiness": lambda f: lookahead_readiness(model, f, x, y, lr=0.1, k=1, n_runs=2),
        "curvature_readiness": lambda f: curvature_readiness(model, f, x, y, lr=0.1),
        "hessian_energy_rank": lambda f: hessian_energy_rank(model, f, x, y),
        "update_direction": lambda f: update_direction(model, f, x, y),
        "architecture_driven_shift": lambda f: architecture_driven_shift(model, f, x, x, y, lr=0.1, steps=1),
    }


ESTIMATORS = list(_estimators())


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_reduction_none_is_refused_naming_the_estimator_and_the_fix(estimator):
    call = _estimators()[estimator]
    with pytest.raises(ValueError, match=rf"{estimator}.*reduction='none'.*reduction='mean'"):
        call(nn.CrossEntropyLoss(reduction="none"))
    with pytest.raises(ValueError, match=rf"{estimator}.*not one scalar"):
        call(_none_loss)


@pytest.mark.parametrize("estimator", [e for e in ESTIMATORS if e != "batched_fisher"])
def test_a_callable_whose_reduction_cannot_be_read_is_refused(estimator):
    """(``batched_fisher`` takes each minibatch's loss as it is, Avalanche's convention: any scalar.)"""
    with pytest.raises(ValueError, match=rf"{estimator}: cannot tell how loss_fn _root_n_loss reduces.*"
                                         r"reduction attribute"):
        _estimators()[estimator](_root_n_loss)


@pytest.mark.filterwarnings("ignore:Lanczos did not reach")  # the accepted loss runs two steps only
def test_a_callable_with_zero_losses_on_the_probe_is_refused():
    model, x, _ = case("mlp-mse")
    with eval_mode(model), torch.no_grad():
        fitted = model(x)

    def mse(out, y):
        return ((out - y) ** 2).mean()

    with pytest.raises(ValueError, match="layer_top_eigenvalues: cannot tell how loss_fn mse reduces.*reduction attribute"):
        layer_top_eigenvalues(model, mse, x, fitted)
    mse.reduction = "mean"  # the documented fix
    layer_top_eigenvalues(model, mse, x, fitted, max_iter=2, tol=1.0)


@pytest.mark.filterwarnings("ignore:Lanczos did not reach")  # the accepted loss runs two steps only
@pytest.mark.parametrize("loss_fn", [nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)),
                                     nn.CrossEntropyLoss(ignore_index=1)])
def test_a_mean_that_is_not_a_sample_mean_is_refused(loss_fn):
    """Class weights, or ignored targets, make the mean's denominator depend on the batch's labels."""
    model, x, y = case("mlp-ce")
    with pytest.raises(ValueError, match=r"layer_top_eigenvalues: .*reduction='sum'"):
        layer_top_eigenvalues(model, loss_fn, x, y)
    loss_fn.reduction = "sum"  # the sum of weighted per-sample losses decomposes
    layer_top_eigenvalues(model, loss_fn, x, y, max_iter=2, tol=1.0)


def test_fisher_blocks_with_model_labels_refuse_logits_with_extra_dimensions():
    model, x, y = case("seq-ce")
    for labels in ("sampled", "expected"):
        with pytest.raises(ValueError, match=rf"labels='{labels}'.*\(samples, classes\) logits.*labels='true'"):
            layer_fisher_eigenvalues(model, loss_of("seq-ce", "mean"), x, y, labels=labels)


# ------------------------------------------------------------------- readiness and ADS: the mean loss


def _readiness_values(loss_fn, chunk):
    """Every readiness / ADS number that depends on the loss, at one chunk size."""
    model, x, y = case("mlp-ce")
    gain = k_step_gain(model, loss_fn, x, y, x, y, k=3, lr=0.3, batch_size=2, n_runs=4, chunk_size=chunk)
    curvature = curvature_readiness(model, loss_fn, x, y, lr=0.3, chunk_size=chunk)
    sampled = optimization_readiness(model, loss_fn, x, y, batch_size=2, n_batches=8, chunk_size=chunk)
    exact = optimization_readiness(model, loss_fn, x, y, batch_size=2, estimator="per_sample", chunk_size=chunk)
    ads = architecture_driven_shift(model, loss_fn, x, x, y, lr=0.3, steps=3, path="probe", probe_steps=3,
                                    chunk_size=chunk)
    lookahead = lookahead_readiness(model, loss_fn, x, y, lr=0.3, k=2, n_runs=2, chunk_size=chunk)
    return {
        "gain": gain.gain, "loss_before": gain.loss_before, "lookahead": lookahead.readiness,
        "curvature.loss": curvature.loss, "curvature.gHg": curvature.grad_curvature,
        "curvature.gain": curvature.quadratic_gain,
        **{f"sampled.{k}": getattr(sampled, k) for k in ("loss", "grad_norm_sq", "second_moment", "readiness")},
        **{f"per_sample.{k}": getattr(exact, k) for k in ("loss", "grad_norm_sq", "second_moment", "readiness")},
        "ads": ads.ads, "ads.new_loss": ads.new_loss, "ads.grad_norm": ads.grad_norm,
        "hessian_energy_rank": hessian_energy_rank(model, loss_fn, x, y, energy=0.9, chunk_size=chunk),
    }


def _mean_loss_reference():
    """``L``, ``‖g‖²`` and ``gᵀHg`` of the per-sample mean loss, dense (whole data at once)."""
    model, x, y = case("mlp-ce")
    loss_fn = nn.CrossEntropyLoss()
    with eval_mode(model):
        params = {k: v.detach() for k, v in model.named_parameters()}
        names = list(params)
        flat = torch.cat([params[n].flatten() for n in names])
        sizes = [params[n].numel() for n in names]

        def loss(flat):
            pieces = dict(zip(names, (p.view(params[n].shape) for n, p in zip(names, flat.split(sizes)))))
            return loss_fn(functional_call(model, pieces, (x,)), y)

        g = torch.autograd.functional.jacobian(loss, flat)
        h = torch.autograd.functional.hessian(loss, flat)
    return float(loss(flat)), float(g @ g), float(g @ h @ g)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_readiness_and_ads_measure_the_per_sample_mean_loss_whatever_the_reduction_and_chunks(reduction):
    loss, grad_norm_sq, ghg = _mean_loss_reference()
    reference = _readiness_values(nn.CrossEntropyLoss(), 1024)
    assert abs(reference["curvature.loss"] - loss) <= 1e-12 * loss
    assert abs(reference["sampled.grad_norm_sq"] - grad_norm_sq) <= 1e-12 * grad_norm_sq
    assert abs(reference["curvature.gHg"] - ghg) <= 1e-12 * abs(ghg)
    for chunk in (1, 4):
        values = _readiness_values(nn.CrossEntropyLoss(reduction=reduction), chunk)
        for key, value in reference.items():
            assert abs(values[key] - value) <= 1e-10 * abs(value), (key, chunk, values[key], value)


# ---------------------------------------------------------------------------------------- adapters


def _strategy(criterion, plugins=(), metrics=(), lr=0.05):
    from avalanche.training import Naive

    from tests.fixtures import evaluator, few_digits_benchmark

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 6), nn.Tanh(), nn.Linear(6, 2))
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr), criterion=criterion,
                     train_mb_size=4, train_epochs=1, eval_mb_size=16, plugins=list(plugins),
                     evaluator=evaluator(*metrics))
    return strategy, few_digits_benchmark(2, 8, 2, 1).train_stream


def _adapters():
    from avalanche_plugins.ads.metric import ArchitectureDrivenShiftMetric
    from avalanche_plugins.layer_adaptive.ewc_plugin import LayerAdaptiveEWCPlugin
    from avalanche_plugins.layer_adaptive.lr_plugin import LayerAdaptiveLRPlugin
    from avalanche_plugins.layer_adaptive.sensitivity_metric import LayerSensitivityMetric
    from avalanche_plugins.readiness.metric import OptimizationReadinessMetric

    return {
        "LayerAdaptiveEWCPlugin": ({"plugins": [LayerAdaptiveEWCPlugin(1.0, schedule="uniform")]},
                                   "batched_fisher"),
        "LayerAdaptiveLRPlugin": ({"plugins": [LayerAdaptiveLRPlugin(schedule="smoothed", base_lr=0.05)]},
                                  "layer_fisher_eigenvalues"),
        "LayerSensitivityMetric": ({"metrics": [LayerSensitivityMetric(n_samples=8)]}, "layer_fisher_eigenvalues"),
        "OptimizationReadinessMetric": ({"metrics": [OptimizationReadinessMetric(n_samples=8)]},
                                        "optimization_readiness"),
        "ArchitectureDrivenShiftMetric": ({"metrics": [ArchitectureDrivenShiftMetric(calibration_size=4)]},
                                          "architecture_driven_shift"),
    }


@pytest.mark.parametrize("component", ["LayerAdaptiveEWCPlugin", "LayerAdaptiveLRPlugin", "LayerSensitivityMetric",
                                       "OptimizationReadinessMetric", "ArchitectureDrivenShiftMetric"])
def test_every_adapter_refuses_an_unreduced_criterion_before_training(component):
    components, estimator = _adapters()[component]
    strategy, stream = _strategy(nn.CrossEntropyLoss(reduction="none"), **components)
    from avalanche.core import SupervisedPlugin

    iterations = []

    class Count(SupervisedPlugin):
        def before_training_iteration(self, strategy, **kwargs):
            iterations.append(1)

    strategy.plugins.append(Count())
    with pytest.raises(ValueError, match=rf"^{component} refuses this model before training.*{estimator}: "
                                         r"loss_fn CrossEntropyLoss has reduction='none'"):
        strategy.train(stream[0], num_workers=0)
    assert not iterations


@pytest.mark.parametrize("fisher", ["empirical", "expected"])
def test_the_ewc_plugin_importances_are_of_the_criterion_as_reduced(fisher):
    """At lr 0 (the model never moves) a sum-reduced criterion gives ``N`` times the importances of
    the mean-reduced one, for both per-sample Fishers (``expected`` was the mean's whatever the
    criterion before issue 38)."""
    from avalanche_plugins.layer_adaptive.ewc_plugin import LayerAdaptiveEWCPlugin

    folded = {}
    for reduction in REDUCTIONS:
        plugin = LayerAdaptiveEWCPlugin(1.0, schedule="uniform", fisher=fisher)
        strategy, stream = _strategy(nn.CrossEntropyLoss(reduction=reduction), plugins=[plugin], lr=0.0)
        strategy.train(stream[0], num_workers=0)
        folded[reduction] = plugin._curvature
    n = len(stream[0].dataset)
    for name, mean in folded["mean"].items():
        assert torch.allclose(folded["sum"][name], n * mean, rtol=1e-5, atol=1e-12), name


def test_the_ads_metric_folds_a_summed_minibatch_into_the_sgd_step_size():
    """ADS steps on the per-sample mean loss; training on a sum-reduced criterion steps
    ``train_mb_size`` times further per iteration, so the metric's step size says so."""
    from types import SimpleNamespace

    from avalanche_plugins.ads.metric import ArchitectureDrivenShiftMetric

    model = nn.Linear(2, 2)
    settings = {}
    for reduction in REDUCTIONS:
        strategy = SimpleNamespace(optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                                   _criterion=nn.CrossEntropyLoss(reduction=reduction), train_mb_size=8)
        settings[reduction] = ArchitectureDrivenShiftMetric(steps=3)._training_settings(strategy)
    assert settings["mean"][0] == pytest.approx(0.2) and settings["sum"][0] == pytest.approx(8 * 0.2)
    assert settings["mean"][1:] == settings["sum"][1:] == (3, "sgd")
