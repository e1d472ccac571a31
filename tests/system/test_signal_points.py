"""SIGINT at every stage of a run is acted on, never lost: during start-up (parsing, claiming the
result files, loading the dataset, building the model and the server), in a garbage-collector
finalizer (where Python swallows the KeyboardInterrupt it raises: the run used to go on to its
last round with exit status 0), at each step of a round, while the results are written, and in
a real ``python main.py`` process during its imports and its first rounds.

Each signal is sent to the whole process (``os.kill``, as a terminal's Ctrl-C is), so it may be
delivered to any of the engine's threads. After each: exit status 130 (the run stops), except when
it lands in the last round, which only evaluates (the run is then complete: 0); no temporary or
staging file is left; a result marked finished always has its model beside it."""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

import main
import runner.results
from flcore.servers.serverbase import Server
from toydata import make_dataset

SYSTEM = Path(main.__file__).resolve().parent
ROUNDS = 3


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("signals"), num_clients=4, input_shape=(4,))


def interrupt() -> None:
    """A Ctrl-C to the whole process, then a little Python work, in which it is handled."""
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):
        pass


def run(toy, results, capsys) -> tuple[int, str, str]:
    code = main.main(["-data", str(toy), "--results_dir", str(results), "-dev", "cpu", "-m", "MLR", "-gr",
                      str(ROUNDS), "-lbs", "8", "--progress", "False", "--engine", "threaded"])
    out, err = capsys.readouterr()
    return code, out, err


def check_files(results: Path) -> list[Path]:
    """No temporary, staging or lock file; a finished result has its model. Returns the results."""
    if not results.exists():
        return []
    names = [p.name for p in results.iterdir()]
    assert not [n for n in names if n.startswith(".") or n.endswith((".tmp", ".new"))], names
    done = sorted(results.glob("*.h5"))
    for path in done:
        with h5py.File(path) as f:
            if f.attrs["finished"]:
                assert path.with_suffix(".safetensors").is_file(), names
    return done


def wrap(monkeypatch, owner, name, when="before", hit=lambda *args: True):
    """``owner.name`` interrupted before (or after) its calls for which ``hit(*args)`` holds."""
    original = getattr(owner, name)

    def interrupted(*args, **kwargs):
        now = hit(*args)
        if now and when == "before":
            interrupt()
        result = original(*args, **kwargs)
        if now and when == "after":
            interrupt()
        return result

    monkeypatch.setattr(owner, name, interrupted)


def in_round(monkeypatch, round_):
    """A ``hit`` that holds in the calls made during round ``round_`` (``Server.run_round``'s)."""
    current = []
    original = Server.run_round

    def run_round(self, rnd, *args, **kwargs):
        current[:] = [rnd]
        return original(self, rnd, *args, **kwargs)

    monkeypatch.setattr(Server, "run_round", run_round)
    return lambda *args: current == [round_]


START_UP = ["parse_args", "claim_all", "load_federated_dataset", "split_for_features", "with_public_data",
            "validate_with_data", "build_model", "warn_degenerate", "train_one"]


@pytest.mark.parametrize("point", START_UP)
def test_a_signal_during_start_up_stops_before_training(toy, tmp_path, capsys, monkeypatch, point):
    wrap(monkeypatch, main, point)
    code, out, err = run(toy, tmp_path, capsys)
    assert code == 130, (out, err)
    assert "interrupted: no result file was written" in err and "Traceback" not in err
    assert "round    0" not in out and check_files(tmp_path) == []


class Finalizer:
    """An object whose finalizer the signal lands in, as one of the collector's may."""

    def __del__(self):
        interrupt()


