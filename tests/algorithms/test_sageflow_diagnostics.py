"""Sageflow's ``--sageflow_diagnostics``: every recorded number of a round with stale and fresh groups
recomputed by hand (the fresh-only model of ignoring stragglers, the steps, the stale groups' weight,
the cosines, both models' test accuracy), and a run with them is the run without them, bit for bit."""
from __future__ import annotations

import math

import pytest
import torch

from fltest import build_server, make_args, random_dataset, run_round
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)

CLIENTS, DIM, C = 6, 4, 3
#: stragglers, sample weights inside the groups (δ = 0), no filter, and a γ < 1 that is halved
SETTINGS = dict(straggler_delay=2, sageflow_eth="inf", sageflow_delta=0.0, sageflow_lambda=0.5, sageflow_gamma=0.8,
                sageflow_gamma_halving=2, batch_size=4, global_rounds=4, local_learning_rate=0.5)
SERIES = ("stale_weight", "step_norm", "fresh_step_norm", "step_along_fresh", "stale_step_norm", "stale_pull_norm",
          "stale_progress_norm", "stale_fresh_cos", "stale_progress_cos", "next_acc", "fresh_only_acc")


def sageflow(diagnostics: bool):
    data = random_dataset(num_clients=CLIENTS, dim=DIM, num_classes=C, seed=4, sizes=[6, 8, 10, 12, 14, 16])
    return build_server(make_args("Sageflow", "--public_data", "0.2", engine="sequential", num_clients=CLIENTS,
                                  sageflow_diagnostics=diagnostics, **SETTINGS), data)


def mean(vectors, weights):
    return sum(w / sum(weights) * v for v, w in zip(vectors, weights))


def accuracy(params: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    """The tiny linear model [W (C×DIM), b] on every test row, written out."""
    w, b = params[: C * DIM].double().view(C, DIM), params[C * DIM:].double()
    return float(((x.double() @ w.T + b).argmax(1) == y).double().mean())


def cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b) / math.sqrt(float(a @ a) * float(b @ b))


def test_each_recorded_number_by_hand():
    srv = sageflow(True)
    x, y = srv.dataset.split("test")
    models = {}  # round -> the global model it started from
    checked, without_fresh = 0, 0
    for rnd in range(4):
        before = models[rnd] = srv.global_params.clone().double()
        updates = run_round(srv, rnd).updates
        late = srv.history.extra_series["staleness"][-1]
        got = {name: srv.history.extra_series["sageflow_" + name][-1] for name in SERIES}
        fresh = [u for u, s in zip(updates, late) if s == 0]
        if not fresh:  # ignoring stragglers would not have moved: no fresh step to compare with
            assert all(math.isnan(got[name]) for name in SERIES if "fresh" in name)
            without_fresh += 1
            continue
        fresh_only = mean([u.params.double() for u in fresh], [u.num_samples for u in fresh])
        groups = {s: [u for u, t in zip(updates, late) if t == s] for s in set(late)}
        raw = {s: sum(u.num_samples for u in g) * (s + 1) ** -0.5 for s, g in groups.items()}  # M_τ (staleness + 1)^-λ
        averages = {s: mean([u.params.double() for u in g], [u.num_samples for u in g]) for s, g in groups.items()}
        stale = [s for s in groups if s > 0]
        step, fresh_step = srv.global_params.double() - before, fresh_only - before
        assert got["stale_weight"] == pytest.approx(sum(raw[s] for s in stale) / sum(raw.values()), abs=1e-12)
        assert got["step_norm"] == pytest.approx(float(step.norm()), rel=1e-6)
        assert got["fresh_step_norm"] == pytest.approx(float(fresh_step.norm()), rel=1e-6)
        assert got["step_along_fresh"] == pytest.approx(float(step @ fresh_step) / float(fresh_step @ fresh_step), rel=1e-5)
        assert got["next_acc"] == pytest.approx(accuracy(srv.global_params, x, y), abs=1e-12)
        assert got["fresh_only_acc"] == pytest.approx(accuracy(fresh_only, x, y), abs=1e-12)
        if not stale:
            assert all(math.isnan(got[name]) for name in SERIES if name.startswith("stale_") and name != "stale_weight")
            continue
        share = [raw[s] for s in stale]
        pull = mean([models[rnd - s] - before for s in stale], share)
        progress = mean([averages[s] - models[rnd - s] for s in stale], share)
        stale_mix = mean([averages[s] for s in stale], share)
        assert torch.allclose(pull + progress, stale_mix - before, atol=1e-6)
        assert got["stale_step_norm"] == pytest.approx(float((stale_mix - before).norm()), rel=1e-6)
        assert got["stale_pull_norm"] == pytest.approx(float(pull.norm()), rel=1e-6, abs=1e-9)
        assert got["stale_progress_norm"] == pytest.approx(float(progress.norm()), rel=1e-6)
        assert got["stale_fresh_cos"] == pytest.approx(cos(stale_mix - before, fresh_step), abs=1e-6)
        assert got["stale_progress_cos"] == pytest.approx(cos(progress, fresh_step), abs=1e-6)
        checked += float(pull.norm()) > 0  # a group started from an older model than this round's
    assert checked >= 1 and without_fresh >= 1  # both kinds of round were exercised


def test_a_run_with_diagnostics_is_the_run_without_bit_for_bit():
    plain, diagnosed = sageflow(False), sageflow(True)
    plain.train(progress=False)
    after_plain = torch.get_rng_state()
    diagnosed.train(progress=False)
    assert torch.equal(torch.get_rng_state(), after_plain)
    assert torch.equal(plain.global_params, diagnosed.global_params)
    assert plain.history.test_acc == diagnosed.history.test_acc
    extra = diagnosed.history.extra_series
    assert repr({k: v for k, v in extra.items() if k not in {"sageflow_" + n for n in SERIES}}) == repr(
        plain.history.extra_series)
    assert all(len(extra["sageflow_" + name]) == 4 for name in SERIES)
    assert not any(name.startswith("sageflow_") and name != "sageflow_filtered" for name in plain.history.extra_series)
