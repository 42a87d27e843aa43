"""SCR generator, the tight online loop, regime classification and a tiny end-to-end run of
``benchmarks.plasticity_ranking`` (the full ``--quick`` run takes minutes, so the smoke test drives
``run_benchmark`` with miniature settings) and its ``--report``."""

import copy
import json
from dataclasses import asdict

import pytest
import torch
from torch import nn

from avalanche_plugins.study.catalog.zoo import MLP
from benchmarks import plasticity_ranking as pr
from benchmarks.plasticity_ranking.settings import setting_from_dict
from benchmarks.scr import SlowlyChangingRegression, ltu_thresholds, scr_benchmark


@pytest.mark.parametrize("variant", ["bit_flip", "resample"])
def test_scr_inputs_binary_and_flipping_bits_constant_within_period(variant):
    scr = SlowlyChangingRegression(variant=variant, examples_per_period=200, seed=3)
    previous, changes = None, []
    for t in range(6):
        x, y = scr.period(t)
        assert x.shape == (200, 20) and y.shape == (200, 1)
        assert bool(((x == 0) | (x == 1)).all())
        flipping = x[:, :15]
        assert bool((flipping == flipping[0]).all())
        assert torch.equal(flipping[0], scr.flipping_bits(t))
        # the 5 random bits vary within the period (200 draws of 5 fair bits)
        assert len({tuple(r) for r in x[:, 15:].int().tolist()}) > 10
        if previous is not None:
            changes.append(int((flipping[0] != previous).sum()))
        previous = flipping[0]
    if variant == "bit_flip":
        assert changes == [1] * 5  # exactly one flipping bit changes per period
    else:  # all 15 bits are redrawn: some period changes several (P(≤ 1 change) = 16/2^15 per period)
        assert max(changes) > 1


def test_scr_resample_changes_many_bits_on_average():
    scr = SlowlyChangingRegression(variant="resample", seed=0, examples_per_period=4)
    changes = [int((scr.flipping_bits(t + 1) != scr.flipping_bits(t)).sum()) for t in range(40)]
    assert 5 < sum(changes) / len(changes) < 10  # Binomial(15, 1/2) mean 7.5


def test_scr_reproducible_for_a_seed_and_different_across_seeds():
    def period(seed, stream=0):  # a fresh problem each time: nothing carries over between draws
        return SlowlyChangingRegression(seed=seed, examples_per_period=50).period(4, stream=stream)

    (x1, y1), (x2, y2), (x3, y3) = period(7), period(7), period(8)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not (torch.equal(x1, x3) and torch.equal(y1, y3))
    xv, _ = period(7, stream=1)
    assert not torch.equal(xv, x1)  # the validation stream is an independent draw
    assert torch.equal(xv[:, :15], x1[:, :15])  # ... of the same period


def test_ltu_threshold_formula_hand_checked():
    # m = 4 inputs + bias: weights (+1, -1, +1, -1), bias -1 -> S = 3, tau = 0.7 * 5 - 3 = 0.5
    w = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    b = torch.tensor([-1.0])
    tau = ltu_thresholds(w, b, beta=0.7)
    assert torch.allclose(tau, torch.tensor([0.5]))
    # x = (1, 0, 1, 0): w.x + b = 2 - 1 = 1 > 0.5 -> fires (4 of 5 positions match: 80% > 70%;
    #   the bias weight -1 on its constant-1 input is the mismatch)
    # x = (1, 1, 1, 0): w.x + b = 2 - 1 - 1 = 0 <= 0.5 -> silent (3 of 5 match: 60% < 70%)
    x = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    fires = (x @ w.T + b).squeeze(1) > tau
    assert fires.tolist() == [True, False]
    # m = 3, S = 3 (two weights + the bias): 0.5 * 4 - 3 (the example of docs/benchmarks.md)
    tau = ltu_thresholds(torch.tensor([[1.0, -1.0, -1.0]]), torch.tensor([-1.0]), beta=0.5)
    assert tau.tolist() == [-1.0]


