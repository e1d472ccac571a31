"""The virtual clock (flcore/features/clock.py): round durations by hand, -tsr/-ssr, -ts/-tth, availability,
determinism, and runs without clock flags training exactly as before."""
from __future__ import annotations

import argparse
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import main
from fltest import build_server, make_args, one_thread, random_dataset, run_main_two_rounds  # noqa: F401
from flcore.features.clock import drawn_profiles
from utils.errors import FLError

#: TinyLinear(2, 2): a 2x2 weight and 2 biases, float32, so every package and upload is 24 bytes
MODEL_BYTES = (2 * 2 + 2) * 4
SIZES = [4, 6, 8]  # with batch 2 and one epoch, the clients process 4, 6 and 8 samples

# client 0: 24 B down at 24 B/s (1 s) + 4 samples at 2/s (2 s) + 24 B up (1 s)   = 4 s
# client 1: 24 B at 12 B/s (2 s)      + 6 samples at 3/s (2 s) + 24 B at 12 (2 s) = 6 s
# client 2: 24 B at 48 B/s (0.5 s)    + 8 samples at 8/s (1 s) + 24 B at 8 (3 s)  = 4.5 s
TRACE = """client,samples_per_s,bytes_per_s,down_bytes_per_s,up_bytes_per_s
0,2,24,,
1,3,12,,
2,8,,48,8
"""
HAND = [4.0, 6.0, 4.5]


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def clock_server(trace: Path | None, *extra: str, sizes=SIZES, **flags):
    data = random_dataset(num_clients=len(sizes), dim=2, num_classes=2, sizes=sizes, seed=3)
    settings = dict(batch_size=2, local_epochs=1, global_rounds=2, eval_auc=False, eval_train_loss=False)
    if trace is not None:
        settings["client_trace"] = str(trace)
    settings.update(flags)
    return build_server(make_args("FedAvg", *extra, **settings), data)


def train_recording_cohorts(server) -> list[list[int]]:
    cohorts: list[list[int]] = []
    server.train(progress=False, callbacks=[lambda s, r: cohorts.append(r.cohort) if r.trained else None])
    return cohorts


# ------------------------------------------------------------------------ durations by hand
def test_round_duration_is_the_slowest_clients_download_compute_and_upload(tmp_path):
    server = clock_server(write(tmp_path, TRACE))
    assert server.model.vector.numel() * 4 == MODEL_BYTES
    history = server.train(progress=False)
    assert history.extra_series["virtual_round_time"] == pytest.approx([max(HAND)] * 2, rel=1e-12)
    assert history.extra_series["virtual_time"] == pytest.approx([6.0, 12.0], rel=1e-12)
    assert server.virtual_time == pytest.approx(12.0)
    clock = server.plugin("clock")
    for client, seconds in zip(server.clients, HAND):
        i = client.index
        assert clock.client_rounds[i] == 2 and clock.client_seconds[i] == pytest.approx(2 * seconds)


def test_the_clock_counts_the_samples_really_processed(tmp_path):
    """A partial last batch (drop_last False) counts its own samples: 5 samples in batches 2, 2, 1."""
    server = clock_server(write(tmp_path, TRACE), sizes=[5, 6, 8], drop_last=False)
    result = server.run_round(0, evaluate=False)
    assert [u.samples_processed for u in result.updates] == [5, 6, 8]
    assert server.plugin("clock").client_seconds[0] == pytest.approx(1 + 5 / 2 + 1)


