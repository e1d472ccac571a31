"""Stragglers (flcore/features/stragglers.py), FedAsync and FedBuff: seeded delays, the staleness
functions and the mixing by hand, the reductions to sequential SGD and FedAvg, the buffer across
rounds, exact resume, and bad input."""
from __future__ import annotations

import dataclasses

import h5py
import numpy as np
import pytest
import torch

from fltest import (build_server, linear_grad, make_args, random_dataset, run_main_two_rounds, run_round,
                    two_client_server)
from fltest import one_thread  # noqa: F401  (fixture)
from flcore.features.stragglers import awaited, delay_of
from flcore.servers.serverfedasync import mix_uploads, staleness_weight
from runner import checkpoint
from utils.errors import FLError
from flcore.features import run_summary
from reporting.results import RunHistory, summarize

CLIENTS = 6


def server(algorithm: str = "FedAvg", **flags):
    data = random_dataset(num_clients=CLIENTS, dim=4, num_classes=3, seed=4, sizes=[10] * CLIENTS)
    flags = {"batch_size": 5, "global_rounds": 4, **flags}
    return build_server(make_args(algorithm, engine="sequential", num_clients=CLIENTS, **flags), data)


def test_delays_are_seeded_per_round_and_client_and_late_uploads_arrive_later():
    assert [delay_of(0, 2, 3, c) for c in range(CLIENTS)] == [delay_of(0, 2, 3, c) for c in range(CLIENTS)]
    draws = [delay_of(0, 2, t, c) for t in range(20) for c in range(CLIENTS)]
    assert set(draws) == {0, 1, 2}
    srv = server(straggler_delay=2)
    arrivals = {}
    for rnd in range(4):
        result = srv.run_round(rnd, evaluate=False)
        for update, late in zip(result.updates, srv.history.extra_series["staleness"][-1]):
            arrivals.setdefault(rnd - late, []).append((update.index, rnd))
    for start, got in arrivals.items():  # every upload arrives exactly its drawn delay later
        assert all(rnd == start + delay_of(0, 2, start, index) for index, rnd in got)
    ignoring = server(straggler_delay=2, straggler_policy="ignore")
    kept = ignoring.run_round(0, evaluate=False).updates
    assert [u.index for u in kept] == [c for c in range(CLIENTS) if delay_of(0, 2, 0, c) == 0]


def test_the_staleness_functions_by_hand():
    assert staleness_weight("constant", 5, 0.5, 4) == 1.0
    assert staleness_weight("polynomial", 3, 0.5, 4) == pytest.approx(0.5)  # (3 + 1)^-0.5
    assert staleness_weight("hinge", 4, 0.5, 4) == 1.0
    assert staleness_weight("hinge", 6, 0.5, 4) == pytest.approx(0.5)  # 1 / (0.5 (6 - 4) + 1)


def test_the_paper_staleness_functions_on_a_tiny_vector_by_hand():
    # x0 = (1, 0); three uploads with staleness 0, 2 and 6, α = 0.5
    x0 = torch.tensor([1.0, 0.0])
    uploads = [torch.tensor([3.0, 2.0]), torch.tensor([0.0, 4.0]), torch.tensor([1.0, 1.0])]
    # polynomial a = 0.5: s = 1, 3^-1/2, 7^-1/2
    s = [1.0, 3 ** -0.5, 7 ** -0.5]
    assert [staleness_weight("polynomial", k, 0.5, 4) for k in (0, 2, 6)] == pytest.approx(s)
    x1 = 0.5 * x0 + 0.5 * uploads[0]  # (2, 1)
    assert x1.tolist() == [2.0, 1.0]
    w2 = 0.5 * 3 ** -0.5
    x2 = (1 - w2) * x1 + w2 * uploads[1]  # (2 - 2 w2, 1 + 3 w2)
    w3 = 0.5 * 7 ** -0.5
    x3 = (1 - w3) * x2 + w3 * uploads[2]
    got = mix_uploads(x0, list(zip(uploads, s)), 0.5)
    assert torch.allclose(got, torch.tensor([2 - 2 * w2 - w3 * (1 - 2 * w2), x3[1].item()]))
    assert got[1].item() == pytest.approx((1 + 3 * w2) * (1 - w3) + w3)
    # hinge with the paper's a = 10, b = 4: s = 1, 1 (2 <= b), 1 / (10 (6 - 4) + 1) = 1/21
    hinge = [staleness_weight("hinge", k, 10, 4) for k in (0, 2, 6)]
    assert hinge == pytest.approx([1.0, 1.0, 1 / 21])
    got = mix_uploads(x0, list(zip(uploads, hinge)), 0.5)
    x2 = 0.5 * torch.tensor([2.0, 1.0]) + 0.5 * uploads[1]  # (1, 2.5)
    assert torch.allclose(got, (1 - 0.5 / 21) * x2 + (0.5 / 21) * uploads[2])
    # constant: α itself every time; x0 is not changed in place
    got = mix_uploads(x0, list(zip(uploads, [1.0] * 3)), 0.5)
    assert torch.allclose(got, torch.tensor([0.125 + 0.375 + 0.0 + 0.5, 0.25 + 1.0 + 0.5]))
    assert x0.tolist() == [1.0, 0.0]


