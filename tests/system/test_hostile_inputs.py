"""The regression suite of a hostile new user's inputs: each case ends with ONE line on
stderr and exit status 2 (or 130 for Ctrl-C), never a traceback, and every result and model that
was on disk before is byte-identical afterwards."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import main
from fltest import one_thread  # noqa: F401 - fixture
from toydata import make_dataset

SYSTEM = Path(main.__file__).resolve().parent


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("hostile"), num_clients=4, input_shape=(1, 8, 8))


def argv(toy, results, *extra) -> list[str]:
    return ["-data", str(toy), "--results_dir", str(results), "-dev", "cpu", "-m", "DNN", "-gr", "2",
            "--progress", "False", "-q", "True", *extra]


def run_main(capsys, *args: str) -> tuple[int, str]:
    """main.main's exit status (argparse's too) and its stderr."""
    capsys.readouterr()
    try:
        code = main.main(list(args))
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def earlier(folder: Path) -> dict[str, bytes]:
    """Results and a model of an earlier run (another goal) in ``folder``; returns the snapshot."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Toy_FedAvg_earlier_0.h5").write_bytes(b"earlier results")
    (folder / "Toy_FedAvg_earlier_0.safetensors").write_bytes(b"earlier model")
    return snapshot(folder)


def one_line(err: str, *words: str) -> None:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)


@pytest.fixture
def finished(toy, tmp_path, capsys):
    """A results folder holding one finished run (h5 and model); returns (folder, its snapshot)."""
    assert run_main(capsys, *argv(toy, tmp_path, "-go", "ow"))[0] == 0
    before = snapshot(tmp_path)
    assert {Path(name).suffix for name in before} == {".h5", ".safetensors"}
    return tmp_path, before