@pytest.mark.parametrize("algorithm, flags, passes", [
    ("FedAvg", ("--engine", "batched"), 1),  # trained vectorised: charged its plan
    ("FedAvg", ("--engine", "threaded"), 1),
    ("Ditto", ("-pls", "2", "-mu", "0.1"), 3),  # 2 personal epochs + 1 global epoch
    ("APFL", (), 2),  # the local model's gradient and the mixed model's, every step
    ("pFedMe", ("-K", "3"), 3),  # K inner steps per minibatch
])
def test_extra_passes_of_an_algorithm_are_charged_as_work(algorithm, flags, passes):
    data = random_dataset(num_clients=3, dim=2, num_classes=2, sizes=SIZES, seed=3)
    args = make_args(algorithm, *flags, batch_size=2, local_epochs=1, global_rounds=1, eval_auc=False,
                     eval_train_loss=False, clock_compute_speed=10)
    server = build_server(args, data)
    result = server.run_round(0, evaluate=False)
    assert [u.samples_processed for u in result.updates] == [passes * n for n in SIZES]
    # the count restarts every round
    assert [u.samples_processed for u in server.run_round(1, evaluate=False).updates] == [passes * n for n in SIZES]
    # -ts predicts the same work before the round
    assert [c.expected_gradient_samples() for c in server.clients] == [passes * n for n in SIZES]


def test_fedala_weight_learning_is_charged_on_top_of_its_plan():
    data = random_dataset(num_clients=3, dim=2, num_classes=2, sizes=SIZES, seed=3)
    args = make_args("FedALA", "-et", "1", "-s", "50", batch_size=2, local_epochs=1, global_rounds=2,
                     eval_auc=False, eval_train_loss=False)
    server = build_server(args, data)
    first = [u.samples_processed for u in server.run_round(0, evaluate=False).updates]
    assert first == SIZES  # no local model yet: no weights to learn
    later = [u.samples_processed for u in server.run_round(1, evaluate=False).updates]
    assert all(n > plan for n, plan in zip(later, SIZES)), later


def seconds_of_all(server) -> list[float]:
    """Every client's virtual seconds so far (0 for one that has not trained)."""
    return [server.plugin("clock").client_seconds.get(i, 0.0) for i in range(len(server.clients))]


def test_slow_trainers_compute_slower_and_for_fewer_epochs(tmp_path):
    factor, epochs = 4.0, 4
    server = clock_server(write(tmp_path, TRACE), train_slow_rate=1, local_epochs=epochs,
                          clock_train_slow_factor=factor)
    result = server.run_round(0, evaluate=False)
    expected = []
    for client, (down_s, speed, up_s) in zip(server.clients, [(1, 2, 1), (2, 3, 2), (0.5, 8, 3)]):
        done = client.epochs_this_round(0)
        assert 1 <= done <= epochs // 2  # PFLlib's straggler: fewer epochs ...
        expected.append(down_s + done * client.num_train / (speed / factor) + up_s)  # ... each slower
    assert seconds_of_all(server) == pytest.approx(expected, rel=1e-12)
    assert result.virtual_seconds == pytest.approx(max(expected), rel=1e-12)


def test_slow_senders_have_slower_links_both_ways(tmp_path):
    factor = 3.0
    server = clock_server(write(tmp_path, TRACE), send_slow_rate=1, clock_send_slow_factor=factor)
    server.run_round(0, evaluate=False)
    transfers, compute = [(1, 1), (2, 2), (0.5, 3)], [2, 2, 1]
    expected = [factor * (down + up) + work for (down, up), work in zip(transfers, compute)]
    assert seconds_of_all(server) == pytest.approx(expected, rel=1e-12)
    # -ssr marks round(rate · N) clients, drawn from the seed
    some = clock_server(write(tmp_path, TRACE), send_slow_rate=0.34).plugin("clock")
    assert sum(some.send_slow) == 1 and not any(some.train_slow)


def test_a_dropped_out_client_is_waited_for_until_its_upload_should_begin(tmp_path):
    server = clock_server(write(tmp_path, TRACE), join_ratio=1.0)
    server.plugin("clock").drop_uploads = lambda rnd, updates: [u for u in updates if u.index != 1]  # client 1 drops out
    result = server.run_round(0, evaluate=False)
    assert [u.index for u in result.updates] == [0, 2]
    assert result.virtual_seconds == pytest.approx(max(4.0, 4.5, 2 + 2))  # client 1: download + compute


