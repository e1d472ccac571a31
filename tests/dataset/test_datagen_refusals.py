"""Bad inputs of the generators: one ``error:`` line, exit status 2,
and every file that was there before byte-identical afterwards.

Most run the generator in-process on scikit-learn's digits (offline, about a second each); the
scripts themselves run where the current folder or the script's own folder matters.
"""

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO
from datagen_helpers import load_client, read_config

from datagen import dataset_utils, layout, sources
from datagen.dataset_utils import MAX_SEED
from datagen.lock import LOCK_NAME

DATASET = REPO / "dataset"


def digits(out, *argv):
    """``generate_Digits.py`` in-process; ``out`` None leaves --out-dir out."""
    where = [] if out is None else ["--out-dir", str(out)]
    return dataset_utils.main([*argv, *where], "Digits", sources.load_digits, DATASET,
                              default_num_clients=10)


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (a folder: its path alone)."""
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else b"<dir>")
            for p in sorted(folder.rglob("*"))}


def refused(capsys, code, *needles, started=False):
    """Exit status 2, one ``error:`` line holding every needle, and nothing on stdout unless the
    generator had ``started`` writing; returns the line."""
    out, err = capsys.readouterr()
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert started or out == "", out
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """A complete Digits folder (4 clients), made once; tests work on copies of it."""
    out = tmp_path_factory.mktemp("gen") / "Digits"
    assert digits(out, "noniid", "-", "dir", "--num-clients", "4") == 0
    return out


@pytest.fixture
def previous(generated, tmp_path):
    """A copy of a finished generation, the folder a rerun with bad options must leave alone."""
    return Path(shutil.copytree(generated, tmp_path / "Digits"))


def user_files(folder: Path) -> Path:
    """A folder of someone's own files, one of which has a client file's name."""
    (folder / "train").mkdir(parents=True)
    (folder / "train" / "99.npz").write_bytes(b"my own file")
    (folder / "notes.txt").write_text("keep me\n")
    return folder


# ------------------------------------------------------------------ item 5: the output folder
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_out_dir_is_refused_and_the_current_folder_kept(capsys, tmp_path, monkeypatch, value):
    monkeypatch.chdir(user_files(tmp_path / "here"))
    before = files_of(Path.cwd())
    err = refused(capsys, digits(value), "--out-dir is empty", "unset shell variable",
                  str(DATASET / "Digits"))
    assert files_of(Path.cwd()) == before, err


def test_the_scripts_refuse_to_write_among_themselves():
    """Run from dataset/ as the README says: neither "" nor "." writes next to the scripts. The
    refusal lists the folder's first entries by name, so it is checked without them: generated
    datasets (``dataset/Digits/`` of ``./prepare.sh --demo``) sort before README.md."""
    before = files_of(DATASET / "datagen") | {p.name: p.read_bytes() for p in DATASET.glob("*.*") if p.is_file()}
    for value, needle in (("", "--out-dir is empty"),
                          (".", f"--out-dir {DATASET} holds files no generator wrote (")):
        proc = subprocess.run([sys.executable, "generate_Digits.py", "--out-dir", value], cwd=DATASET,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.startswith(f"error: {needle}") and proc.stderr.count("\n") == 1
        if value == ".":  # the entries it names are the folder's own
            shown = proc.stderr[len(f"error: {needle}"):].split(")")[0].split(" and ")[0]
            assert all((DATASET / name).exists() for name in shown.split(", ")), proc.stderr
    after = files_of(DATASET / "datagen") | {p.name: p.read_bytes() for p in DATASET.glob("*.*") if p.is_file()}
    assert after == before
    assert not (DATASET / "config.json").exists() and not (DATASET / "train").exists()


@pytest.mark.parametrize("layout,needle", [
    ("strangers", "holds files no generator wrote (notes.txt)"),
    ("stranger_in_train", "holds files no generator wrote (train)"),
    ("unmarked_clients", "holds client files (train/, test/) without the config.json or marker"),
])
def test_a_folder_that_is_not_a_generators_is_refused(capsys, tmp_path, layout, needle):
    folder = tmp_path / "mine"
    (folder / "train").mkdir(parents=True)
    (folder / "train" / "99.npz").write_bytes(b"my own file")
    if layout == "strangers":
        (folder / "notes.txt").write_text("keep me\n")
    elif layout == "stranger_in_train":
        (folder / "train" / "cat.jpg").write_bytes(b"\xff\xd8")
    before = files_of(folder)
    refused(capsys, digits(folder, "--num-clients", "2"), needle, "pass a new or empty folder")
    assert files_of(folder) == before


def test_a_generators_folder_is_regenerated_and_a_stopped_run_resumed(capsys, previous, monkeypatch):
    """Accepted: a finished generation (other options replace it), and the folder that an
    interrupted generator leaves (its marker kept, config.json gone)."""
    (previous / "rawdata").mkdir()  # the download cache
    (previous / ".DS_Store").write_bytes(b"\0")  # a file manager's litter, left alone
    save = layout.save_npz

    def interrupt_at_client_1(path, x, y):
        if path.name == "1.npz":
            raise KeyboardInterrupt
        save(path, x, y)

    monkeypatch.setattr(layout, "save_npz", interrupt_at_client_1)
    assert digits(previous, "iid", "balance", "-", "--num-clients", "3") == 130
    assert (previous / LOCK_NAME).is_file() and not (previous / "config.json").exists()
    monkeypatch.setattr(layout, "save_npz", save)
    capsys.readouterr()
    assert digits(previous, "iid", "balance", "-", "--num-clients", "3") == 0
    assert read_config(previous)["num_clients"] == 3 and not (previous / LOCK_NAME).exists()
    assert sorted(p.name for p in (previous / "train").iterdir()) == ["0.npz", "1.npz", "2.npz"]


# ------------------------------------------------------- item 10: paths that cannot be folders
@pytest.mark.parametrize("where,needle", [
    ("file", "is a file; pass a folder"),
    ("file/sub", "which is a file; pass a folder"),
])
def test_an_out_dir_inside_or_at_a_file_is_refused(capsys, tmp_path, where, needle):
    (tmp_path / "file").write_text("mine\n")
    before = files_of(tmp_path)
    refused(capsys, digits(tmp_path / where), f"--out-dir {tmp_path / where}", needle)
    assert files_of(tmp_path) == before


@pytest.mark.parametrize("path", ["/sys/fedcohort-test/Digits", "/proc/fedcohort-test/Digits"])
def test_an_out_dir_on_a_virtual_file_system_is_refused(capsys, path):
    top = Path("/", Path(path).parts[1])
    if not top.is_dir():
        pytest.skip(f"no {top} here")
    refused(capsys, digits(path), "/fedcohort-test")
    assert not Path(path).parent.exists()


def test_a_read_only_out_dir_is_refused(capsys, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("permissions do not bind this user (root): see the file-system test below")
        refused(capsys, digits(folder / "Digits"), f"{folder} is read-only")
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


def test_a_read_only_file_system_is_one_line(capsys, previous, monkeypatch):
    """EROFS where the writer marker is created (what a read-only mount gives, even to root)."""
    before = files_of(previous)
    real_open = os.open

    def read_only(path, flags, *args):
        if str(path).endswith(LOCK_NAME):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    refused(capsys, digits(previous, "iid", "balance", "-", "--num-clients", "3"),
            f"cannot write {previous / LOCK_NAME} (Read-only file system)")
    monkeypatch.undo()
    assert files_of(previous) == before


def test_a_write_failing_midway_is_one_line(capsys, tmp_path, monkeypatch):
    def disk_full(path, x, y):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(layout, "save_npz", disk_full)
    refused(capsys, digits(tmp_path / "Digits", "--num-clients", "2"),
            "(No space left on device); free some space or pass another --out-dir", started=True)
    # what the loader will say of it: incomplete (no config.json, the marker left)
    assert (tmp_path / "Digits" / LOCK_NAME).exists() and not (tmp_path / "Digits" / "config.json").exists()


# ------------------------------------------------ item 8: datasets with clients left without data
def test_pat_with_many_clients_gives_every_client_its_classes(tmp_path, capsys):
    """600 clients on 1,797 digits: each holds exactly 2 labels, each label at least one sample
    (PFLlib's random sizes left 595 clients empty)."""
    out = tmp_path / "Digits"
    assert digits(out, "noniid", "-", "pat", "--num-clients", "600") == 0
    assert "warning" not in capsys.readouterr().err
    stats = read_config(out)["Size of samples for labels in clients"]
    assert len(stats) == 600
    assert all(len(pairs) == 2 and min(count for _, count in pairs) >= 1 for pairs in stats)
    assert min(read_config(out)["train_samples"]) >= 1


def test_pat_with_more_clients_than_a_class_can_serve_is_refused(capsys, previous):
    before = files_of(previous)
    refused(capsys, digits(previous, "noniid", "-", "pat", "--num-clients", "1500"),
            "pat: class 0 has 178 samples for the 300 clients that hold it",
            "lower --num-clients or --class-per-client")
    assert files_of(previous) == before


def test_a_train_ratio_leaving_no_training_sample_is_refused(capsys, previous):
    before = files_of(previous)
    refused(capsys, digits(previous, "--train-ratio", "0.001"),
            "--train-ratio 0.001 leaves every client without training samples",
            "raise --train-ratio")
    assert files_of(previous) == before


def test_clients_without_test_samples_get_one_warning(capsys, tmp_path):
    """A shared 0.1 % hold-out (2 samples) over 10 clients: legitimate, but 8 clients get no test
    sample; one warning line says so, and the dataset is written."""
    out = tmp_path / "Digits"
    assert digits(out, "iid", "balance", "-", "--test-split", "global", "--train-ratio", "0.999") == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "warning: --train-ratio 0.999 leaves 8 of 10 clients without test samples")
    assert sum(len(load_client(out, "test", c)[1]) for c in range(10)) == 2