def test_an_unset_staleness_a_is_the_paper_value_of_each_function():
    assert server("FedAsync", staleness_fn="polynomial").staleness_a == 0.5
    assert server("FedAsync", staleness_fn="hinge").staleness_a == 10.0
    assert server("FedAsync", staleness_fn="hinge", staleness_a=4).summary()["staleness_a"] == 4.0


def test_the_workers_regularised_step_and_the_mixing_of_a_round_by_hand():
    rho, lr, alpha = 0.5, 0.1, 0.5
    data, srv = two_client_server("FedAsync", "--async_rho", str(rho), "--async_alpha", str(alpha),
                                  "--staleness_fn", "constant", seed=1, local_learning_rate=lr)
    x0 = srv.global_params.double()
    models = []
    for client in data.clients:  # two full-batch steps on f + ρ/2 ||x - x0||^2 from x0
        x, y = client.train_x.double(), client.train_y
        w = x0.clone()
        for _ in range(2):
            w = w - lr * (linear_grad(w, x, y, 2) + rho * (w - x0))
        models.append(w)
    updates = run_round(srv, 0).updates
    for update, want in zip(updates, models):
        assert torch.allclose(update.params.double(), want, atol=1e-6, rtol=0)
    # two fresh uploads mixed one by one: x = (1 - α)^2 x0 + α(1 - α) x_a + α x_b
    want = 0.25 * x0 + 0.25 * models[0] + 0.5 * models[1]
    assert torch.allclose(srv.global_params.double(), want, atol=1e-6, rtol=0)
    # ρ = 0 is plain local SGD: the regulariser changes the upload
    _, plain = two_client_server("FedAsync", "--async_rho", "0", seed=1, local_learning_rate=lr)
    assert not torch.allclose(run_round(plain, 0).updates[0].params.double(), models[0], atol=1e-6)


def test_the_workers_take_fedprox_step_with_rho_and_fedasync_has_no_mu():
    """FedAsync's worker is FedProx's proximal step with ρ as its coefficient; FedProx's -mu is not
    one of FedAsync's flags (given, it is ignored and changes nothing)."""
    from flcore.clients.clientfedasync import FedAsyncClient
    from flcore.clients.clientfedprox import ProximalClient

    assert issubclass(FedAsyncClient, ProximalClient)
    _, srv = two_client_server("FedAsync", "--async_rho", "0.25", seed=1)
    assert srv.clients[0].proximal_coefficient() == 0.25
    assert [f.name for f in dataclasses.fields(srv.clients[0].hp)] == ["async_rho"]
    with_mu = make_args("FedAsync", "-mu", "0.3")
    assert with_mu.ignored_flags == ["-mu"]
    _, other = two_client_server("FedAsync", "--async_rho", "0.25", "-mu", "0.3", seed=1)
    assert torch.equal(run_round(srv, 0).updates[0].params, run_round(other, 0).updates[0].params)


def test_fedasync_with_alpha_one_and_no_staleness_is_sequential_sgd():
    srv = server("FedAsync", async_alpha=1.0, staleness_fn="constant", async_rho=0)
    for rnd, client in enumerate([2, 0, 5]):  # one client a round: the global model is its upload
        before = srv.global_params.clone()
        (update,) = run_round(srv, rnd, cohort=[client]).updates
        assert torch.equal(srv.global_params, update.params) and not torch.equal(before, update.params)


