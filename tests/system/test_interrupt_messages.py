"""What a Ctrl-C outside training says it left behind: nothing, the finished results of the runs
that completed, the results so far of a run stopped at a round's end, or everything (after the last
result file was committed, the message must not say that none was written)."""
from __future__ import annotations

import os
import signal

import h5py
import pytest

import main
import runner.results
from flcore.servers.serverbase import Server
from toydata import make_dataset


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("interrupt-messages"), num_clients=4, input_shape=(4,))


def interrupt_in(monkeypatch, owner, name, call: int = 1):
    """A Ctrl-C to the process at the start of the ``call``-th call of ``owner.name``."""
    original, calls = getattr(owner, name), []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # a little Python work, in which the signal is handled
                pass
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupted)


def run(toy, results, capsys, *flags) -> tuple[int, str]:
    code = main.main(["-data", str(toy), "--results_dir", str(results), "-dev", "cpu", "-m", "MLR", "-gr", "2",
                      "-lbs", "8", "--progress", "False", "-q", "True", "--save_model", "False", *flags])
    return code, capsys.readouterr().err


def finished(path) -> bool:
    with h5py.File(path) as f:
        return bool(f.attrs["finished"])


def test_after_the_last_result_is_committed_the_results_are_complete(toy, tmp_path, capsys, monkeypatch):
    interrupt_in(monkeypatch, main, "print_summary")
    code, err = run(toy, tmp_path, capsys)
    assert code == 130
    assert err.strip().splitlines()[-1] == "interrupted after the results were written: they are complete"
    (result,) = tmp_path.glob("*.h5")
    assert finished(result)


def test_a_signal_while_the_results_are_renamed_into_place_says_they_are_complete(toy, tmp_path, capsys, monkeypatch):
    """The signal is deferred until the files are in place, and raised there."""
    original = runner.results.os.replace

    def replace(src, dst):
        if str(dst).endswith(".h5"):  # the staged result renamed to its final name (commit_results)
            os.kill(os.getpid(), signal.SIGINT)
        return original(src, dst)

    monkeypatch.setattr(runner.results.os, "replace", replace)
    code, err = run(toy, tmp_path, capsys)
    assert code == 130 and "no result file was written" not in err
    assert err.strip().splitlines()[-1] == "interrupted after the results were written: they are complete"


def test_a_signal_in_the_second_of_two_runs_names_the_first_runs_results(toy, tmp_path, capsys, monkeypatch):
    interrupt_in(monkeypatch, main, "build_model", call=2)
    code, err = run(toy, tmp_path, capsys, "-t", "2")
    first = tmp_path / f"{toy.name}_FedAvg_test_0.h5"
    assert code == 130 and finished(first) and not (tmp_path / f"{toy.name}_FedAvg_test_1.h5").exists()
    assert err.strip().splitlines()[-1] == (f"interrupted: the finished results in {first} were written; "
                                            "no result file was written for the unfinished run")


def test_a_signal_before_any_result_says_none_was_written(toy, tmp_path, capsys, monkeypatch):
    interrupt_in(monkeypatch, main, "build_model")
    code, err = run(toy, tmp_path, capsys)
    assert code == 130 and not list(tmp_path.glob("*.h5"))
    assert err.strip().splitlines()[-1] == "interrupted: no result file was written for the unfinished run"


def test_a_second_signal_after_the_results_so_far_were_written_names_them(toy, tmp_path, capsys, monkeypatch):
    """The first Ctrl-C stops the run at a round's end, which writes its results so far; a second
    one while the stop is reported interrupts at once: those results are there, marked unfinished."""
    interrupt_in(monkeypatch, Server, "run_round", call=2)  # in training: the run stops at the round's end
    original = runner.results.save_results

    def save_then_interrupt(*args, **kwargs):
        path = original(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
        return path

    monkeypatch.setattr(runner.results, "save_results", save_then_interrupt)
    code, err = run(toy, tmp_path, capsys)
    assert code == 130
    (result,) = tmp_path.glob("*.h5")
    assert not finished(result)
    assert err.strip().splitlines()[-1] == (f"interrupted: the results so far of the unfinished run are in {result}, "
                                            "marked unfinished")
