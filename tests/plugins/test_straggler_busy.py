"""Busy stragglers (``--straggler_busy``) and the official Sageflow delay draw (``--straggler_delays
each``) of flcore/features/stragglers.py: busy rounds against a hand computation, the trimmed and the
restricted cohort, every delay 0..S in a round, the defaults unchanged, exact resume, bad input."""
from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
import torch

import main
from fltest import run_main_two_rounds, run_round
from fltest import one_thread  # noqa: F401  (fixture)
from flcore.features.stragglers import delay_of, round_delays
from flcore.servers.serverbase import record_round
from test_async import CLIENTS, server
from toydata import make_dataset
from runner import checkpoint
from utils.errors import FLError
from utils.seeding import numpy_rng


def trained_rounds_by_hand(most: int, rounds: int, share: float = 0.0) -> dict[int, list[int]]:
    """With every client drawn each round: a client that trains in round t with delay d (d_w: the
    round's awaited delay) trains next in round t + max(0, d − d_w) + 1; the rounds each client trains in."""
    trains = {c: [] for c in range(CLIENTS)}
    next_free = dict.fromkeys(range(CLIENTS), 0)
    for t in range(rounds):
        cohort = [c for c in range(CLIENTS) if next_free[c] <= t]
        delays = {c: delay_of(0, most, t, c) for c in cohort}
        count = math.ceil(share * len(cohort) - 1e-9)
        waited = sorted(delays.values())[count - 1] if count else 0
        for c in cohort:
            trains[c].append(t)
            next_free[c] = t + max(0, delays[c] - waited) + 1
    return trains


@pytest.mark.parametrize("busy", ["skip", "unselectable"])
@pytest.mark.parametrize("flags", [dict(straggler_delay=2), dict(straggler_delay=2, straggler_policy="ignore"),
                                   dict(straggler_delay=3, straggler_wait=0.5)])
def test_a_client_trained_in_t_with_delay_d_sits_out_until_t_plus_d(busy, flags):
    rounds = 7
    srv = server(straggler_busy=busy, **flags)
    trains = {c: [] for c in range(CLIENTS)}
    for rnd in range(rounds):
        for c in srv.run_round(rnd, evaluate=False).cohort:
            trains[c].append(rnd)
    want = trained_rounds_by_hand(flags["straggler_delay"], rounds, flags.get("straggler_wait", 0.0))
    assert trains == want
    assert any(len(rounds_of) < rounds for rounds_of in want.values())  # someone did sit out


def test_skip_trims_the_drawn_cohort_by_its_busy_members_and_says_so():
    srv = server(straggler_delay=2, straggler_busy="skip", join_ratio=0.5)  # 3 of 6 drawn a round
    busy_until: dict[int, int] = {}
    skipped = []
    for rnd in range(8):
        drawn = srv.select_clients(rnd)  # the draw as usual (the uniform policy's is pure)
        result = srv.run_round(rnd, evaluate=False)
        record_round(srv, result)
        free = [c for c in drawn if busy_until.get(c, -1) < rnd]
        assert result.cohort == free and result.package.cohort == free
        skipped.append(len(drawn) - len(free))
        size = result.package.nbytes(0)
        assert srv.history.bytes_down[-1] == len(free) * size  # nothing sent to those who sat out
        for c in free:
            if delay_of(0, 2, rnd, c):
                busy_until[c] = rnd + delay_of(0, 2, rnd, c)
    assert srv.history.extra_series["busy_skipped"] == skipped and sum(skipped) > 0


def test_unselectable_never_draws_a_busy_client_and_fills_the_cohort_from_free_ones():
    srv = server(straggler_delay=2, straggler_busy="unselectable", join_ratio=0.5)
    busy_until: dict[int, int] = {}
    blocked = 0
    for rnd in range(8):
        busy = {c for c, last in busy_until.items() if last >= rnd}
        mask = srv.selectable(rnd)
        assert mask.tolist() == [c not in busy for c in range(CLIENTS)]
        blocked += bool(busy & set(server(straggler_delay=2, join_ratio=0.5).select_clients(rnd)))
        cohort = srv.run_round(rnd, evaluate=False).cohort
        assert not busy & set(cohort) and len(cohort) == min(3, CLIENTS - len(busy))
        for c in cohort:
            if delay_of(0, 2, rnd, c):
                busy_until[c] = rnd + delay_of(0, 2, rnd, c)
    assert blocked  # in some round the usual draw would have picked a busy client
    assert "busy_skipped" not in srv.history.extra_series


def test_the_default_lets_a_busy_client_train_again_and_matches_no_flags_bit_for_bit():
    plain = server(straggler_delay=2)
    explicit = server(straggler_delay=2, straggler_busy="train", straggler_delays="uniform")
    assert plain.plugin("stragglers").summary()["straggler_busy"] == "train"
    for rnd in range(4):
        a, b = run_round(plain, rnd), run_round(explicit, rnd)
        assert a.cohort == b.cohort == list(range(CLIENTS))  # busy or not, all train
        assert torch.equal(plain.global_params, explicit.global_params)
    assert plain.history.extra_series == explicit.history.extra_series
    assert plain.plugin("stragglers").busy_until  # there were busy clients, and they trained