# ------------------------------------------------------------------------------ -ts and -tth
@pytest.mark.parametrize("threshold,fast", [(5.0, [0, 2]), (4.5, [0, 2]), (4.4, [0]), (6.0, [0, 1, 2])])
def test_time_select_picks_exactly_the_clients_predicted_under_the_threshold(tmp_path, threshold, fast):
    server = clock_server(write(tmp_path, TRACE), "-ts", "True", time_threthold=threshold, global_rounds=3)
    # the prediction: the model down and up and E full epochs, from the trace's speeds
    assert server.plugin("clock").predicted == pytest.approx(HAND, rel=1e-12)
    assert train_recording_cohorts(server) == [fast] * 3


def test_time_select_composes_with_a_sampled_cohort_and_with_adafl(tmp_path):
    trace = write(tmp_path, TRACE)
    uniform = clock_server(trace, "-ts", "True", time_threthold=5, join_ratio=0.34, global_rounds=12)
    adafl = clock_server(trace, "-ts", "True", "--select", "adafl", time_threthold=5, global_rounds=12,
                         adafl_frac_start=0.34, adafl_frac_end=0.34, adafl_num_fracs=1)
    for server in (uniform, adafl):
        cohorts = train_recording_cohorts(server)
        assert all(len(c) == 1 and c[0] in (0, 2) for c in cohorts)
        assert {c[0] for c in cohorts} == {0, 2}, "both fast clients are drawn over 12 rounds"


def test_time_select_with_no_client_fast_enough_is_one_line(tmp_path):
    with pytest.raises(FLError, match=r"-ts: no client's predicted round time is at most -tth 3 .*fastest needs 4"):
        clock_server(write(tmp_path, TRACE), "-ts", "True", time_threthold=3)


def test_time_threshold_drops_uploads_whose_mean_time_exceeds_it_after_waiting_for_them(tmp_path):
    """PFLlib's receive_models: the mean time cost decides, and the server has waited for the upload."""
    server = clock_server(write(tmp_path, TRACE), time_threthold=5.0, global_rounds=3)
    history = server.train(progress=False)
    assert history.clients_per_round == [2, 2, 2]  # client 1 (6 s a round) is always dropped
    assert history.extra_series["virtual_round_time"] == pytest.approx([6.0] * 3)
    # the aggregate is the sample-weighted mean of clients 0 and 2 only
    again = clock_server(write(tmp_path, TRACE), time_threthold=5.0)
    result = again.run_round(0, evaluate=False)
    kept = {u.index: u.params for u in result.updates}
    assert sorted(kept) == [0, 2]
    assert torch.allclose(again.global_params, (4 * kept[0] + 8 * kept[2]) / 12)


def test_the_default_threshold_alone_drops_nothing(tmp_path):
    slow = "client,samples_per_s,bytes_per_s\n0,1e-4,1\n1,1e-4,1\n2,1e-4,1\n"  # hours per round
    server = clock_server(write(tmp_path, slow))
    history = server.train(progress=False)
    assert history.clients_per_round == [3, 3] and history.extra_series["virtual_round_time"][0] > 10000


# ---------------------------------------------------------------------------- availability
def test_only_clients_available_at_the_round_start_are_selected(tmp_path):
    # client 0 always; client 1 until t = 1 and from t = 100; client 2 while t mod 10 < 5
    trace = TRACE.replace("up_bytes_per_s\n", "up_bytes_per_s,available,period,duty,offset\n")
    trace = trace.replace("0,2,24,,\n", "0,2,24,,,,,,\n").replace("1,3,12,,\n", "1,3,12,,,0-1;100-inf,,,\n")
    trace = trace.replace("2,8,,48,8\n", "2,8,,48,8,,10,0.5,0\n")
    server = clock_server(write(tmp_path, trace), global_rounds=4)
    cohorts = train_recording_cohorts(server)
    # starts: 0 (all; 6 s) -> 6 (client 0; 4 s) -> 10 (0 and 2; 4.5 s) -> 14.5 (0 and 2; 4.5 s) -> 19
    assert cohorts == [[0, 1, 2], [0], [0, 2], [0, 2]]
    assert server.history.extra_series["virtual_time"] == pytest.approx([6, 10, 14.5, 19])


