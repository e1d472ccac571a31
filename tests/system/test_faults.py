"""Broken inputs and faults, each reproduced as a new user meets it: through
``main.py`` on a small generated dataset, expecting exit status 2, one ``error:`` line naming the
file or flag and what to do (never a traceback), and nothing half-written."""
from __future__ import annotations

import errno
import json
import os
import pickle
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
from toydata import make_dataset

import main
from conftest import REPO
from datagen import lock
from fldata import loading as data_utils
from reporting import results as result_utils
from fldata.loading import load_federated_dataset
from utils.errors import FLError


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main.main(["-dev", "cpu", "--progress", "False", "--save_model", "False", "-m", "DNN", "-gr", "1", *argv])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(code: int, out: str, err: str, *needles: str, results: Path | None = None) -> str:
    """Exit 2, one ``error:`` line holding every needle, no traceback, no training, no result file."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Run 0" not in out
    if results is not None and results.exists():
        assert not list(results.iterdir()), "a refused run must leave nothing in the results folder"
    return lines[0]


def files_of(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*"))}


@pytest.fixture
def toy(tmp_path):
    return make_dataset(tmp_path / "data", num_clients=4, input_shape=(1, 4, 4), test_size=6)


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _client(folder: Path, split: str, cid: int) -> tuple[np.ndarray, np.ndarray]:
    with np.load(folder / split / f"{cid}.npz") as archive:
        return archive["x"], archive["y"]


def refused(capsys, toy, tmp_path, *needles, extra=()):
    before = files_of(toy)
    code, out, err = run_main(capsys, "-data", str(toy), "--results_dir", str(tmp_path / "res"), *extra)
    line = assert_refused(code, out, err, *needles, results=tmp_path / "res")
    assert files_of(toy) == before, "a check must not touch the dataset"
    return line


# ----------------------------------------------------------------------------- labels
def test_labels_outside_num_classes_are_refused_at_load_naming_the_file(capsys, toy, tmp_path):
    _edit_config(toy, num_classes=5)  # clients hold labels up to 5 (client 3: 3, 4, 5)
    line = refused(capsys, toy, tmp_path, "outside [0, 5)", '"num_classes": 6', str(toy / "config.json"))
    assert "/train/3.npz" in line


def test_negative_and_fractional_labels_are_refused(capsys, toy, tmp_path):
    x, y = _client(toy, "test", 1)
    np.savez(toy / "test" / "1.npz", x=x, y=y - 2)
    refused(capsys, toy, tmp_path, "test/1.npz has labels -", "regenerate")
    np.savez(toy / "test" / "1.npz", x=x, y=y + 0.5)
    refused(capsys, toy, tmp_path, "test/1.npz: labels y are float64, not whole class numbers")


# -------------------------------------------------------------------------- file kinds
def test_random_bytes_are_not_taken_for_a_pfllib_pickle(capsys, toy, tmp_path):
    (toy / "test" / "3.npz").write_bytes(np.random.default_rng(0).bytes(5000))
    for extra in ((), ("--legacy_pickle",)):
        line = refused(capsys, toy, tmp_path, "test/3.npz is not an npz archive", "corrupt", extra=extra)
        assert "pickle" not in line.lower()


def test_a_bare_pickle_is_never_unpickled_even_with_legacy_pickle(capsys, toy, tmp_path):
    canary = tmp_path / "unpickled"

    class Payload:
        def __reduce__(self):
            return os.mkdir, (str(canary),)

    (toy / "train" / "2.npz").write_bytes(pickle.dumps(Payload(), protocol=4))
    for extra in ((), ("--legacy_pickle",)):
        line = refused(capsys, toy, tmp_path, "train/2.npz is a bare pickle", "never unpickled", extra=extra)
        assert "--legacy" not in line
    assert not canary.exists()


def test_an_npy_file_under_an_npz_name(capsys, toy, tmp_path):
    np.save(toy / "train" / "1.npz.npy", np.zeros(3))
    os.replace(toy / "train" / "1.npz.npy", toy / "train" / "1.npz")
    refused(capsys, toy, tmp_path, "train/1.npz holds one .npy array")


def test_empty_truncated_and_corrupt_archives(capsys, toy, tmp_path):
    whole = (toy / "train" / "0.npz").read_bytes()
    (toy / "train" / "0.npz").write_bytes(b"")
    refused(capsys, toy, tmp_path, "train/0.npz is empty")
    (toy / "train" / "0.npz").write_bytes(whole[: len(whole) // 2])  # cut: no central directory
    refused(capsys, toy, tmp_path, "train/0.npz is corrupt or truncated")
    # the archive's index intact, the compressed inputs damaged (x is stored first)
    damaged = bytearray(whole)
    damaged[200:260] = bytes(60)
    (toy / "train" / "0.npz").write_bytes(bytes(damaged))
    refused(capsys, toy, tmp_path, "train/0.npz is corrupt or truncated")


def _pfllib_file(path: Path, payload: bytes) -> None:
    """A PFLlib-style npz: one object array 'data' whose pickle bytes are ``payload``."""
    header = {"descr": "|O", "fortran_order": False, "shape": ()}
    with zipfile.ZipFile(path, "w") as archive, archive.open("data.npy", "w") as member:
        np.lib.format.write_array_header_1_0(member, header)
        member.write(payload)


def test_pfllib_files_get_the_pickle_advice_and_a_damaged_one_is_one_line(capsys, toy, tmp_path):
    # what np.savez(f, data=dict) writes: the pickle of a 0-d object array holding the dict
    good = pickle.dumps(np.array({"x": np.zeros((3, 1, 4, 4), np.float32), "y": np.zeros(3, np.int64)}), protocol=2)
    _pfllib_file(toy / "train" / "0.npz", good)
    refused(capsys, toy, tmp_path, "train/0.npz is a PFLlib pickle file", "convert_pfllib.py", "--legacy-pickle")
    _pfllib_file(toy / "train" / "0.npz", good[: len(good) // 2])  # a truncated pickle
    before = files_of(toy)
    code, out, err = run_main(capsys, "-data", str(toy), "--results_dir", str(tmp_path / "res"), "--legacy_pickle")
    assert code == 2 and "Traceback" not in err and files_of(toy) == before
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "train/0.npz is a damaged PFLlib pickle file" in errors[0]
    assert err.strip().splitlines()[-1] == errors[0]  # after the one --legacy-pickle warning
    _pfllib_file(toy / "train" / "0.npz", pickle.dumps(np.array([1, 2], dtype=object), protocol=2))
    code, _, err = run_main(capsys, "-data", str(toy), "--results_dir", str(tmp_path / "res"), "--legacy_pickle")
    assert code == 2 and "not a dict of 'x' and 'y'" in err and "Traceback" not in err


# ---------------------------------------------------------------- config.json vs files
def test_config_that_contradicts_the_client_files(capsys, toy, tmp_path):
    _edit_config(toy, num_clients=3)
    refused(capsys, toy, tmp_path, "says 3 clients", "also holds 3.npz")
    _edit_config(toy, num_clients=6)
    refused(capsys, toy, tmp_path, "client files missing", "[4, 5]")
    for bad in (0, "ten", 2.5, True):
        _edit_config(toy, num_clients=4, num_classes=bad)
        refused(capsys, toy, tmp_path, '"num_classes" must be a whole number >= 1')
    _edit_config(toy, num_classes=10, input_shape=[1, 0, 4])
    refused(capsys, toy, tmp_path, '"input_shape" must be a list of whole numbers')
    (toy / "config.json").write_text("[1, 2]")
    refused(capsys, toy, tmp_path, "holds list, not an object")


def test_sample_counts_recorded_in_config_must_match(capsys, toy, tmp_path):
    config = json.loads((toy / "config.json").read_text())
    stats = config["Size of samples for labels in clients"]
    stats[2][0][1] += 1  # PFLlib's statistic: one sample more than client 2 holds
    _edit_config(toy, **{"Size of samples for labels in clients": stats})
    refused(capsys, toy, tmp_path, "client 2 holds", "records", "different runs")
    sizes = [30 + 7 * i for i in range(4)]
    _edit_config(toy, train_samples=sizes, test_samples=[6, 6, 6, 7])  # ours win over PFLlib's
    refused(capsys, toy, tmp_path, "client 3 has 6 test samples", "records 7")
    _edit_config(toy, test_samples=[6, 6, 6, 6])
    code, _, err = run_main(capsys, "-data", str(toy), "--results_dir", str(tmp_path / "res"))
    assert code == 0, err


# -------------------------------------------------------------------------- inputs
def test_nan_or_infinite_inputs_are_refused(capsys, toy, tmp_path):
    x, y = _client(toy, "test", 2)
    x[1, 0, 0, 0], x[2, 0, 1, 1] = np.nan, np.inf
    np.savez(toy / "test" / "2.npz", x=x, y=y)
    refused(capsys, toy, tmp_path, "test/2.npz has 2 NaN or infinite input values")


def test_inputs_and_labels_of_different_lengths(capsys, toy, tmp_path):
    x, y = _client(toy, "train", 1)
    np.savez(toy / "train" / "1.npz", x=x[:-1], y=y)
    refused(capsys, toy, tmp_path, f"train/1.npz has {len(y) - 1} inputs for {len(y)} labels")


def test_train_and_test_of_different_shapes_or_kinds(capsys, toy, tmp_path):
    x, y = _client(toy, "test", 0)
    np.savez(toy / "test" / "0.npz", x=x.reshape(len(x), 16), y=y)
    refused(capsys, toy, tmp_path, "client 0 inputs have shape [16]", "test/0.npz", "config.json says [1, 4, 4]")
    config = json.loads((toy / "config.json").read_text())
    del config["input_shape"]
    (toy / "config.json").write_text(json.dumps(config))
    refused(capsys, toy, tmp_path, "client 0 inputs have shape [16]", "train/0.npz has [1, 4, 4]")
    np.savez(toy / "test" / "0.npz", x=np.zeros(x.shape, np.int64), y=y)
    refused(capsys, toy, tmp_path, "test/0.npz has integer inputs", "float ones")


# -------------------------------------------------------------------- empty clients
def test_clients_without_training_samples_are_named_once_and_the_run_goes_on(capsys, tmp_path):
    folder = make_dataset(tmp_path / "data", num_clients=8, input_shape=(4,), train_sizes=[0, 3, 3, 3, 3, 3, 3, 40])
    code, out, err = run_main(capsys, "-data", str(folder), "--results_dir", str(tmp_path / "res"), "-lbs", "10")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "take no local step" in line]
    assert warnings == ["warning: 7 of 8 clients take no local step (fewer training samples than -lbs 10, "
                        "with --drop_last): 0, 1, 2, 3, 4 and 2 more"]
    assert "Traceback" not in err and len(list((tmp_path / "res").glob("*.h5"))) == 1


def test_lbs_larger_than_every_client_is_refused_and_drop_last_false_trains(capsys, toy, tmp_path):
    line = refused(capsys, toy, tmp_path, "-lbs 60 is larger than every client's training set",
                   "largest: 51 samples", "pass -lbs 51 or less, or --drop_last False", extra=("-lbs", "60"))
    code, _, err = run_main(capsys, "-data", str(toy), "--results_dir", str(tmp_path / "res"), "-lbs", "60",
                            "--drop_last", "False")
    assert code == 0 and "take no local step" not in err, err
    assert line


@pytest.mark.parametrize("algorithm", ["FedAvg", "Ditto", "FedPer", "SCAFFOLD"])
def test_an_empty_test_split_does_not_break_evaluation(capsys, tmp_path, algorithm):
    folder = make_dataset(tmp_path / "data", num_clients=3, input_shape=(1, 4, 4), test_size=5)
    x, y = _client(folder, "test", 1)
    np.savez(folder / "test" / "1.npz", x=x[:0], y=y[:0])
    config = json.loads((folder / "config.json").read_text())
    del config["Size of samples for labels in clients"]  # it counts the removed samples
    (folder / "config.json").write_text(json.dumps(config))
    code, out, err = run_main(capsys, "-data", str(folder), "-algo", algorithm, "-gr", "2",
                              "--results_dir", str(tmp_path / "res"))
    assert code == 0 and "Traceback" not in err, err
    result = result_utils.read_results(next((tmp_path / "res").glob("*.h5")))
    assert np.isfinite(result["rs_test_acc"]).all() and np.isfinite(result["rs_test_auc"]).all()
    assert (result["rs_client_acc"][:, 1] == 0).all()  # recorded as 0, weight 0


def test_a_dataset_without_any_test_sample_is_refused(capsys, tmp_path):
    folder = make_dataset(tmp_path / "data", num_clients=2, input_shape=(4,), test_size=0)
    code, out, err = run_main(capsys, "-data", str(folder), "--results_dir", str(tmp_path / "res"))
    assert_refused(code, out, err, "no client of dataset", "has test samples", results=tmp_path / "res")


# ------------------------------------------------------------- a generator writing it
def test_a_folder_being_written_by_a_generator_is_refused(capsys, toy, tmp_path):
    with lock.writing(toy):
        refused(capsys, toy, tmp_path, f"is being written by a generator (pid {os.getpid()})", "wait")
        with pytest.raises(Exception, match="being written by another generator"):
            with lock.writing(toy):
                pass  # a second generator on the same folder is refused too
    assert not (toy / lock.LOCK_NAME).exists()
    code, _, err = run_main(capsys, "-data", str(toy), "--results_dir", str(tmp_path / "res"))
    assert code == 0, err


def test_a_marker_left_by_a_killed_generator_is_told_apart(capsys, toy, tmp_path):
    # A generator killed while writing: its lock went with it, its marker stayed.
    child = subprocess.run(
        ["python3", "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'%d' % os.getpid()); os.kill(os.getpid(), 9)",
         str(toy / lock.LOCK_NAME)], timeout=30)
    assert child.returncode == -9
    code, _, err = run_main(capsys, "-data", str(toy), "--results_dir", str(tmp_path / "res"))
    assert code == 0, err  # config.json (written last) is there: the data are complete
    (toy / "config.json").unlink()  # as after a kill midway: generators remove it first
    before = files_of(toy)
    code, out, err = run_main(capsys, "-data", str(toy), "--results_dir", str(tmp_path / "res2"))
    assert_refused(code, out, err, "was left incomplete by a generator that stopped (pid ", "--force")
    assert files_of(toy) == before


def test_a_generator_starting_during_the_load_is_noticed(toy, monkeypatch):
    read = data_utils._read_npz

    def read_then_regenerate(file, *args, **kwargs):
        if file.name == "3.npz" and file.parent.name == "test":
            text = (toy / "config.json").read_text()
            (toy / "config.json").unlink()
            (toy / "config.json").write_text(text)  # a generator's new config.json
        return read(file, *args, **kwargs)

    monkeypatch.setattr(data_utils, "_read_npz", read_then_regenerate)
    with pytest.raises(FLError, match="was rewritten while it was being loaded"):
        load_federated_dataset(str(toy))


def test_generators_write_under_the_lock_and_remove_it(tmp_path, monkeypatch):
    from datagen import dataset_utils, layout, sources

    seen = []
    save = layout.save_npz

    def save_and_look(path, x, y):
        with pytest.raises(FLError, match="being written by a generator"):
            data_utils.check_not_being_written(path.parent.parent, "Digits")
        seen.append(path)
        save(path, x, y)

    monkeypatch.setattr(layout, "save_npz", save_and_look)
    out = tmp_path / "Digits"
    assert dataset_utils.main(["noniid", "-", "dir", "--num-clients", "3", "--out-dir", str(out)], "Digits",
                              sources.load_digits, tmp_path) == 0
    assert len(seen) == 6 and not (out / lock.LOCK_NAME).exists()
    assert len(load_federated_dataset(str(out)).clients) == 3


# ------------------------------------------------------------------------- run flags
@pytest.mark.parametrize("flags,needle", [
    (["-gr", "0"], "-gr must be >= 1, got 0"),
    (["-eg", "0"], "-eg must be >= 1, got 0"),
    (["-lbs", "0"], "-lbs must be >= 1, got 0"),
    (["-ls", "0"], "-ls must be >= 1, got 0"),
    (["-lr", "-0.1"], "-lr must be a finite number > 0, got -0.1"),
    (["-lr", "nan"], "-lr must be a finite number > 0, got nan"),
    (["-ldg", "-0.5"], "-ldg must be a finite number > 0"),
    (["-cdr", "-0.2"], "-cdr must be in [0, 1), got -0.2"),
    (["-tsr", "-1"], "-tsr must be in [0, 1], got -1.0"),
    (["-ssr", "-0.3"], "-ssr must be in [0, 1], got -0.3"),
    (["-jr", "-0.5"], "-jr must be in (0, 1], got -0.5"),
    (["-jr", "0.2"], "-jr 0.2 selects no client of 4 (floor(4 x 0.2) = 0); pass -jr 0.25 or more"),
    (["-pv", "-1"], "-pv must be >= 0"),
    (["-fs", "-2"], "-fs must be >= 0"),
    (["--avg_last", "0"], "--avg_last must be >= 1"),
    (["--checkpoint_every", "-5"], "--checkpoint_every must be >= 0"),
    (["--target_acc", "1.5"], "--target_acc must be in [0, 1]"),
])
def test_run_flags_out_of_range_are_one_line(capsys, toy, tmp_path, flags, needle):
    refused(capsys, toy, tmp_path, needle, extra=flags)


# ---------------------------------------------------------------- the results folder
@pytest.mark.parametrize("where", ["h5py", "rename"])
def test_a_full_disk_while_writing_results_is_one_line_and_leaves_nothing(capsys, toy, tmp_path, monkeypatch, where):
    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if where == "h5py":
        monkeypatch.setattr(result_utils.h5py, "File", no_space)
    else:
        monkeypatch.setattr(result_utils.os, "replace", no_space)
    results = tmp_path / "res"
    code, out, err = run_main(capsys, "-data", str(toy), "--results_dir", str(results))
    assert code == 2 and "Traceback" not in err, err
    assert err.strip().splitlines() == [err.strip()] and "No space left on device" in err
    assert f"cannot write {results}" in err and "--results_dir" in err
    assert not list(results.iterdir()), "no partial or temporary result file"


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs (root only), unmounted afterwards."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_really_full_or_read_only_results_folder(capsys, toy, tiny_tmpfs):
    with open(tiny_tmpfs / "filler", "wb", buffering=0) as filler:
        with pytest.raises(OSError) as full:
            while True:
                filler.write(bytes(4096))
    assert full.value.errno == errno.ENOSPC
    code, out, err = run_main(capsys, "-data", str(toy), "--results_dir", str(tiny_tmpfs))
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "No space left on device" in err
    # no result, temporary, model or lock file
    assert [p.name for p in tiny_tmpfs.iterdir() if p.name != "filler"] == []
    for leftover in tiny_tmpfs.iterdir():
        leftover.unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_tmpfs)], check=True)
    code, out, err = run_main(capsys, "-data", str(toy), "--results_dir", str(tiny_tmpfs / "sub"))
    assert_refused(code, out, err, f"cannot write in {tiny_tmpfs / 'sub'}", "--results_dir")


def test_a_results_dir_that_is_a_file_or_too_long_a_name_is_one_line(capsys, toy, tmp_path, monkeypatch):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("kept")
    for results in (a_file, a_file / "runs" / "x"):
        code, out, err = run_main(capsys, "-data", str(toy), "--results_dir", str(results))
        assert_refused(code, out, err, f"cannot write in {results}", f"{a_file} is a file, not a folder", "--results_dir")
    assert a_file.read_text() == "kept"
    too_long = tmp_path / ("r" * 300)
    code, out, err = run_main(capsys, "-data", str(toy), "--results_dir", str(too_long))
    assert_refused(code, out, err, "File name too long", "--results_dir")
    # an error the OS gives only on some file systems (flock on a network share): still one line

    def no_locks(*_):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr("runner.run_control.fcntl.flock", no_locks)
    code, out, err = run_main(capsys, "-data", str(toy), "--results_dir", str(tmp_path / "res"))
    assert_refused(code, out, err, os.strerror(errno.ENOLCK), "--results_dir")


# -------------------------------------------------------------- missing-dataset hints
def test_missing_dataset_hint_names_only_generators_that_exist(capsys, tmp_path):
    generators = sorted(p.stem.removeprefix("generate_") for p in (REPO / "dataset").glob("generate_*.py"))
    assert len(generators) >= 24
    code, out, err = run_main(capsys, "-data", "NoSuchData", "--results_dir", str(tmp_path / "res"))
    line = assert_refused(code, out, err, "no generator makes 'NoSuchData'", ", ".join(generators))
    assert "generate_NoSuchData" not in line
    code, out, err = run_main(capsys, "-data", "cifar100", "--results_dir", str(tmp_path / "res"))
    line = assert_refused(code, out, err, f"create it with: cd {REPO / 'dataset'} && python generate_Cifar100.py "
                                          f"--out-dir {REPO / 'dataset' / 'cifar100'}")
    code, out, err = run_main(capsys, "-data", "MNIST", "--data_root", str(tmp_path), "--results_dir", str(tmp_path / "r"))
    assert_refused(code, out, err, f"python generate_MNIST.py --out-dir {tmp_path / 'MNIST'}")