def test_client_size_checks_by_hand():
    parts = [np.arange(5), np.arange(5, 6), np.arange(6, 10)]
    options = {"partition": "pat", "train_ratio": 0.5}
    train = [np.arange(2), np.arange(0), np.arange(2)]
    test = [np.arange(3), np.arange(1), np.arange(2)]
    dataset_utils.check_client_sizes(parts, train, test, options)  # a warning only
    with pytest.raises(dataset_utils.DatasetError, match=r"leaves 1 of 3 clients without samples \(1\)"):
        dataset_utils.check_client_sizes([parts[0], np.arange(0), parts[2]], train, test, options)
    with pytest.raises(dataset_utils.DatasetError, match="every client without test samples"):
        dataset_utils.check_client_sizes(parts, train, [np.arange(0)] * 3, options)


def test_size_checks_name_five_clients_and_count_the_rest(capsys):
    sizes = np.full(9, 4)
    test = np.array([0, 2, 0, 0, 2, 0, 0, 0, 0])
    dataset_utils.check_split_sizes(sizes, sizes - test, test, {"partition": "dir", "train_ratio": 0.9})
    assert "leaves 7 of 9 clients without test samples (0, 2, 3, 5, 6 and 2 more)" in capsys.readouterr().err


# ------------------------------------------------------------------------ item 11: seeds
@pytest.mark.parametrize("seed", ["-1", str(MAX_SEED + 1)])
def test_a_seed_outside_32_bits_is_refused_by_the_generators(capsys, previous, seed):
    before = files_of(previous)
    refused(capsys, digits(previous, "--seed", seed), f"--seed must be between 0 and {MAX_SEED}, got {seed}")
    assert files_of(previous) == before


def test_main_takes_the_same_seed_range(capsys, tmp_path):
    import main
    from toydata import make_dataset

    data = make_dataset(tmp_path / "data", num_clients=2, input_shape=(4,))
    results = tmp_path / "res"
    for argv, needle in ((["--seed", "-1"], f"--seed must be in [0, {MAX_SEED}], got -1"),
                         (["--seed", str(MAX_SEED + 1)], f"got {MAX_SEED + 1}"),
                         (["--seed", str(MAX_SEED), "-t", "2"],
                          f"--seed {MAX_SEED} with -t 2 runs seeds past {MAX_SEED}; "
                          f"pass --seed {MAX_SEED - 1} or less")):
        code = main.main(["-data", str(data), "-dev", "cpu", "--progress", "False",
                          "--results_dir", str(results), *argv])
        out, err = capsys.readouterr()
        assert code == 2 and needle in err and err.count("\n") == 1, err
    assert not results.exists() or list(results.iterdir()) == []
    assert main.MAX_SEED == MAX_SEED