def test_the_server_waits_for_the_next_window_and_stops_when_none_is_left(tmp_path):
    trace = TRACE.replace("up_bytes_per_s\n", "up_bytes_per_s,available\n")
    trace = "\n".join(line + ',"0-1;50-60"' if line[:1].isdigit() else line for line in trace.splitlines()) + "\n"
    server = clock_server(write(tmp_path, trace), global_rounds=3)
    history = server.train(progress=False)
    # round 0 at 0 (6 s); at 6 nobody is available: wait until 50, train 6 s; round 2 at 56
    assert history.extra_series["virtual_time"] == pytest.approx([6, 56, 62])
    assert history.extra_series["virtual_round_time"] == pytest.approx([6, 50, 6])
    with pytest.raises(FLError, match="no client is available at or after virtual time 62"):
        server.run_round(3, evaluate=False)


def test_seeded_duty_cycles_make_clients_unavailable_part_of_the_time():
    server = clock_server(None, global_rounds=8, clock_avail_period=1.0, clock_avail_duty=0.5, join_ratio=1.0)
    profiles = server.plugin("clock").profiles
    assert 0 <= profiles.offset.min() and profiles.offset.max() < 1.0 and len(set(profiles.offset)) == 3
    at_selection = []
    select = server.select_clients
    server.select_clients = lambda rnd: (at_selection.append(server.virtual_time), select(rnd))[1]
    cohorts = train_recording_cohorts(server)
    for cohort, t in zip(cohorts, at_selection):
        available = np.flatnonzero(profiles.available(t)).tolist()
        assert cohort == available and available, (t, cohort)
        for i in range(3):  # client i is available while (t + offset_i) mod 1 < 0.5
            assert (i in cohort) == (((t + profiles.offset[i]) % 1.0) < 0.5)
    assert any(len(c) < 3 for c in cohorts), "half-time availability must leave someone out"


# ------------------------------------------------------------------- determinism, no change
def test_drawn_speeds_depend_on_the_seed_and_client_only():
    args = make_args("FedAvg", clock_compute_speed=50, clock_compute_spread=0.7, clock_link_spread=0.3)
    a, b = drawn_profiles(args, range(3)), drawn_profiles(args, range(2000))
    assert np.array_equal(a.compute, b.compute[:3]) and np.array_equal(a.down, b.down[:3])
    # log-normal: median at the flag, sigma of the log at the spread
    assert np.median(b.compute) == pytest.approx(50, rel=0.05)
    assert np.log(b.compute).std() == pytest.approx(0.7, rel=0.05)
    assert np.log(b.down).std() == pytest.approx(0.3, rel=0.05)
    other = drawn_profiles(argparse.Namespace(**{**vars(args), "seed": 1}), range(3))
    assert not np.array_equal(a.compute, other.compute)


def test_speeds_are_drawn_when_a_round_first_needs_them_with_the_values_a_full_draw_gives(monkeypatch):
    import flcore.features.clock as clock_module
    drawn: list[int] = []
    real = clock_module.drawn_speeds
    monkeypatch.setattr(clock_module, "drawn_speeds", lambda args, cids: (drawn.extend(cids), real(args, cids))[1])
    flags = dict(sizes=[4, 6, 8, 10, 12], join_ratio=0.4, train_slow_rate=0.4, send_slow_rate=0.4, local_epochs=2)
    server = clock_server(None, **flags)
    clock = server.plugin("clock")
    assert drawn == [], "building the clock draws no client's speeds"
    result = server.run_round(0, evaluate=False)
    assert sorted(drawn) == sorted(result.cohort) and len(drawn) == 2
    full = drawn_profiles(server.args, range(5))  # every client at once, the slow factors applied by hand
    for i in range(5):
        compute = full.compute[i] / (10.0 if clock.train_slow[i] else 1.0)
        links = 10.0 if clock.send_slow[i] else 1.0
        assert clock.speeds_of(i) == (compute, full.down[i] / links, full.up[i] / links)
    assert np.array_equal(clock.profiles.compute, full.compute)
    # and the round's times equal those of a clock that drew every client up front (-ts draws them all)
    eager = clock_server(None, "-ts", "True", time_threthold=1e9, **flags)
    eager.run_round(0, evaluate=False)
    assert eager.plugin("clock").client_seconds == clock.client_seconds