def test_fedasync_mixes_each_upload_by_its_staleness():
    srv = server("FedAsync", straggler_delay=2, async_alpha=0.8, staleness_fn="polynomial", staleness_a=0.5)
    for rnd in range(3):
        model = srv.global_params.clone()
        result = srv.run_round(rnd, evaluate=False)
        for update, late in zip(result.updates, srv.history.extra_series["staleness"][-1]):
            weight = 0.8 * (late + 1) ** -0.5
            model = model * (1 - weight) + update.params * weight
        assert torch.allclose(srv.global_params, model, atol=1e-7)
    assert any(late > 0 for row in srv.history.extra_series["staleness"] for late in row)


def test_fedasync_staleness_in_uploads_counts_the_server_updates_since_the_start_model():
    # no delays: the k-th upload mixed in a round is k - 1 updates stale (Xie et al.'s t)
    srv = server("FedAsync", async_alpha=0.8, staleness_unit="upload")
    model = srv.global_params.clone()
    updates = run_round(srv, 0, cohort=[1, 3, 4]).updates
    for k, update in enumerate(updates):
        weight = 0.8 * (k + 1) ** -0.5
        model = model * (1 - weight) + update.params * weight
    assert torch.allclose(srv.global_params, model, atol=1e-7)
    # with delays: an upload started in round tau is stale by the updates mixed since that round's package
    srv = server("FedAsync", straggler_delay=2, async_alpha=0.8, staleness_unit="upload")
    mixed, version_at = 0, {}
    for rnd in range(4):
        version_at[rnd] = mixed
        model = srv.global_params.clone()
        result = srv.run_round(rnd, evaluate=False)
        for update, late in zip(result.updates, srv.history.extra_series["staleness"][-1]):
            weight = 0.8 * (mixed - version_at[rnd - late] + 1) ** -0.5
            model = model * (1 - weight) + update.params * weight
            mixed += 1
        assert torch.allclose(srv.global_params, model, atol=1e-7)
    rounds = server("FedAsync", straggler_delay=2, async_alpha=0.8)
    for rnd in range(4):
        run_round(rounds, rnd)
    assert not torch.allclose(rounds.global_params, srv.global_params)  # the unit matters


def test_fedbuff_with_the_cohort_as_buffer_and_no_delay_is_fedavg():
    fedavg, fedbuff = server("FedAvg"), server("FedBuff", buffer_size=CLIENTS)
    for rnd in range(2):
        run_round(fedavg, rnd)
        run_round(fedbuff, rnd)
        assert torch.allclose(fedavg.global_params, fedbuff.global_params, atol=1e-6)


def test_fedbuff_steps_once_its_buffer_is_full_and_keeps_the_rest():
    srv = server("FedBuff", buffer_size=4, server_learning_rate=0.5, join_ratio=0.5)  # 3 uploads a round
    start = srv.global_params.clone()
    first = run_round(srv, 0).updates
    assert torch.equal(srv.global_params, start) and srv.buffer_count == 3
    second = run_round(srv, 1).updates
    buffered = sum(u.params - start for u in first) + (second[0].params - start)
    assert torch.allclose(srv.global_params, start + 0.5 * buffered / 4, atol=1e-7)
    # the two uploads left over wait in the buffer, as updates from the model they started from
    assert srv.buffer_count == 2
    assert torch.allclose(srv.buffer_sum, sum(u.params - start for u in second[1:]), atol=1e-7)


@pytest.mark.parametrize("algorithm", ["FedAsync", "FedBuff", "FedAsync-upload"])
def test_an_asynchronous_run_resumes_exactly(algorithm):
    flags = dict(straggler_delay=2, buffer_size=4) if algorithm == "FedBuff" else dict(straggler_delay=2)
    if algorithm == "FedAsync-upload":  # the update count and each round's start version are checkpointed
        algorithm, flags = "FedAsync", {**flags, "staleness_unit": "upload"}
    whole = server(algorithm, **flags)
    for rnd in range(4):
        run_round(whole, rnd)
    first = server(algorithm, **flags)
    for rnd in range(2):
        run_round(first, rnd)
    saved = checkpoint.server_state(first, 2)
    assert first.plugin("stragglers").pending  # uploads in flight are part of the checkpoint
    resumed = server(algorithm, **flags)
    assert checkpoint.load_server_state(resumed, saved) == 2
    for rnd in (2, 3):
        run_round(resumed, rnd)
    assert torch.equal(resumed.global_params, whole.global_params)


