"""PFLlib folder conversion on the real PFLlib sample (clients 1, 2, 6, 7 of 20)."""

import json
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import PFLLIB_SAMPLE, REPO
from datagen_helpers import load_client, read_config

from datagen.convert import convert_pfllib_folder
from datagen.errors import DatasetError, ReadError
from datagen.legacy import load_pfllib_npz

SAMPLE_IDS = [1, 2, 6, 7]
STATS_KEY = "Size of samples for labels in clients"

needs_sample = pytest.mark.skipif(not (PFLLIB_SAMPLE / "config.json").is_file(),
                                  reason=f"PFLlib sample not found in {PFLLIB_SAMPLE}")


def convert_script(*args):
    return subprocess.run([sys.executable, "convert_pfllib.py", *map(str, args)],
                          cwd=REPO / "dataset", capture_output=True, text=True, timeout=120)


@needs_sample
def test_refuses_without_trust_pickle(tmp_path):
    with pytest.raises(DatasetError, match="--trust-pickle"):
        convert_pfllib_folder(PFLLIB_SAMPLE, tmp_path / "out", trust_pickle=False)
    assert not (tmp_path / "out").exists()
    proc = convert_script(PFLLIB_SAMPLE, "--out-dir", tmp_path / "out")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: refusing to load") and "execute code" in proc.stderr


@needs_sample
def test_converted_sample_matches_pfllib_statistics(tmp_path):
    out = tmp_path / "MNIST"
    proc = convert_script(PFLLIB_SAMPLE, "--out-dir", out, "--trust-pickle", "--name", "MNIST")
    assert proc.returncode == 0, proc.stderr
    assert "can execute code" in proc.stderr and "differ" not in proc.stderr
    original = json.loads((PFLLIB_SAMPLE / "config.json").read_text())
    config = read_config(out)
    assert config["clients_present"] == SAMPLE_IDS
    assert config["format"] == "npz-xy-v1" and config["input_shape"] == [1, 28, 28]
    assert config["dataset"] == "MNIST" and config["num_classes"] == 10
    assert config[STATS_KEY] == original[STATS_KEY] and config["num_clients"] == 20
    assert sorted(p.name for p in (out / "train").iterdir()) == [f"{i}.npz" for i in SAMPLE_IDS]
    for client in range(20):
        if client not in SAMPLE_IDS:
            assert config["train_samples"][client] is None
            continue
        x_tr, y_tr = load_client(out, "train", client)
        x_te, y_te = load_client(out, "test", client)
        assert x_tr.dtype == np.float32 and y_tr.dtype == np.int64
        assert x_tr.min() >= -1 and x_tr.max() <= 1
        values, counts = np.unique(np.concatenate([y_tr, y_te]), return_counts=True)
        assert [[int(v), int(c)] for v, c in zip(values, counts)] == original[STATS_KEY][client]
        assert config["train_samples"][client] == len(y_tr)
        legacy_x, legacy_y = load_pfllib_npz(PFLLIB_SAMPLE / "test" / f"{client}.npz")
        np.testing.assert_array_equal(legacy_x, x_te)
        np.testing.assert_array_equal(legacy_y, y_te)


def write_pfllib_folder(folder, clients, payload=None):
    """A PFLlib-layout folder: npz files each holding a pickled dict ``data``."""
    for part in ("train", "test"):
        (folder / part).mkdir(parents=True, exist_ok=True)
        for c in clients:
            data = payload if payload is not None else {
                "x": np.zeros((3, 1, 4, 4), np.float32), "y": np.array([0, 1, 1])}
            with open(folder / part / f"{c}.npz", "wb") as fh:
                np.savez_compressed(fh, data=data)
    config = {"num_clients": 3, "non_iid": False, "balance": True, "partition": None,
              STATS_KEY: [[[0, 2], [1, 5]]] * 3, "alpha": 0.1, "batch_size": 10}
    (folder / "config.json").write_text(json.dumps(config))


