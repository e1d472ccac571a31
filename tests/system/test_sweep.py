"""sweep.py: grid and list expansion, one-line input errors, parallel runs equal to serial ones,
skipping finished runs, and failed runs reported without stopping the sweep.

The expansion tests run nothing. The others start real ``main.py`` processes (about 3 s each on
an idle 2-core machine), on a 4-client 8x8 dataset for 2 rounds: a list (``--zip``) of three
settings, two that train (DNN) and one that fails (the CNN does not fit 8x8 inputs)."""
from __future__ import annotations

import contextlib
import io
import shutil

import h5py
import numpy as np
import pytest

import sweep
from toydata import make_dataset
from utils.errors import FLError


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("data"), num_clients=4, input_shape=(1, 8, 8))


def planned(*argv):
    return sweep.plan(list(argv))[1]


def test_grid_crosses_axes_and_applies_a_flag_only_where_declared(toy, tmp_path):
    jobs = planned("-data", str(toy), "-algo", "FedACS", "Local", "--grid", "fedacs_p=0.1,0.5",
                   "-lr", "0.01,0.05", "-t", "2", "--results_dir", str(tmp_path), "--threads", "1")
    fedacs = [j for j in jobs if j.algorithm == "FedACS"]
    local = [j for j in jobs if j.algorithm == "Local"]
    assert len(fedacs) == 2 * 2 * 2 and len(local) == 2 * 2  # Local has no --fedacs_p: 2 settings, not 4
    assert {j.label for j in fedacs} == {f"lr={lr} fedacs_p={p}" for lr in (0.01, 0.05) for p in (0.1, 0.5)}
    assert {j.label for j in local} == {"lr=0.01", "lr=0.05"}
    assert all("--fedacs_p" not in j.argv for j in local)
    assert len({j.path for j in jobs}) == len(jobs)  # every run has its own file
    job = next(j for j in fedacs if j.run == 1 and j.label == "lr=0.05 fedacs_p=0.1")
    assert job.path == tmp_path / "Toy_FedACS_sweep-lr=0.05-fedacs_p=0.1_1.h5"
    assert job.argv[-4:] == ["-pv", "1", "-t", "2"]  # repeat 1 alone: seed + 1, file _1
    assert job.argv[job.argv.index("--num_threads") + 1] == "1"
    assert job.settings["local_learning_rate"] == 0.05 and job.settings["fedacs_p"] == 0.1
    assert all(j.state == "todo" for j in jobs)


def test_zip_pairs_axes_and_equal_values_are_one_setting(toy, tmp_path):
    common = ("-data", str(toy), "--results_dir", str(tmp_path))
    jobs = planned(*common, "--zip", "-lr", "0.01,0.05", "-ls", "1,2")
    assert [(j.settings["local_learning_rate"], j.settings["local_epochs"]) for j in jobs] == [(0.01, 1), (0.05, 2)]
    assert len(planned(*common, "-lr", "0.01,0.05", "-ls", "1,2")) == 4
    assert len(planned(*common, "-lr", "0.10,0.1")) == 1  # parsed values name the setting
    with pytest.raises(FLError, match="same number of values"):
        planned(*common, "--zip", "-lr", "0.01,0.05", "-ls", "1,2,3")
    # A device list is one value, not an axis.
    assert [j.settings["device_id"] for j in planned(*common, "-did", "0,1")] == ["0,1"]


