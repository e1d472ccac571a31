"""Result files are never lost or half-written: claims and locks, --overwrite / --resume, signals in a
real subprocess, divergence keeping the results so far, file modes, and the saved models."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest
import torch
from safetensors.torch import load_file

import main
from fltest import one_thread  # noqa: F401 - fixture
from toydata import make_dataset

SYSTEM = Path(main.__file__).resolve().parent


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("control"), num_clients=4, input_shape=(1, 8, 8))


def argv(toy, results, *extra):
    return ["-data", str(toy), "--results_dir", str(results), "-dev", "cpu", "-m", "DNN", "-gr", "2",
            "--progress", "False", "-q", "True", *extra]


def test_existing_results_are_refused_replaced_or_skipped(toy, tmp_path, capsys):
    assert main.main(argv(toy, tmp_path)) == 0
    (result,) = tmp_path.glob("*.h5")
    before = result.stat().st_mtime_ns
    capsys.readouterr()
    assert main.main(argv(toy, tmp_path, "-lr", "0.1")) == 2
    err = capsys.readouterr().err
    assert "--overwrite" in err and "-go" in err and err.count("\n") == 1
    assert result.stat().st_mtime_ns == before

    assert main.main(argv(toy, tmp_path, "--resume")) == 0  # finished: nothing to do
    assert "already finished" in capsys.readouterr().out
    assert result.stat().st_mtime_ns == before

    assert main.main(argv(toy, tmp_path, "-lr", "0.1", "--overwrite")) == 0
    with h5py.File(result) as f:
        assert '"local_learning_rate": 0.1' in f.attrs["config"]
    assert main.main(argv(toy, tmp_path, "--overwrite", "--resume")) == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no lock or temporary file left


def test_files_get_normal_permissions(toy, tmp_path):
    old = os.umask(0o022)
    try:
        assert main.main(argv(toy, tmp_path)) == 0
    finally:
        os.umask(old)
    for path in tmp_path.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def test_saved_models_load_with_the_documented_one_liner(toy, tmp_path):
    assert main.main(argv(toy, tmp_path, "-algo", "FedPer")) == 0
    (result,) = tmp_path.glob("*.h5")
    module = main.MODELS.get("DNN")((1, 8, 8), 10, main.parse_args(["-m", "DNN"]))
    module.load_state_dict(load_file(result.with_suffix(".safetensors")))  # the one-liner of the README
    personal = load_file(result.with_suffix(".personal.safetensors"))
    client3 = {k.split("/", 1)[1]: v for k, v in personal.items() if k.startswith("client3/")}
    module.load_state_dict(client3)
    assert not torch.equal(client3["head.weight"], personal["client0/head.weight"])  # FedPer: own heads


def test_divergence_keeps_results_up_to_the_last_good_round(toy, tmp_path, capsys):
    assert main.main(argv(toy, tmp_path, "-lr", "1e9", "-gr", "3")) == 2
    err = capsys.readouterr().err
    assert "round 0" in err and "client" in err and "kept in" in err and err.count("\n") == 1
    (result,) = tmp_path.glob("*.h5")
    with h5py.File(result) as f:
        assert not f.attrs["finished"] and f.attrs["stopped_at_round"] == 0
        assert len(f["rs_test_acc"]) == 1  # the initial model's evaluation, the last good one


# ------------------------------------------------------------------ real processes and signals
def start(toy, results, *extra) -> subprocess.Popen:
    """``main.py`` in a subprocess, logging each round, with more rounds than it could finish before the
    test interrupts it (a round of this toy run takes ~0.1 s)."""
    command = [sys.executable, "main.py", "-data", str(toy), "--results_dir", str(results), "-dev", "cpu",
               "-m", "DNN", "-gr", "100000", "--progress", "False", "--num_threads", "1", "--engine", "sequential",
               *extra]
    return subprocess.Popen(command, cwd=SYSTEM, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_round(process: subprocess.Popen, rnd: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        if line.startswith("round") and int(line.split()[1]) >= rnd:
            return
    process.kill()
    raise AssertionError(f"the run did not reach round {rnd}: {process.stderr.read()}")


def test_sigterm_stops_after_the_round_keeping_results_and_a_checkpoint(toy, tmp_path):
    """(SIGINT takes the same path: tests/system/test_resume.py raises it in-process and resumes.)"""
    sig, status = signal.SIGTERM, 143
    process = start(toy, tmp_path)
    wait_for_round(process, 2)
    # a second run of the same name is refused while the first holds its file
    other = subprocess.run([sys.executable, "main.py", *argv(toy, tmp_path, "--seed", "5")], cwd=SYSTEM,
                           capture_output=True, text=True)
    assert other.returncode == 2 and f"another run (pid {process.pid})" in other.stderr
    process.send_signal(sig)
    out, err = process.communicate(timeout=120)
    assert process.returncode == status, err
    assert "Traceback" not in err and "--resume" in err
    (result,) = tmp_path.glob("*.h5")
    with h5py.File(result) as f:
        assert not f.attrs["finished"]
        stopped = int(f.attrs["stopped_at_round"])
        assert len(f["rs_round_time"]) == stopped
    assert result.with_suffix(".ckpt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_second_ctrl_c_stops_at_once_without_partial_files(toy, tmp_path):
    process = start(toy, tmp_path, "-ls", "50")  # long rounds: the two signals land in one round
    wait_for_round(process, 1)
    process.send_signal(signal.SIGINT)
    time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "Traceback" not in err
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]
    assert not leftovers
    for result in tmp_path.glob("*.h5"):  # only if the round ended between the two signals
        with h5py.File(result) as f:
            assert not f.attrs["finished"]
