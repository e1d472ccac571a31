"""Sageflow: the public-data scores, the loss weights and the group weights by hand; whole rounds with
stragglers, filtering and γ halving recomputed by hand; the FedAvg reduction bit for bit; determinism;
exact resume; no public data refused in one line (exit 2 from main)."""
from __future__ import annotations

import math

import pytest
import torch

import main
from fltest import build_server, make_args, random_dataset, run_round
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from flcore.servers.serversageflow import group_weights, loss_weights, public_scores
from knowledgetest import refusal
from toydata import make_dataset
from runner import checkpoint

CLIENTS, DIM, C = 6, 4, 3
PUBLIC = ("--public_data", "0.2", "--public_data_withhold", "True")  # FedAvg beside it withholds the same rows


def server(algorithm: str = "Sageflow", *flags: str, **settings):
    data = random_dataset(num_clients=CLIENTS, dim=DIM, num_classes=C, seed=4, sizes=[10] * CLIENTS)
    settings = {"batch_size": 4, "global_rounds": 4, "local_learning_rate": 0.5, **settings}
    return build_server(make_args(algorithm, *PUBLIC, *flags, engine="sequential", num_clients=CLIENTS,
                                  **settings), data)


def hand_scores(params: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(mean entropy, mean cross-entropy) of the linear model [W (C×DIM), b] written out sample by sample."""
    w, b = params[: C * DIM].double().view(C, DIM), params[C * DIM:].double()
    entropies, losses = [], []
    for xi, yi in zip(x.double(), y.tolist()):
        z = w @ xi + b
        p = [math.exp(v) / sum(math.exp(u) for u in z.tolist()) for v in z.tolist()]
        entropies.append(-sum(q * math.log(q) for q in p))
        losses.append(-math.log(p[yi]))
    return sum(entropies) / len(entropies), sum(losses) / len(losses)


def test_entropy_and_loss_on_the_public_data_by_hand():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]], dtype=torch.float64)
    entropy, loss = public_scores(logits, torch.tensor([0, 1]))
    # p = (1/2, 1/2) and (3/4, 1/4)
    assert entropy == pytest.approx((math.log(2) + -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))) / 2, abs=1e-12)
    assert loss == pytest.approx((math.log(2) + math.log(4)) / 2, abs=1e-12)


def test_loss_weights_and_group_weights_by_hand():
    # β ∝ m / ℓ^δ: 10 / 0.5² = 40 and 20 / 2² = 5
    assert loss_weights([10, 20], [0.5, 2.0], 2.0) == pytest.approx([40 / 45, 5 / 45])
    assert loss_weights([10, 30], [0.5, 2.0], 0.0) == pytest.approx([0.25, 0.75])  # δ = 0: sample weights
    # α ∝ M (s + 1)^-λ: 30 · 1 and 10 · 3^-0.5
    stale = 10 / math.sqrt(3)
    assert group_weights([30, 10], [0, 2], 0.5) == pytest.approx([30 / (30 + stale), stale / (30 + stale)])


def hand_round(before: torch.Tensor, updates, staleness, x, y, rnd, eth, delta, lam, gamma, halving):
    """The new global model of a Sageflow round, from the uploads, written with loops."""
    groups = {}
    for update, late in zip(updates, staleness):
        entropy, loss = hand_scores(update.params, x, y)
        if entropy < eth:
            groups.setdefault(late, []).append((update.params.double(), update.num_samples, loss))
    if not groups:
        return before.double(), len(updates)
    kept = sum(len(g) for g in groups.values())
    mixed, total = 0, 0.0
    for late, members in groups.items():
        raw = [m / loss**delta for _, m, loss in members]
        average = sum(r / sum(raw) * p for r, (p, _, _) in zip(raw, members))
        weight = sum(m for _, m, _ in members) * (late + 1) ** -lam
        mixed, total = mixed + weight * average, total + weight
    g = gamma * 0.5 ** (rnd // halving)
    return (1 - g) * before.double() + g * mixed / total, len(updates) - kept


def test_rounds_with_stragglers_filtering_and_gamma_halving_by_hand():
    settings = dict(straggler_delay=2, sageflow_delta=2.0, sageflow_lambda=0.5, sageflow_gamma=0.8,
                    sageflow_gamma_halving=2)
    probe = server(sageflow_eth="inf", **settings)
    first = run_round(probe, 0).updates
    entropies = sorted(hand_scores(u.params, probe.public_x, probe.public_y)[0] for u in first)
    eth = (entropies[len(entropies) // 2 - 1] + entropies[len(entropies) // 2]) / 2  # filters about half
    srv = server(sageflow_eth=eth, **settings)
    filtered, stale_rounds = 0, 0
    for rnd in range(4):
        before = srv.global_params.clone()
        result = run_round(srv, rnd)
        late = srv.history.extra_series["staleness"][-1]
        expected, dropped = hand_round(before, result.updates, late, srv.public_x, srv.public_y, rnd, eth,
                                       2.0, 0.5, 0.8, 2)
        assert torch.allclose(srv.global_params.double(), expected, atol=1e-6)
        assert srv.history.extra_series["sageflow_filtered"][-1] == dropped
        filtered += dropped
        stale_rounds += len(set(late)) > 1
    assert filtered > 0 and stale_rounds > 0  # both the filter and the grouping were exercised


def test_without_stragglers_infinite_threshold_and_delta_zero_it_is_fedavg_bit_for_bit():
    """--sageflow_eth inf --sageflow_delta 0, γ = 1 without halving (the defaults), no --straggler_delay."""
    fedavg = server("FedAvg")
    sageflow = server("Sageflow", sageflow_eth="inf", sageflow_delta=0.0)
    for rnd in range(3):
        run_round(fedavg, rnd)
        run_round(sageflow, rnd)
        assert torch.equal(fedavg.global_params, sageflow.global_params)


def test_when_every_upload_is_filtered_the_global_model_stays():
    srv = server(sageflow_eth=1e-9)  # no model is that confident on the public data
    before = srv.global_params.clone()
    result = run_round(srv, 0)
    assert torch.equal(srv.global_params, before)
    assert srv.history.extra_series["sageflow_filtered"] == [len(result.updates)] and result.updates


def test_a_round_that_filters_every_upload_warns_once(caplog):
    srv = server(sageflow_eth=1e-9)
    with caplog.at_level("WARNING", logger="fl"):
        run_round(srv, 0)
        run_round(srv, 1)
    said = [r.getMessage() for r in caplog.records if "filtered out every upload" in r.getMessage()]
    assert len(said) == 1 and "--sageflow_eth" in said[0]


def run(**flags):
    srv = server(straggler_delay=2, attack="sign_flip", attack_fraction=0.34, sageflow_eth=1.09, **flags)
    for rnd in range(4):
        run_round(srv, rnd)
    return srv


def test_runs_are_deterministic_and_record_the_filter():
    a, b = run(), run()
    assert torch.equal(a.global_params, b.global_params)
    assert repr(a.history.extra_series) == repr(b.history.extra_series)  # NaN (nothing filtered) too
    for name in ("sageflow_filtered", "sageflow_precision", "sageflow_recall"):
        assert len(a.history.extra_series[name]) == 4


def test_a_run_with_stragglers_resumes_exactly():
    whole = run()
    first = server(straggler_delay=2, attack="sign_flip", attack_fraction=0.34, sageflow_eth=1.09)
    for rnd in range(2):
        run_round(first, rnd)
    saved = checkpoint.server_state(first, 2)
    resumed = server(straggler_delay=2, attack="sign_flip", attack_fraction=0.34, sageflow_eth=1.09)
    assert checkpoint.load_server_state(resumed, saved) == 2
    for rnd in (2, 3):
        run_round(resumed, rnd)
    assert torch.equal(resumed.global_params, whole.global_params)


def test_without_public_data_it_is_refused_in_one_line(tmp_path, capsys):
    assert "Sageflow needs a public dataset held by the server: pass --public_data" in refusal("Sageflow")
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 8, 8))
    rc = main.main(["-data", str(folder), "--results_dir", str(tmp_path / "res"), "-dev", "cpu", "-gr", "1",
                    "-m", "DNN", "-algo", "Sageflow", "--progress", "False", "-q", "True"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--public_data" in err
    assert not list(tmp_path.rglob("*.h5"))  # nothing half-written