def test_ltu_rule_is_matching_fraction_above_beta():
    scr = SlowlyChangingRegression(seed=1, examples_per_period=300)
    x, y = scr.period(0)
    x_tilde = torch.cat([x, torch.ones(len(x), 1)], dim=1)
    w_tilde = torch.cat([scr.weights, scr.bias[:, None]], dim=1)
    matches = ((w_tilde[None] > 0) & (x_tilde[:, None] == 1)) | ((w_tilde[None] < 0) & (x_tilde[:, None] == 0))
    expected = (matches.sum(-1).float() > 0.7 * 21).float()
    assert torch.equal(scr.hidden(x), expected)
    assert torch.equal(y, (expected @ scr.output_weights)[:, None])


def test_scr_avalanche_stream_one_experience_per_period():
    bm = scr_benchmark(3, examples_per_period=16, test_examples=4, seed=2)
    assert len(bm.train_stream) == 3 and len(bm.test_stream) == 3
    x, y, t = bm.train_stream[2].dataset[0]
    x_ref, y_ref = SlowlyChangingRegression(seed=2, examples_per_period=16).period(2)
    assert torch.equal(x, x_ref[0]) and torch.equal(y, y_ref[0]) and int(t) == 0
    assert len(bm.train_stream[1].dataset) == 16 and len(bm.test_stream[2].dataset) == 4


@pytest.mark.parametrize("optimizer,loss", [("adam", "mse"), ("sgd", "ce")])
def test_online_learner_matches_torch_optimizers(optimizer, loss):
    torch.manual_seed(0)
    n_out = 1 if loss == "mse" else 4
    model = MLP((6,), hidden=(5, 5), n_classes=n_out)
    ref = copy.deepcopy(model)
    x = torch.randn(20, 6)
    y = torch.randn(20, 1) if loss == "mse" else torch.randint(0, 4, (20,))
    learner = pr.OnlineLearner(model, optimizer, 0.01, loss)
    learner.train(x, y)
    opt = (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)(ref.parameters(), lr=0.01)
    loss_fn = nn.MSELoss() if loss == "mse" else nn.CrossEntropyLoss()
    for i in range(20):
        opt.zero_grad()
        loss_fn(ref(x[i:i + 1]), y[i:i + 1]).backward()
        opt.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    if optimizer == "adam":
        restored = torch.optim.Adam(model.parameters(), lr=0.01)
        restored.load_state_dict(learner.optimizer_state_dict())
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.allclose(restored.state[p]["exp_avg_sq"], opt.state[q]["exp_avg_sq"], atol=1e-7)


def test_online_learner_adam_is_the_library_functional_step():
    from avalanche_plugins.core.optim import AdamState, functional_step

    torch.manual_seed(1)
    model = MLP((6,), hidden=(4,), n_classes=1)
    params = {name: p.detach().double().clone() for name, p in model.named_parameters()}
    state = AdamState(params)
    x, y = torch.randn(15, 6), torch.randn(15, 1)
    learner = pr.OnlineLearner(model, "adam", 0.01, "mse")
    learner.train(x, y)
    for i in range(15):
        reference = MLP((6,), hidden=(4,), n_classes=1).double()
        reference.load_state_dict(params)
        grads = torch.autograd.grad(nn.MSELoss()(reference(x[i:i + 1].double()), y[i:i + 1].double()),
                                    list(reference.parameters()))
        functional_step(params, dict(zip(params, grads)), 0.01, optimizer="adam", state=state)
    assert learner.steps == state.step == 15
    for name, p in model.named_parameters():
        assert torch.allclose(p.double(), params[name], atol=1e-5)


def _dead_net():
    """A 20-5-5-1 MLP whose last hidden layer is negative on every input (ReLU 0 everywhere)."""
    torch.manual_seed(0)
    model = MLP((20,), hidden=(5, 5), n_classes=1)
    with torch.no_grad():
        last = model.features[3]  # second Linear
        last.weight.zero_()
        last.bias.fill_(-1.0)
    return model, last