# ------------------------------------------------------------------ 1: --overwrite is atomic
def test_an_interrupted_overwrite_keeps_the_old_results_and_model(toy, finished):
    results, before = finished
    command = [sys.executable, "main.py", *argv(toy, results, "-go", "ow", "--overwrite", "-gr", "400", "-q", "False",
                                                 "--num_threads", "1", "--engine", "sequential")]
    process = subprocess.Popen(command, cwd=SYSTEM, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stdout:
        if line.startswith("round") and int(line.split()[1]) >= 2:
            break
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "kept until this run completes" in err and "--resume" in err
    after = snapshot(results)
    assert {name: after[name] for name in before} == before
    assert set(after) - set(before) == {f"{toy.name}_FedAvg_ow_0.ckpt"}  # the overwrite, to --resume


def test_a_rerun_after_an_interrupted_overwrite_names_both_files(toy, finished, capsys):
    results, before = finished
    checkpoint = next(results.glob("*.h5")).with_suffix(".ckpt")
    checkpoint.write_bytes(b"an interrupted --overwrite")
    code, err = run_main(capsys, *argv(toy, results, "-go", "ow"))
    assert code == 2
    one_line(err, "already holds results of a finished run", f"--resume to continue the interrupted run in {checkpoint.name}")
    assert {k: v for k, v in snapshot(results).items() if k in before} == before


def test_a_diverged_overwrite_keeps_the_old_results_and_model(toy, finished, capsys):
    results, before = finished
    code, err = run_main(capsys, *argv(toy, results, "-go", "ow", "--overwrite", "-lr", "1e9", "-gr", "3"))
    assert code == 2
    one_line(err, "kept", "nothing of this run was written")
    assert snapshot(results) == before


def test_a_completed_overwrite_replaces_results_and_model_together(toy, finished, capsys):
    results, before = finished
    (results / f".{toy.name}_FedAvg_ow_0.h5.new").write_bytes(b"left by a run killed while committing")
    assert run_main(capsys, *argv(toy, results, "-go", "ow", "--overwrite", "-lr", "0.1"))[0] == 0
    after = snapshot(results)
    assert set(after) == set(before) and all(after[name] != before[name] for name in before)
    assert run_main(capsys, *argv(toy, results, "-go", "ow", "--overwrite", "--save_model", "False"))[0] == 0
    assert [Path(name).suffix for name in snapshot(results)] == [".h5"]  # no model of another run left beside it


# ------------------------------------------------------------------ 6: a full disk
def no_space_safetensors(tensors, path, *args, **kwargs):
    from safetensors import SafetensorError

    Path(path).write_bytes(b"\0" * 10)
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


def no_space_torch_save(obj, path, *args, **kwargs):
    Path(path).write_bytes(b"PK\3\4")
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")


def test_a_full_disk_while_saving_the_model_writes_no_finished_results(toy, tmp_path, capsys, monkeypatch):
    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", no_space_safetensors)
    code, err = run_main(capsys, *argv(toy, tmp_path))
    assert code == 2
    one_line(err, "No space left on device", "free some space")
    assert snapshot(tmp_path) == {}  # no h5 marked finished without its model, no temporary file
    monkeypatch.undo()
    assert run_main(capsys, *argv(toy, tmp_path))[0] == 0  # and a rerun is not refused as finished


def test_a_full_disk_while_overwriting_keeps_the_old_results_and_model(toy, finished, capsys, monkeypatch):
    results, before = finished
    import h5py as h5

    real = h5.File

    def file(name, mode="r", *args, **kwargs):
        if mode == "w":
            raise OSError(28, "Unable to synchronously create file (file write failed: errno = 28)")
        return real(name, mode, *args, **kwargs)

    monkeypatch.setattr(h5, "File", file)
    code, err = run_main(capsys, *argv(toy, results, "-go", "ow", "--overwrite"))
    assert code == 2
    one_line(err, "No space left on device")
    assert snapshot(results) == before


def test_a_full_disk_while_checkpointing_is_one_line(toy, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch, "save", no_space_torch_save)
    code, err = run_main(capsys, *argv(toy, tmp_path, "--checkpoint_every", "1"))
    assert code == 2
    one_line(err, "disk full", "free some space")
    assert snapshot(tmp_path) == {}


def test_a_read_only_results_folder_says_read_only(toy, tmp_path, capsys, monkeypatch):
    import os

    def read_only(src, dst):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(os, "replace", read_only)
    code, err = run_main(capsys, *argv(toy, tmp_path))
    monkeypatch.undo()
    assert code == 2
    one_line(err, "read-only", "--results_dir")
    assert "free some space" not in err


# ------------------------------------------------------------------ 7: every algorithm flag has a range
@pytest.mark.parametrize("flags,named", [
    (["-algo", "FedAdam", "-slr", "0"], "-slr must be a finite number > 0, got 0.0"),
    (["-algo", "FedAdam", "--beta1", "1.5"], "--beta1 must be in [0, 1), got 1.5"),
    (["-algo", "SCAFFOLD", "-slr", "-1"], "-slr must be a finite number > 0, got -1.0"),
    (["-algo", "FedProx", "-mu", "-1"], "-mu must be a finite number >= 0, got -1.0"),
    (["-algo", "FedAvgM", "--server_momentum", "1"], "--server_momentum must be in [0, 1), got 1.0"),
    (["-algo", "FedYogi", "--beta2", "-1"], "--beta2 must be in [0, 1), got -1.0"),
    (["-algo", "FedProx", "-mu", "nan"], "-mu must be a finite number >= 0, got nan"),
    (["-algo", "FedAdam", "-tau", "inf"], "-tau must be a finite number > 0, got inf"),
    (["--workers", "-2"], "--workers must be >= 0, got -2"),
])
def test_out_of_range_algorithm_flags_are_refused_up_front(toy, tmp_path, capsys, flags, named):
    before = earlier(tmp_path)
    code, err = run_main(capsys, *argv(toy, tmp_path, *flags))
    assert code == 2
    one_line(err, named)
    assert snapshot(tmp_path) == before  # refused before anything was claimed or written


def test_every_numeric_algorithm_flag_declares_a_range():
    from flcore.registry import ALGORITHMS, SELECTORS, load_all
    from cli.flags import declared_actions

    load_all()
    classes = [main._algorithm_classes(ALGORITHMS.get(name)) for name in ALGORITHMS.names()]
    classes += [(SELECTORS.get(name),) for name in SELECTORS.names()]
    missing = sorted({action.option_strings[0] for group in classes for action in declared_actions(*group)
                      if action.type in (int, float) and not action.choices and not hasattr(action, "allowed")})
    assert missing == [], "declare each numeric flag's values: add_flag(..., low=/above=/high=/below=) (cli/flags.py)"


# ------------------------------------------------------------------ 2, 4: names that are not plain names
@pytest.mark.parametrize("flags,named", [
    (["-go", ""], "-go ''"),
    (["-go", "x/../../outside"], "-go 'x/../../outside'"),
    (["-data", "."], "-data '.'"),
    (["-data", ".."], "-data '..'"),
])
def test_goals_and_dataset_names_must_be_plain_names(toy, tmp_path, capsys, flags, named):
    results = tmp_path / "results"
    results.mkdir()
    (results / "keep.h5").write_bytes(b"earlier")
    args = argv(toy, results)
    if flags[0] == "-data":
        args[1] = flags[1]
    else:
        args += flags
    code, err = run_main(capsys, *args)
    assert code == 2
    one_line(err, named)
    assert snapshot(tmp_path) == {"results/keep.h5": b"earlier"}  # nothing written inside or outside


# ------------------------------------------------------------------ 9: a method that degenerates says so
@pytest.mark.parametrize("flags,warning", [
    (["-algo", "FedBN", "-m", "DNN"], "so this run is FedAvg"),
    (["-algo", "FedPer", "-m", "MLR"], "so this run is Local"),
    (["-algo", "FedRep", "-m", "MLR"], "so this run is Local"),
    (["-dp", "-dps", "0"], "epsilon is infinite"),
])
def test_a_degenerate_method_warns_at_the_start(toy, tmp_path, capsys, flags, warning):
    code, err = run_main(capsys, *argv(toy, tmp_path, "-gr", "1", *flags))
    assert code == 0
    assert [line for line in err.splitlines() if warning in line][0].startswith("warning:")


def test_a_method_that_keeps_its_private_part_does_not_warn(toy, tmp_path, capsys):
    code, err = run_main(capsys, *argv(toy, tmp_path, "-gr", "1", "-algo", "FedPer"))
    assert code == 0 and "this run is" not in err


# ------------------------------------------------------------------ 12: a read-only --state_dir
def test_a_state_dir_that_refuses_files_is_one_line(toy, tmp_path, capsys, monkeypatch):
    import tempfile

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    before = earlier(tmp_path / "results")
    code, err = run_main(capsys, *argv(toy, tmp_path / "results", "-algo", "SCAFFOLD", "--state_device", "disk",
                                       "--state_dir", str(state_dir)))
    assert code == 2
    one_line(err, f"--state_dir {state_dir}", "Read-only file system", "writable")
    assert snapshot(tmp_path / "results") == before and not list(state_dir.iterdir())


# ------------------------------------------------------------------ 13: Ctrl-C while the libraries load
def test_ctrl_c_during_start_up_exits_quietly_with_130(toy, tmp_path):
    """A KeyboardInterrupt raised while main.py imports torch (what Ctrl-C does then)."""
    script = ("import builtins, runpy, sys\n"
              "real = builtins.__import__\n"
              "def interrupted(name, *args, **kwargs):\n"
              "    if name == 'torch':\n"
              "        raise KeyboardInterrupt\n"
              "    return real(name, *args, **kwargs)\n"
              "builtins.__import__ = interrupted\n"
              f"sys.argv = ['main.py', '-data', {str(toy)!r}, '--results_dir', {str(tmp_path)!r}]\n"
              "runpy.run_path('main.py', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=SYSTEM, capture_output=True, text=True, timeout=120)
    assert done.returncode == 130 and done.stderr == "" and done.stdout == ""
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------ 14: -sfn's help says where models go
def test_the_help_says_where_the_model_goes(capsys):
    with pytest.raises(SystemExit):
        main.parse_args(["-h"])
    text = " ".join(capsys.readouterr().out.split())
    assert "system/models" not in text
    assert "<results_dir>/<data>_<algo>_<goal>_<run>.safetensors" in text


# ------------------------------------------------------------------ 17: what is found is named as it is
def test_a_killed_run_is_named_by_its_checkpoint(toy, tmp_path, capsys):
    """kill -9 leaves a checkpoint and a stale lock, and no h5."""
    name = f"{toy.name}_FedAvg_test_0"
    (tmp_path / f"{name}.ckpt").write_bytes(b"checkpoint")
    (tmp_path / f".{name}.h5.lock").write_text("999999")
    before = snapshot(tmp_path)
    code, err = run_main(capsys, *argv(toy, tmp_path))
    assert code == 2
    one_line(err, f"{name}.ckpt holds the checkpoint of an interrupted run", "--resume", "--overwrite")
    assert f"{name}.h5 already" not in err
    assert snapshot(tmp_path) == {k: v for k, v in before.items() if not k.endswith(".lock")}


@pytest.mark.parametrize("kind", ["random bytes", "folder"])
def test_a_corrupt_file_or_a_folder_at_the_result_path_is_named_so(toy, tmp_path, capsys, kind):
    result = tmp_path / f"{toy.name}_FedAvg_test_0.h5"
    if kind == "folder":
        result.mkdir()
        (result / "inside").write_bytes(b"kept")
    else:
        result.write_bytes(bytes(range(256)) * 4)
    before = snapshot(tmp_path)
    for extra in ([], ["--resume"], ["--overwrite"]) if kind == "folder" else ([], ["--resume"]):
        code, err = run_main(capsys, *argv(toy, tmp_path, *extra))
        assert code == 2
        one_line(err, "is a folder" if kind == "folder" else "corrupt or truncated")
        assert snapshot(tmp_path) == before


# ------------------------------------------------------------------ 18: an npz holding pickled objects
def test_an_npz_of_objects_is_called_pickled(toy, tmp_path, capsys):
    import shutil

    import numpy as np

    data = tmp_path / "Toy"
    shutil.copytree(toy, data)
    np.savez(data / "train" / "0.npz", x=np.zeros((3, 1, 8, 8), np.float32), y=np.array([1, "a", None], dtype=object))
    before = earlier(tmp_path / "results")
    code, err = run_main(capsys, *argv(data, tmp_path / "results"))
    assert code == 2
    one_line(err, "0.npz holds pickled Python objects", "never unpickled")
    assert snapshot(tmp_path / "results") == before


# ------------------------------------------------------------------ 19: --resume reports over every run
def test_resume_with_a_finished_run_reports_the_best_over_all_runs(toy, tmp_path, capsys):
    assert run_main(capsys, *argv(toy, tmp_path, "-t", "1"))[0] == 0
    capsys.readouterr()
    assert main.main(argv(toy, tmp_path, "-t", "2", "--resume")) == 0
    out = capsys.readouterr().out
    assert "Run 0: already finished" in out and "Best accuracy over 2 runs" in out


# ------------------------------------------------------------------ a model that cannot take the inputs
def test_a_model_that_cannot_take_the_images_is_refused_before_training(tmp_path, capsys):
    mnist = make_dataset(tmp_path / "data", num_clients=2, input_shape=(1, 28, 28), train_sizes=[12, 12], test_size=4)
    before = earlier(tmp_path / "results")
    code, err = run_main(capsys, *argv(mnist, tmp_path / "results", "-m", "GoogleNet-GN"))
    assert code == 2
    one_line(err, "GoogleNet-GN does not fit", "GroupNorm", "[1, 28, 28]")
    assert snapshot(tmp_path / "results") == before