def test_virtual_times_do_not_depend_on_the_engine():
    runs = {}
    for engine in ("sequential", "threaded"):
        server = clock_server(None, engine=engine, train_slow_rate=0.5, send_slow_rate=0.5, local_epochs=4,
                              join_ratio=0.67, global_rounds=3, client_drop_rate=0.3, sizes=[4, 6, 8, 10])
        runs[engine] = server.train(progress=False).extra_series
    assert runs["sequential"]["virtual_time"] == runs["threaded"]["virtual_time"]


def test_runs_without_clock_flags_train_exactly_as_with_other_speeds(tmp_path):
    """The clock only observes unless -ts, -tth, availability or a dropping flag asks otherwise."""
    plain = clock_server(None, join_ratio=0.67, client_drop_rate=0.3, global_rounds=4)
    assert plain.selectable(0) is None
    timed = clock_server(write(tmp_path, TRACE), join_ratio=0.67, client_drop_rate=0.3, global_rounds=4,
                         clock_compute_speed=7)
    a, b = plain.train(progress=False), timed.train(progress=False)
    assert a.test_acc == b.test_acc and a.clients_per_round == b.clients_per_round
    assert torch.equal(plain.global_params, timed.global_params)
    assert a.extra_series["virtual_time"] != b.extra_series["virtual_time"]


# ------------------------------------------------------------------------- the command line
def test_results_file_holds_the_virtual_time(tmp_path):
    path = run_main_two_rounds(tmp_path, "FedAvg", "-ssr", "0.5", "-ts", "True", "-tth", "1e6")
    with h5py.File(path) as f:
        times = f["rs_virtual_time"][()]
        assert times.shape == (2,) and np.all(np.diff(times) > 0)
        assert np.allclose(np.cumsum(f["rs_virtual_round_time"][()]), times)


@pytest.mark.parametrize("text,needle", [
    ("client,samples_per_s,bytes_per_s\n0,fast,1\n", "line 2 column samples_per_s: 'fast' is not a number"),
    ("client,samples,bytes_per_s\n", "line 1 column samples: unknown column"),
    ("client,samples_per_s,bytes_per_s\n0,1,-5\n", "line 2 column bytes_per_s: '-5' must be > 0"),
    ("client,samples_per_s,bytes_per_s,available\n0,1,1,5-2\n", "line 2 column available: window '5-2'"),
    ("client,samples_per_s,bytes_per_s\n0,1,1\n0,1,1\n", "line 3 column client: client 0 already given on line 2"),
    ("client,samples_per_s,bytes_per_s\n0,1,1\n", "no row for client(s) 1, 2, 3"),
    ("client,samples_per_s,bytes_per_s,period,duty\n0,1,1,10,1.5\n", "line 2 column duty: '1.5' must be in (0, 1]"),
    ("client,samples_per_s,bytes_per_s,period\n0,1,1,5\n1,1,1,\n2,1,1,\n3,2,1,0-9\n", "line 5 column period: '0-9' is not"),
    (b"\xff\xfe\x00client", "cannot read it as UTF-8 text"),
])
def test_a_bad_trace_is_one_line_naming_file_line_and_column(tmp_path, capsys, text, needle):
    trace = tmp_path / "bad.csv"
    trace.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(AssertionError, match="main exited with 2"):
        run_main_two_rounds(tmp_path, "FedAvg", "--client_trace", str(trace))
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--client_trace {trace}" in err and needle in err, err
    assert not list(tmp_path.rglob("*.h5"))