def test_regime_classification_on_hand_made_dead_net():
    model, last = _dead_net()
    probe = SlowlyChangingRegression(seed=0, examples_per_period=64).period(0)[0]
    assert pr.regime(pr.last_hidden_features(model, probe)) == {"dead": True, "last_layer_active": 0.0}
    with torch.no_grad():
        last.bias[2] = 0.5  # one unit of five now fires on every input
    assert pr.regime(pr.last_hidden_features(model, probe)) == {"dead": False, "last_layer_active": pytest.approx(0.2)}
    # the examples of docs/benchmarks.md, "Regime"
    assert pr.regime(torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])) == {
        "dead": False, "last_layer_active": 0.3333333432674408}
    assert pr.regime(torch.zeros(4, 3))["dead"] is True


def _fresh_adam_state(model):
    """A ``torch.optim.Adam`` state dict with zero moments and step count for every parameter."""
    state = torch.optim.Adam(model.parameters(), lr=0.01).state_dict()
    state["state"] = {i: {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
                      for i, p in enumerate(model.parameters())}
    return state


def test_score_checkpoint_records_the_regime_that_stratifies_the_tables():
    setting = _tiny_settings()[0]
    model, last = _dead_net()
    data = SlowlyChangingRegression(seed=0, examples_per_period=150).period(1)
    val = SlowlyChangingRegression(seed=0, examples_per_period=120).period(1, stream=1)
    rec = pr.score_checkpoint(setting, model, nn.MSELoss(), (*data, *val), seed=0,
                              optimizer_state=_fresh_adam_state(model))
    assert rec["dead"] is True and rec["last_layer_active"] == 0.0
    with torch.no_grad():
        last.bias[2] = 0.5
    rec = pr.score_checkpoint(setting, model, nn.MSELoss(), (*data, *val), seed=0,
                              optimizer_state=_fresh_adam_state(model))
    assert rec["dead"] is False and rec["last_layer_active"] == pytest.approx(0.2)
    # the strata of the PRA rows are exactly these flags
    run = {"seed": 0, "checkpoints": [dict(rec, dead=d) for d in (True, True, False)]}
    rows = pr.pra_rows(run, setting)
    assert {r["n_checkpoints"] for r in rows if r["stratum"] == "dead"} == {2}
    assert {r["n_checkpoints"] for r in rows if r["stratum"] == "live"} == {1}


def _tiny_settings():
    common = dict(n_checkpoints=4, checkpoint_every=2, examples_per_task=150, n_val=120, ks=(1, 5), n_runs=8,
                  or_batches=16, n_probe=32, n_probe_jacobian=8, cost_k=(5, 10))
    return [
        pr.Setting(benchmark="scr", name="scr/bit_flip/h2", hidden=(5, 5), optimizer="adam", lr=0.01,
                   data="scr", gain_optimizers=(("adam_fresh", "adam", 0.01), ("adam_continue", "adam_continue", 0.01),
                                                ("sgd", "sgd", 0.01)), **common),
        pr.Setting(benchmark="pmnist", name="pmnist/digits", hidden=(16, 16, 16), optimizer="sgd", lr=0.003,
                   data="digits", gain_optimizers=(("adam_fresh", "adam", 0.001), ("sgd", "sgd", 0.003)),
                   ablation_fractions=(1.0, 0.1, 0.01), **common),
    ]


@pytest.mark.slow
def test_end_to_end_tiny_run_writes_pra_and_cost_ratios(tmp_path, capsys):
    result = pr.run_benchmark(_tiny_settings(), [0], tmp_path, progress=False)
    data = json.loads((tmp_path / "results.json").read_text())
    for key in ("pra", "pra_by_stratum", "ablation", "cost_ratios", "headline", "regimes", "checkpoints", "summary",
                "noise_ceiling_and_pooled"):
        assert key in data
    gains = {"scr": ("adam_fresh", "adam_continue", "sgd"), "pmnist": ("adam_fresh", "sgd")}
    for bench in ("scr", "pmnist"):
        columns = data["pra"][bench]
        assert set(columns) == {f"{g}/k{k}" for g in gains[bench] for k in (1, 5)}
        for column in columns.values():
            assert set(column) == set(pr.METRICS)
            for value in column.values():
                assert value["mean"] is None or 0.0 <= value["mean"] <= 1.0
        assert set(data["pra_by_stratum"]) == set(pr.STRATA)
        costs = data["cost_ratios"][bench]
        assert costs["g5_over_or"] > 0 and costs["g10_over_or"] > 0 and costs["per_sample_over_sampled"] > 0
        regimes = data["regimes"][next(s.name for s in _tiny_settings() if s.benchmark == bench)]
        assert regimes["dead"] + regimes["live"] == 4  # every checkpoint is classified
    assert data["pra"]["scr"]["adam_fresh/k5"]["or"]["mean"] is not None
    assert set(data["ablation"]["pmnist"]["adam_fresh/k1"]) == {"or_val1", "or_val0.1", "or_val0.01"}
    assert (tmp_path / "or_vs_gain.png").exists() and (tmp_path / "results.csv").exists()
    assert (tmp_path / "jobs.jsonl").exists()
    assert data["headline"]["scr"]["column"] == "adam_fresh/k5"
    assert data["headline"]["scr"]["best_baseline"] in pr.BASELINES
    printed = capsys.readouterr().out
    assert "Pairwise ranking accuracy" in printed and "OR (sampled)" in printed and "noise ceiling" in printed
    # --report re-prints every table, pooled analysis included, from the saved run
    again = pr.main(["--report", str(tmp_path / "results.json")])["report"]
    assert again == result["report"] and again in printed
    pooled = data["noise_ceiling_and_pooled"]["scr"]["adam_fresh_k5"]
    assert pooled["n_checkpoints"] == 4 and 0.5 <= pooled["ceiling_per_run"] <= 1.0
    # the run is resumable: a second call reuses every cached job
    jobs = len((tmp_path / "jobs.jsonl").read_text().splitlines())
    assert pr.run_benchmark(_tiny_settings(), [0], tmp_path, progress=False, echo=False)["report"] == result["report"]
    assert len((tmp_path / "jobs.jsonl").read_text().splitlines()) == jobs == 2


def test_default_settings_follow_the_protocol():
    full = pr.default_settings(False)
    # the saved form (results.json) reads back as the same settings
    assert all(setting_from_dict(asdict(s)) == s for s in pr.default_settings(True) + full)
    scr = [s for s in full if s.benchmark == "scr"]
    assert {(s.variant, s.hidden) for s in scr} == {(v, h) for v in ("bit_flip", "resample") for h in ((5,), (5, 5))}
    assert all(s.optimizer == "adam" and s.lr == 0.01 and s.n_checkpoints >= 30 and s.checkpoint_every == 5
               and s.ks == (1, 10, 100) and s.or_batch == 4 and s.or_batches == 128 for s in scr)
    assert all(s.ablation_fractions == (1.0, 0.1, 0.01, 0.001) for s in scr)
    (pm,) = [s for s in full if s.benchmark == "pmnist"]
    assert pm.data == "digits" and pm.hidden == (100, 100, 100) and pm.optimizer == "sgd" and pm.lr == 0.003
    assert pm.ablation_fractions == (1.0, 0.1, 0.01) and pm.n_checkpoints >= 30
    assert pr.default_settings(False, "/some/root")[-1].data == "mnist"
    assert all(s.ks == (1, 10) and s.n_checkpoints < 30 for s in pr.default_settings(True))


def test_main_rejects_an_empty_selection(tmp_path):
    with pytest.raises(SystemExit):
        pr.main(["--quick", "--only", "no/such/setting", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        pr.main(["--quick", "--seeds", "0", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        pr.main(["--quick", "--skip", "scr,pmnist", "--out", str(tmp_path)])


# ---- issue 33: streams that lose plasticity -------------------------------------------------


def _declining(stream, **kw):
    (setting,) = [s for s in pr.declining_settings(True, tasks=3, n_runs=4, epochs=1) if s.stream == stream]
    return pr.Setting(**{**setting.__dict__, **kw})


def test_random_label_stream_relabels_the_same_images_and_binary_stream_uses_pairs():
    source = pr.TaskSource(_declining("random_labels"), seed=4)
    tasks = [source.task(t) for t in range(3)]
    for x, y, xv, yv in tasks:
        assert torch.equal(xv, source.x_tr) and len(x) == len(xv) == 500  # the same images every task
        order = torch.argsort(y * 10_000 + torch.arange(len(y)))  # training = validation, reshuffled
        assert sorted(y.tolist()) == sorted(yv.tolist()) and order.numel() == len(y)
        assert int(y.min()) >= 0 and int(y.max()) <= 9
    assert (tasks[0][3] != tasks[1][3]).float().mean() > 0.8  # fresh labels (chance of a repeat 0.1)
    again = pr.TaskSource(_declining("random_labels"), seed=4).task(1)
    assert all(torch.equal(a, b) for a, b in zip(again, tasks[1]))
    binary = pr.TaskSource(_declining("binary"), seed=0)
    x, y, xv, yv = binary.task(0)
    assert set(y.tolist()) == {0, 1} and set(yv.tolist()) <= {0, 1} and binary.n_out == 2
    digits = {int(d) for d in binary.y_all[torch.cat([torch.nonzero((binary.x_all == row).all(1))[0]
                                                      for row in x[:20]])]}
    assert len(digits) == 2  # one pair of classes


def test_minibatch_learner_matches_a_torch_loop():
    torch.manual_seed(0)
    model = MLP((6,), hidden=(8,), n_classes=3)
    ref = copy.deepcopy(model)
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    learner = pr.MinibatchLearner(model, "sgd", 0.05, "ce", batch_size=16, epochs=2, momentum=0.9, seed=3)
    learner.train(x, y)
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(50_003)
    for _ in range(2):
        order = torch.randperm(40, generator=g)
        for i in range(0, 40, 16):
            b = order[i:i + 16]
            opt.zero_grad()
            nn.functional.cross_entropy(ref(x[b]), y[b]).backward()
            opt.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert learner.steps == 6 and 0 <= learner.last_accuracy <= 1
    assert set(learner.checkpoint()) == {"model", "optimizer", "steps"}


@pytest.mark.filterwarnings("ignore:Precision loss occurred")  # identical paired differences: t = ±inf
def test_lower_is_more_plastic_diagnostics_are_negated_and_paired_against_or():
    from benchmarks.plasticity_ranking.ranking import paired_against_or, pra_table, verdict

    setting = _declining("random_labels", ks=(1,), gain_optimizers=(("sgd", "sgd", 0.01),))
    rows = []
    for seed in range(3):
        gains = [0.1, 0.3, 0.2, 0.4]
        cks = [{"gain_sgd_k1": g, "or": g + (0.15 if i == 0 else 0.0), "dormant_units": -g, "weight_magnitude": g,
                "grad_norm_sq": g, "dead": False} for i, g in enumerate(gains)]
        rows += pr.pra_rows({"seed": seed, "checkpoints": cks}, setting)
    pra = {r["metric"]: r["pra"] for r in rows if r["seed"] == 0 and r["stratum"] == "all"}
    assert pra["dormant_units"] == 1.0 and pra["weight_magnitude"] == 0.0 and pra["grad_norm_sq"] == 1.0
    assert pra["or"] == pytest.approx(5 / 6) and pra["srank"] is None  # missing in these records
    tests = paired_against_or(rows, "randlabel", "sgd")
    assert tests[1]["grad_norm_sq"]["mean_diff"] == pytest.approx(1 / 6) and tests[1]["grad_norm_sq"]["n"] == 3
    _, values = pra_table(rows, "all")
    v = verdict(values, tests, "randlabel", "sgd", (1,))[1]
    assert v["beats_all"] is False and v["best_ingredient"] == "grad_norm_sq"
    assert v["best_diagnostic"] == "dormant_units" and "grad_norm_sq" in v["significantly_beaten_by"]


@pytest.mark.slow
def test_declining_stream_end_to_end_on_digits(tmp_path):
    settings = [_declining("random_labels", n_probe=32, or_batches=16, ablation_fractions=(1.0,))]
    result = pr.run_benchmark(settings, [0, 1, 2], tmp_path, progress=False, echo=False)
    assert "OR against its ingredients" in result["report"] and "Δ vs OR" in result["report"]
    data = json.loads((tmp_path / "results.json").read_text())
    assert all(0 <= c["task_accuracy"] <= 1 for r in data["checkpoints"] for c in r["checkpoints"])
    assert data["cost_ratios"]["randlabel"]["lookahead_over_g100"] > 0