# ----------------------------------------------------------------------------- how long the server waits
def test_the_awaited_lateness_by_hand():
    assert awaited([2, 0, 1, 0, 2, 1], [0, 1, 2, 3, 4, 5], 0.5, 0) == 1  # 3 of 6: delays 0, 0, 1
    assert awaited([2, 0, 1], [0, 1, 2], 0.0, 0) is None  # rounds, q = 0: nobody is awaited
    assert awaited([2.5, 0.5, 1.5], [0, 1, 2], 0.0, 1) == 0.5  # the clock: at least the fastest
    assert awaited([2.5, 0.5, 1.5], [0, 1, 2], 1.0, 1) == 2.5  # q = 1: everyone


def test_waiting_for_all_delayed_uploads_is_fedavg_in_longer_rounds():
    plain, waiting = server(), server(straggler_delay=2, straggler_wait=1.0)
    for rnd in range(2):
        before = plain.plugin("clock").now, waiting.plugin("clock").now
        run_round(plain, rnd)
        run_round(waiting, rnd)
        assert torch.equal(plain.global_params, waiting.global_params)
        assert waiting.history.extra_series["staleness"][-1] == [0] * CLIENTS
        periods = 1 + max(delay_of(0, 2, rnd, c) for c in range(CLIENTS))
        plain_round = plain.plugin("clock").now - before[0]
        assert waiting.plugin("clock").now - before[1] == pytest.approx(periods * plain_round)


def test_waiting_for_half_the_delayed_uploads():
    srv = server(straggler_delay=3, straggler_wait=0.5)
    arrivals = {}
    for rnd in range(4):
        result = srv.run_round(rnd, evaluate=False)
        for update, late in zip(result.updates, srv.history.extra_series["staleness"][-1]):
            arrivals.setdefault(rnd - late, []).append((update.index, rnd))
    for start, got in arrivals.items():
        delays = {c: delay_of(0, 3, start, c) for c in range(CLIENTS)}
        waited = sorted((d, c) for c, d in delays.items())[2][0]  # the 3rd fastest of 6
        for index, rnd in got:
            assert rnd == start + max(0, delays[index] - waited)


def clock_server(**flags):
    return server(straggler_clock=True, clock_compute_spread=1.0, clock_link_spread=0.0, **flags)


def test_the_clock_deadline_keeps_the_fastest_uploads_and_ends_the_round_there():
    srv = clock_server(straggler_wait=0.5, straggler_policy="ignore")
    clock = srv.plugin("clock")
    result = srv.run_round(0, evaluate=False)
    seconds = clock.upload_seconds
    deadline = sorted(seconds.values())[2]  # the 3rd fastest of 6
    assert sorted(u.index for u in result.updates) == sorted(c for c, s in seconds.items() if s <= deadline)
    assert len(result.updates) == 3 and clock.now == pytest.approx(clock.round_start + deadline)


def test_late_clock_uploads_arrive_in_the_round_that_ends_after_them():
    srv = clock_server(straggler_wait=0.5)
    clock = srv.plugin("clock")
    due, ends = {}, {-1: 0.0}
    for rnd in range(4):
        result = srv.run_round(rnd, evaluate=False)
        ends[rnd] = clock.now
        for update, stale in zip(result.updates, srv.history.extra_series["staleness"][-1]):
            if stale:  # arrived after the previous round ended, by the end of this one
                assert ends[rnd - 1] < due[(rnd - stale, update.index)] <= ends[rnd]
        for c, s in clock.upload_seconds.items():
            due[(rnd, c)] = clock.round_start + s
    assert any(x > 0 for row in srv.history.extra_series["staleness"] for x in row)