@pytest.mark.parametrize("flags,needle", [
    (["-ssr", "1.5"], "-ssr must be in [0, 1]"),
    (["-tth", "0"], "-tth must be a finite number > 0"),
    (["--clock_avail_duty", "0"], "--clock_avail_duty must be in (0, 1]"),
    (["--clock_train_slow_factor", "0.5"], "--clock_train_slow_factor must be a finite number >= 1"),
    (["--clock_link_spread", "-1"], "--clock_link_spread must be a finite number >= 0"),
    (["--client_trace", "/no/such/trace.csv"], "--client_trace /no/such/trace.csv: no such file"),
])
def test_bad_clock_flags_are_one_line(flags, needle, capsys):
    assert main.main(["-dev", "cpu", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_resume_continues_the_virtual_clock_exactly(tmp_path, monkeypatch):
    """What persists across rounds (the clock's virtual time, the clients' time costs for -tth) is in the
    checkpoint; the speeds and windows are rebuilt from the flags and the trace."""
    from flcore.servers.serverbase import Server
    from toydata import make_dataset

    folder = make_dataset(tmp_path, num_clients=4, input_shape=(1, 8, 8))
    trace = write(tmp_path, "client,samples_per_s,bytes_per_s,available\n0,50,4e4,\n1,20,1e4,0-2;5-inf\n"
                            "2,90,2e4,0-1;3-inf\n3,40,8e3,\n")

    def run(results, *extra):
        return main.main(["-data", str(folder), "--results_dir", str(results), "-dev", "cpu", "-gr", "5", "-m", "DNN",
                          "-jr", "0.5", "-tsr", "0.5", "-ls", "2", "-ssr", "0.25", "-tth", "2", "--client_trace",
                          str(trace), "--progress", "False", "-q", "True", *extra])

    costs = []  # every finished run's per-client time costs, taken when the server closes
    close = Server.close
    monkeypatch.setattr(Server, "close", lambda self: (costs.append(
        (sorted(self.plugin("clock").client_seconds.items()), sorted(self.plugin("clock").client_rounds.items()))),
        close(self))[1])
    assert run(tmp_path / "ref") == 0
    original = Server.run_round

    def crash_in_round_3(self, rnd, *args, **kwargs):
        if rnd == 3:
            raise RuntimeError("simulated crash")
        return original(self, rnd, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(Server, "run_round", crash_in_round_3)
        with pytest.raises(RuntimeError):
            run(tmp_path / "res", "--checkpoint_every", "1")
    assert run(tmp_path / "res", "--checkpoint_every", "1", "--resume") == 0
    assert costs[-1] == costs[0] and sum(rounds for _, rounds in costs[0][1]) == 10  # 5 rounds of 2 clients
    (reference,), (resumed,) = (list((tmp_path / d).glob("*.h5")) for d in ("ref", "res"))
    with h5py.File(reference) as a, h5py.File(resumed) as b:
        for key in ("rs_virtual_time", "rs_virtual_round_time", "rs_clients_per_round", "rs_test_acc"):
            np.testing.assert_array_equal(a[key][()], b[key][()], err_msg=key)
        assert a["rs_clients_per_round"][()].min() < 2, "-tth must drop some upload in this set-up"


def test_a_checkpoint_of_time_costs_over_every_client_is_read_as_those_of_the_clients_that_trained():
    clock = clock_server(None, sizes=[4, 6, 8]).plugin("clock")
    clock.load_state_dict({"now": 3.5, "client_seconds": np.array([0.0, 2.5, 0.0]),
                           "client_rounds": np.array([0, 1, 0])})
    assert (clock.now, clock.client_seconds, clock.client_rounds) == (3.5, {1: 2.5}, {1: 1})