@pytest.mark.parametrize("point", ["load_federated_dataset", "print_summary"])
def test_a_signal_swallowed_in_a_finalizer_still_stops_the_run(toy, tmp_path, capsys, monkeypatch, point):
    """In start-up the run stops before training; after the results are written it says they are
    complete. Either way exit status 130, where the run used to go on and exit 0."""
    swallowed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: swallowed.append(unraisable.exc_type))
    original = getattr(main, point)

    def call_and_collect(*args, **kwargs):
        Finalizer()  # collected at once: its __del__ runs here
        gc.collect()
        return original(*args, **kwargs)

    monkeypatch.setattr(main, point, call_and_collect)
    code, out, err = run(toy, tmp_path, capsys)
    assert swallowed and issubclass(swallowed[0], KeyboardInterrupt)  # Python did swallow it
    assert code == 130, (out, err)
    if point == "load_federated_dataset":
        assert "interrupted: no result file was written" in err and "round    0" not in out
        assert check_files(tmp_path) == []
    else:
        assert err.endswith("interrupted after the results were written: they are complete\n"), err
        (result,) = check_files(tmp_path)
        with h5py.File(result) as f:
            assert f.attrs["finished"]


@pytest.mark.parametrize("method", ["select_clients", "make_package", "aggregate", "after_round", "evaluate"])
@pytest.mark.parametrize("round_", [0, 1])
def test_a_signal_at_each_step_of_a_round_stops_after_the_round(toy, tmp_path, capsys, monkeypatch, method, round_):
    wrap(monkeypatch, Server, method, hit=in_round(monkeypatch, round_))
    code, out, err = run(toy, tmp_path, capsys)
    assert code == 130, (out, err)
    assert "SIGINT: stopping after this round" in out and f"stopped after round {round_}" in err
    (result,) = check_files(tmp_path)
    with h5py.File(result) as f:
        assert not f.attrs["finished"] and f.attrs["stopped_at_round"] == round_ + 1
    assert result.with_suffix(".ckpt").is_file()


def test_a_signal_in_the_last_round_finds_the_run_complete(toy, tmp_path, capsys, monkeypatch):
    """The last round only evaluates: the run has nothing left to stop, and ends complete."""
    wrap(monkeypatch, Server, "evaluate", hit=in_round(monkeypatch, ROUNDS))
    code, out, err = run(toy, tmp_path, capsys)
    assert code == 0 and "SIGINT: stopping after this round" in out, (out, err)
    (result,) = check_files(tmp_path)
    with h5py.File(result) as f:
        assert f.attrs["finished"]


@pytest.mark.parametrize("point", ["stage_model", "save_results", "replace"])
def test_a_signal_while_the_results_are_written_leaves_no_half(toy, tmp_path, capsys, monkeypatch, point):
    """Before the renames nothing is written; during them (``os.replace``: another thread may
    receive the signal, so a signal mask would not hold it) the model and results stay a pair."""
    if point == "replace":  # the first rename of a staged file into place
        renamed = []
        wrap(monkeypatch, os, "replace", hit=lambda src, dst: str(src).endswith(".new") and not renamed.append(src)
             and len(renamed) == 1)
    else:  # one run's writing lives in runner/results.py
        wrap(monkeypatch, runner.results, point)
    code, out, err = run(toy, tmp_path, capsys)
    assert code == 130 and "Traceback" not in err, (out, err)
    done = check_files(tmp_path)
    if point == "replace":  # the renames completed together, then the signal was acted on
        (result,) = done
        with h5py.File(result) as f:
            assert f.attrs["finished"]


def importing_torch(process: subprocess.Popen) -> bool:
    """Whether the process has mapped torch's library (it is importing torch, or past it)."""
    try:
        return "libtorch" in Path(f"/proc/{process.pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see the process importing torch")
def test_a_real_process_stops_at_a_signal_during_its_imports_and_its_rounds(toy, tmp_path):
    """``python main.py`` signalled while it imports torch and after its first round: each ends
    with status 130 and leaves no partial file."""
    command = [sys.executable, "main.py", "-data", str(toy), "-dev", "cpu", "-m", "MLR", "-gr", "100000",
               "--progress", "False", "--num_threads", "1"]
    for name in ("imports", "rounds"):
        results = tmp_path / name
        process = subprocess.Popen([*command, "--results_dir", str(results)], cwd=SYSTEM, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        if name == "imports":
            while not importing_torch(process):
                assert process.poll() is None, process.stderr.read()
                time.sleep(0.005)
        else:
            while not process.stdout.readline().startswith("round    1"):
                assert process.poll() is None, process.stderr.read()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
        assert process.returncode == 130 and "Traceback" not in err, (name, err)
        check_files(results)