# ----------------------------------------------------------------------------- the official delay draw
def test_each_gives_every_delay_0_to_s_once_to_the_first_trainers_in_the_seeded_order():
    most = 2
    for rnd in range(10):
        trainers = [0, 2, 3, 5]
        delays = round_delays(7, most, rnd, trainers, "each")
        order = numpy_rng(7, "straggler-order", rnd).permutation(len(trainers))
        first = [trainers[int(p)] for p in order[:most + 1]]
        assert [delays[c] for c in first] == [0, 1, 2]
        assert all(delays[c] == delay_of(7, most, rnd, c) for c in trainers if c not in first)
        assert round_delays(7, most, rnd, trainers[::-1], "each") == delays  # not the listing order
    assert sorted(round_delays(7, 3, 0, [1, 4], "each").values()) == [0, 1]  # fewer than S + 1 trainers
    assert round_delays(7, most, 1, [0, 2, 3, 5]) == {c: delay_of(7, most, 1, c) for c in [0, 2, 3, 5]}


def test_each_in_a_run_delays_the_uploads_as_drawn_whatever_the_cohort_size():
    srv = server(straggler_delay=2, straggler_delays="each", straggler_policy="ignore")
    for rnd in range(3):
        delays = round_delays(0, 2, rnd, list(range(CLIENTS)), "each")
        assert set(delays.values()) == {0, 1, 2}
        kept = run_round(srv, rnd).updates  # ignoring stragglers keeps the delay-0 uploads
        assert [u.index for u in kept] == [c for c in range(CLIENTS) if delays[c] == 0]
    stale = server(straggler_delay=2, straggler_delays="each")
    drawn = [round_delays(0, 2, start, list(range(CLIENTS)), "each") for start in range(4)]
    released = 0
    for rnd in range(4):  # each upload is released exactly its drawn delay after its round
        updates = stale.run_round(rnd, evaluate=False).updates
        lateness = stale.history.extra_series["staleness"][-1]
        assert [drawn[rnd - late][u.index] for u, late in zip(updates, lateness)] == lateness
        released += len(updates)
    assert released == sum(start + d <= 3 for start in range(4) for d in drawn[start].values())
    again = server(straggler_delay=2, straggler_delays="each")
    for rnd in range(4):
        run_round(again, rnd)
    assert torch.equal(again.global_params, stale.global_params)


# ----------------------------------------------------------------------------- a round nobody trains in
@pytest.mark.parametrize("policy", ["ignore", "stale"])
def test_a_round_whose_whole_cohort_is_busy_trains_nobody_and_still_evaluates(policy):
    srv = server(straggler_delay=2, straggler_busy="skip", straggler_policy=policy)
    run_round(srv, 0)
    late = [c for c in range(CLIENTS) if delay_of(0, 2, 0, c) > 0]
    before = srv.global_params.clone()
    result = srv.run_round(1, evaluate=True, cohort=late)
    assert result.cohort == [] and result.package.cohort == [] and result.evaluation is not None
    arriving = [c for c in late if delay_of(0, 2, 0, c) == 1]
    assert arriving  # seed 0: some of round 0's uploads are one round late
    if policy == "ignore":
        assert result.updates == [] and torch.equal(srv.global_params, before)
    else:  # the uploads due in this round are still aggregated
        assert [u.index for u in result.updates] == arriving and not torch.equal(srv.global_params, before)
    assert srv.history.extra_series["busy_skipped"][-1] == len(late)


# ----------------------------------------------------------------------------- resume, results, bad input
def test_a_run_with_busy_clients_skipped_resumes_exactly():
    flags = dict(straggler_delay=2, straggler_busy="skip", straggler_delays="each", join_ratio=0.5)
    whole = server(**flags)
    for rnd in range(6):
        run_round(whole, rnd)
    first = server(**flags)
    for rnd in range(3):
        run_round(first, rnd)
    saved = checkpoint.server_state(first, 3)
    assert first.plugin("stragglers").busy_until  # who is busy is part of the checkpoint
    resumed = server(**flags)
    assert checkpoint.load_server_state(resumed, saved) == 3
    for rnd in range(3, 6):
        run_round(resumed, rnd)
    assert torch.equal(resumed.global_params, whole.global_params)
    assert resumed.history.extra_series == whole.history.extra_series


def test_the_official_simulation_writes_how_many_sat_out(tmp_path):
    path = run_main_two_rounds(tmp_path, "FedAvg", "--straggler_delay", "2", "--straggler_busy", "skip",
                               "--straggler_delays", "each")
    with h5py.File(path) as f:
        assert f["rs_busy_skipped"].shape == (2,) and f["rs_busy_skipped"][0] == 0  # nobody is busy in round 0


@pytest.mark.parametrize("flags, message", [
    (["--straggler_delay", "2", "--straggler_busy", "wait"], "--straggler_busy"),
    (["--straggler_delay", "2", "--straggler_delays", "fixed"], "--straggler_delays"),
    (["--straggler_clock", "True", "--straggler_busy", "skip"], "use them with --straggler_delay S"),
    (["--straggler_clock", "True", "--straggler_delays", "each"], "use them with --straggler_delay S"),
    (["--straggler_busy", "unselectable"], "on --straggler_delay S or --straggler_clock True, which is not given"),
])
def test_bad_busy_settings_exit_with_status_2_and_one_line(tmp_path, capsys, flags, message):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 8, 8))
    try:
        rc = main.main(["-data", str(folder), "--results_dir", str(tmp_path / "res"), "-dev", "cpu", "-gr", "1",
                        "-m", "DNN", *flags, "--progress", "False", "-q", "True"])
    except SystemExit as exc:  # argparse's unknown choice
        rc = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0]
    assert not list(tmp_path.rglob("*.h5"))


def test_the_clock_refusal_is_an_flerror_at_start_up():
    with pytest.raises(FLError, match="--straggler_busy and --straggler_delays count rounds"):
        server(straggler_clock=True, straggler_busy="unselectable")
    assert np.all(server(straggler_delay=1, straggler_busy="unselectable").selectable(0))