def test_waiting_for_every_clock_upload_changes_nothing_and_runs_are_deterministic():
    plain, waiting = server(), clock_server(straggler_wait=1.0)
    again = clock_server(straggler_wait=0.5)
    other = clock_server(straggler_wait=0.5)
    plain_clock = server(clock_compute_spread=1.0, clock_link_spread=0.0)
    for rnd in range(3):
        for srv in (plain, waiting, again, other, plain_clock):
            run_round(srv, rnd)
        assert torch.equal(plain.global_params, waiting.global_params)
        assert waiting.plugin("clock").now == plain_clock.plugin("clock").now
        assert torch.equal(again.global_params, other.global_params)
    assert again.history.extra_series["staleness"] == other.history.extra_series["staleness"]


@pytest.mark.parametrize("algorithm, flags, message", [
    ("FedAvg", dict(straggler_delay=-1), "--straggler_delay must be >= 0"),
    ("FedAvg", dict(straggler_delay=2, straggler_clock=True), "two models of lateness; give one of them"),
    ("FedAvg", dict(straggler_delay=2, straggler_wait=1.5), "--straggler_wait must be in \\[0, 1\\]"),
    ("FedAvg", dict(straggler_wait=0.5), "on --straggler_delay S or --straggler_clock True, which is not given"),
    ("FedAvg", dict(straggler_policy="ignore"), "on --straggler_delay S or --straggler_clock True, which is not given"),
    ("FedAsync", dict(async_alpha=0.0), "--async_alpha must be in \\(0, 1\\]"),
    ("FedBuff", dict(buffer_size=0), "--buffer_size must be >= 1"),
    ("FedAsync", dict(robust="median"), "FedAsync aggregates its own way"),
])
def test_bad_asynchronous_settings_are_refused_in_one_line(algorithm, flags, message):
    with pytest.raises(FLError, match=message):
        server(algorithm, **flags)


# ----------------------------------------------------------------------------- what the results hold
def test_virtual_time_to_target_and_the_staleness_histogram_by_hand():
    history = RunHistory(eval_rounds=[0, 1, 2, 3], test_acc=[0.1, 0.5, 0.7, 0.9], bytes_up=[5, 5, 5],
                         round_time=[1.0] * 3)
    history.extra_series["virtual_time"] = [2.0, 5.0, 9.0]  # the clock after rounds 0, 1, 2
    history.extra_series["staleness"] = [[0, 0, 1], [2, 0], [float("nan"), 0]]  # NaN: a padded row's end
    summary = run_summary(history, 10, 0.7, model_bytes=5)
    assert summary["rounds_to_target"] == 2 and summary["virtual_time_to_target"] == 5.0
    assert summary["staleness_histogram"] == [4, 1, 1]
    assert run_summary(history, 10, 0.95, model_bytes=5)["virtual_time_to_target"] is None
    assert run_summary(history, 10, 0.05, model_bytes=5)["virtual_time_to_target"] == 0.0  # the untrained model
    # the platform's own summary names neither: the clock and the stragglers give their fields
    assert not {"virtual_time_to_target", "staleness_histogram"} & set(summarize(history, 10, 0.7, model_bytes=5))


def test_an_asynchronous_run_writes_both_into_its_results(tmp_path):
    path = run_main_two_rounds(tmp_path, "FedAsync", "--straggler_delay", "1", "--target_acc", "0")
    with h5py.File(path) as f:
        rows = f["rs_staleness"][()]
        counts = np.bincount(rows[np.isfinite(rows)].astype(int))
        assert f.attrs["staleness_histogram"].tolist() == counts.tolist() and counts.sum() > 0
        assert f.attrs["virtual_time_to_target"] == 0.0


def test_ignored_late_uploads_still_count_as_sent():
    """A server that ignores stragglers throws their uploads away, but they travelled: rs_bytes_up
    counts every upload trained, with either policy (stale ones in the round they arrive)."""
    from flcore.servers.serverbase import record_round

    ignoring = server(straggler_delay=2, straggler_policy="ignore")
    result = ignoring.run_round(0, evaluate=False)
    record_round(ignoring, result)  # the history callback Server.train runs after each round
    size = result.updates[0].nbytes()
    assert len(result.updates) < CLIENTS and ignoring.history.bytes_up[-1] == CLIENTS * size
    assert ignoring.history.clients_per_round[-1] == len(result.updates)