@pytest.mark.parametrize("argv, message", [
    (["--grid", "no_such_flag=1,2"], "no_such_flag: not a flag that FedAvg use(s)"),
    (["-mu", "0.1,0.5"], "-mu: not a flag that FedAvg use(s); main.py would ignore it"),  # PFLlib's, ignored
    (["-lr", "0.1,abc"], "FedAvg -lr=abc: main.py: error: argument -lr"),
    (["-pv", "1"], "the sweep sets it"),
    (["-lr", "0.1", "0.2"], "separate a sweep's values with commas"),
    (["--jobs", "0"], "must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_2(toy, tmp_path, capsys, argv, message):
    assert sweep.main_cli(["-data", str(toy), "--results_dir", str(tmp_path), *argv]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("sweep.py: error:") and message in err
    assert not list(tmp_path.iterdir())


def sweep_argv(toy, results, jobs):
    return ["-data", str(toy), "--zip", "-m", "DNN,DNN,CNN", "-lr", "0.01,0.05,0.01", "-gr", "2",
            "--results_dir", str(results), "--jobs", str(jobs), "--threads", "1"]


def datasets(path):
    with h5py.File(path) as f:
        return {key: f[key][()] for key in ("rs_test_acc", "rs_test_auc", "rs_train_loss", "rs_client_acc")}


@pytest.fixture(scope="module")
def swept(toy, tmp_path_factory):
    """The same sweep run serially and 3 jobs at a time: (results folders, exit codes, outputs)."""
    folders, codes, outputs = {}, {}, {}
    for jobs in (1, 3):
        folders[jobs] = tmp_path_factory.mktemp(f"jobs{jobs}")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            codes[jobs] = sweep.main_cli(sweep_argv(toy, folders[jobs], jobs))
        outputs[jobs] = printed.getvalue()
    return folders, codes, outputs


def test_parallel_runs_write_the_serial_files_and_failures_do_not_stop_the_sweep(swept):
    folders, codes, outputs = swept
    names = ["Toy_FedAvg_sweep-m=DNN-lr=0.01_0.h5", "Toy_FedAvg_sweep-m=DNN-lr=0.05_0.h5"]
    for jobs in (1, 3):
        assert codes[jobs] == 1  # some runs failed
        assert sorted(p.name for p in folders[jobs].glob("*.h5")) == names
        assert outputs[jobs].count("FAILED FedAvg m=CNN lr=0.01 run 0") == 1
        assert "does not fit dataset" in outputs[jobs] and "1 run(s) failed" in outputs[jobs]
        assert [p.name for p in (folders[jobs] / "sweep-logs").glob("*.log")] == ["Toy_FedAvg_sweep-m=CNN-lr=0.01_0.log"]
        # plot.py's summary of the settings that trained, and the best of them.
        rows = [line.split() for line in outputs[jobs].splitlines() if line.startswith("FedAvg m=DNN")]
        assert len(rows) == 3 and all(row[3] == "1" for row in rows)  # 2 settings + the best, 1 run each
    for name in names:
        serial, parallel = datasets(folders[1] / name), datasets(folders[3] / name)
        for key in serial:
            assert np.array_equal(serial[key], parallel[key]), (name, key)
    assert not np.array_equal(datasets(folders[1] / names[0])["rs_client_acc"],
                              datasets(folders[1] / names[1])["rs_client_acc"])  # the settings differ


def test_a_rerun_skips_finished_runs_and_redoes_missing_ones(toy, swept, capsys):
    folders, _, _ = swept
    kept, removed = (folders[3] / f"Toy_FedAvg_sweep-m=DNN-lr={lr}_0.h5" for lr in (0.01, 0.05))
    before = kept.stat().st_mtime_ns
    removed.unlink()
    assert sweep.main_cli(sweep_argv(toy, folders[3], 2)) == 1  # the CNN still fails
    out = capsys.readouterr().out
    assert "3 runs: 1 done earlier, 2 to run" in out
    assert kept.stat().st_mtime_ns == before
    assert all(np.array_equal(a, b) for a, b in zip(datasets(removed).values(),
                                                     datasets(folders[1] / removed.name).values()))


def test_a_stored_run_with_other_settings_is_a_conflict_not_a_skip(toy, swept):
    folders, _, _ = swept
    argv = sweep_argv(toy, folders[1], 1)
    argv[argv.index("-gr") + 1] = "3"
    states = {j.path.name: j.state for j in planned(*argv)}
    assert states["Toy_FedAvg_sweep-m=CNN-lr=0.01_0.h5"] == "todo"
    assert "made with global_rounds=2, this job has 3" in states["Toy_FedAvg_sweep-m=DNN-lr=0.01_0.h5"]
    same = {j.path.name: j.state for j in planned(*sweep_argv(toy, folders[1], 1))}
    assert same["Toy_FedAvg_sweep-m=DNN-lr=0.05_0.h5"] == "done"


def test_an_interrupted_run_is_resumed_not_skipped(toy, swept, tmp_path):
    folders, _, _ = swept
    copy = tmp_path / "copy"
    shutil.copytree(folders[1], copy)
    name = "Toy_FedAvg_sweep-m=DNN-lr=0.05_0.h5"
    with h5py.File(copy / name, "a") as f:  # what a run stopped by Ctrl-C leaves (with its checkpoint)
        f.attrs["finished"] = False
    (copy / name).with_suffix(".ckpt").write_bytes(b"")
    states = {j.path.name: (j.state, j.argv) for j in planned(*sweep_argv(toy, copy, 1))}
    state, argv = states[name]
    assert state == "todo" and "--resume" in argv


def test_a_diverged_run_is_listed_as_failed_not_todo(toy, swept, tmp_path, capsys):
    """A diverged run leaves unfinished results and no checkpoint: --resume refuses it, so the
    sweep lists it for --overwrite instead of planning a run that would fail."""
    folders, _, _ = swept
    copy = tmp_path / "copy"
    shutil.copytree(folders[1], copy)
    name = "Toy_FedAvg_sweep-m=DNN-lr=0.05_0.h5"
    with h5py.File(copy / name, "a") as f:
        f.attrs["finished"] = False
    assert sweep.main_cli([*sweep_argv(toy, copy, 1), "--dry_run"]) == 1
    out, err = capsys.readouterr()
    assert f"failed; needs --overwrite {name}" in out and "1 failed earlier" in out
    assert "--overwrite" in err and name.removesuffix("_0.h5") in err


#: stands for main.py: the first SIGTERM lets it finish its round (a second of work here) and write
#: its checkpoint; a second one stops it at once, unsaved, as runner.run_control.StopOnSignal does
SLOW_ROUND = """
import os, signal, sys, time
marker = sys.argv[-1]
got = []
def handle(signum, frame):
    got.append(signum)
    if len(got) > 1:
        open(marker, "w").write("stopped at once after " + " ".join(map(str, got)))
        sys.exit(130)
signal.signal(signal.SIGINT, handle)
signal.signal(signal.SIGTERM, handle)
open(marker + ".ready", "w").write(str(os.getpgid(0)))
while not got:
    time.sleep(0.01)
time.sleep(float(os.environ.get("ROUND_LEFT_S", "1")))
open(marker, "w").write("checkpointed after " + " ".join(map(str, got)))
sys.exit(143)
"""


def start_slow_run(tmp_path, monkeypatch, round_left_s):
    import signal
    import threading
    import time
    from types import SimpleNamespace

    script = tmp_path / "slow_round.py"
    script.write_text(SLOW_ROUND)
    monkeypatch.setattr(sweep, "MAIN_SCRIPT", script)
    monkeypatch.setenv("ROUND_LEFT_S", str(round_left_s))
    marker = tmp_path / "marker"
    runner, results = sweep.Runner(tmp_path / "logs"), []
    job = SimpleNamespace(argv=[str(marker)], path=tmp_path / "run.h5")
    thread = threading.Thread(target=lambda: results.append(runner.run(job)))
    thread.start()
    ready = marker.with_name("marker.ready")
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready.exists(), "the stand-in run did not start"
    return runner, thread, results, marker, int(ready.read_text()), signal.SIGTERM


def test_a_stopped_sweep_waits_for_each_run_to_checkpoint(tmp_path, monkeypatch):
    """Ctrl-C on a sweep: each run gets one signal (it is in a process group of its own, so a
    terminal's Ctrl-C does not reach it a second time) and the sweep waits while it finishes its round, however long."""
    import os
    import time

    runner, thread, results, marker, group, sigterm = start_slow_run(tmp_path, monkeypatch, round_left_s=1.5)
    assert group != os.getpgrp()  # not in the caller's process group: a terminal's Ctrl-C reaches it via the sweep
    started = time.monotonic()
    runner.stop()
    assert time.monotonic() - started >= 1.4  # it waited for the round
    assert marker.read_text() == f"checkpointed after {int(sigterm)}"  # one signal, and a saved stop
    thread.join(timeout=30)
    assert results == [(143, "interrupted", results[0][2])]
    assert runner.run(None)[:2] == (130, "not started: the sweep was interrupted")


def test_a_second_ctrl_c_stops_the_runs_at_once(tmp_path, monkeypatch):
    import _thread
    import signal
    import threading
    import time

    runner, thread, _, marker, _, sigterm = start_slow_run(tmp_path, monkeypatch, round_left_s=120)
    # sweep.py's process has Python's own SIGINT handler (Ctrl-C raises KeyboardInterrupt); an earlier
    # test of this process may have left another, which interrupt_main would call instead
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.5, _thread.interrupt_main).start()  # the second Ctrl-C, while the sweep waits
        started = time.monotonic()
        runner.stop()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 30
    assert marker.read_text() == f"stopped at once after {int(sigterm)} {int(sigterm)}"
    thread.join(timeout=30)