class _Marker:
    """Unpickling this creates a file: stands in for code an untrusted file could run."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_untrusted_pickle_not_loaded_without_flag(tmp_path):
    marker = tmp_path / "executed"
    write_pfllib_folder(tmp_path / "src", [0], payload=np.array(_Marker(marker), dtype=object))
    with pytest.raises(DatasetError):
        convert_pfllib_folder(tmp_path / "src", tmp_path / "out", trust_pickle=False)
    assert not marker.exists()


def test_half_present_client_and_empty_folder_rejected(tmp_path):
    src = tmp_path / "src"
    write_pfllib_folder(src, [0, 2])
    (src / "test" / "2.npz").unlink()
    with pytest.raises(ReadError, match="client 2"):
        convert_pfllib_folder(src, tmp_path / "out", trust_pickle=True)
    shutil.rmtree(src / "train")
    shutil.rmtree(src / "test")
    write_pfllib_folder(src, [])
    with pytest.raises(ReadError, match="no client files"):
        convert_pfllib_folder(src, tmp_path / "out", trust_pickle=True)


def test_small_folder_round_trip_and_overwrite_guard(tmp_path, capsys):
    src = tmp_path / "src"
    write_pfllib_folder(src, [0, 1, 2])
    config = convert_pfllib_folder(src, tmp_path / "out", trust_pickle=True)
    assert config["clients_present"] == [0, 1, 2] and config["input_shape"] == [1, 4, 4]
    assert "differ" in capsys.readouterr().err  # the fake statistic does not match the files
    with pytest.raises(DatasetError, match="--force"):
        convert_pfllib_folder(src, tmp_path / "out", trust_pickle=True)
    convert_pfllib_folder(src, tmp_path / "out", trust_pickle=True, force=True)
    with pytest.raises(DatasetError, match="--in-place"):
        convert_pfllib_folder(src, src, trust_pickle=True)
    with pytest.raises(ReadError, match="not a PFLlib npz"):
        (src / "train" / "0.npz").write_bytes(pickle.dumps("junk"))
        load_pfllib_npz(src / "train" / "0.npz")


@needs_sample
def test_in_place_conversion_of_a_copy_resumes_and_then_is_a_noop(tmp_path):
    src = tmp_path / "MNIST"
    for path in PFLLIB_SAMPLE.rglob("*"):
        if path.is_file():  # byte copies: the shared files are read-only
            target = src / path.relative_to(PFLLIB_SAMPLE)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    # Pretend an earlier run was interrupted after converting client 6's train file.
    x, y = load_pfllib_npz(src / "train" / "6.npz")
    with open(src / "train" / "6.npz", "wb") as fh:
        np.savez_compressed(fh, x=x, y=y)
    refused = convert_script(src, "--trust-pickle")
    assert refused.returncode == 2 and "--in-place" in refused.stderr
    proc = convert_script(src, "--trust-pickle", "--in-place")
    assert proc.returncode == 0, proc.stderr
    config = read_config(src)
    assert config["format"] == "npz-xy-v1" and config["clients_present"] == SAMPLE_IDS
    for client in SAMPLE_IDS:
        _, y_tr = load_client(src, "train", client)
        assert config["train_samples"][client] == len(y_tr)
    again = convert_script(src, "--trust-pickle", "--in-place")
    assert again.returncode == 0 and "nothing to do" in again.stdout


@pytest.mark.parametrize("where,needle", [
    ("file", "--out-dir {tmp}/file is a file; pass a folder"),
    ("file/sub", "--out-dir {tmp}/file/sub is inside {tmp}/file, which is a file"),
    ("", "--out-dir is empty"),
    ("mine", "--out-dir {tmp}/mine holds files no generator wrote (notes.txt)"),
])
def test_an_out_dir_that_cannot_take_the_copy_is_one_line(tmp_path, capsys, monkeypatch, where, needle):
    import convert_pfllib

    write_pfllib_folder(tmp_path / "src", [0, 1])
    (tmp_path / "file").write_text("mine\n")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me\n")
    monkeypatch.chdir(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    code = convert_pfllib.main([str(tmp_path / "src"), "--out-dir",
                                where and str(tmp_path / where), "--trust-pickle"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("error: " + needle.format(tmp=tmp_path)), err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
