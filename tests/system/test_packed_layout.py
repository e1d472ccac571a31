"""The packed dataset layout (dataset/datagen/layout.py, utils/data_utils.load_packed) against the
per-client npz files: the same data, the same runs bit for bit on every engine, and one-line
refusals of packed files that are truncated, overlap or lie about their sizes."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from datagen import dataset_utils
from datagen.relayout import check_folder, convert_layout
from datagen.errors import DatasetError
from fltest import assert_same_training, engine_run
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from fldata.loading import PackedClients, load_federated_dataset
from utils.errors import FLError

TINY = ["--dim", "6", "--num-classes", "3", "--size-log-mean", "2", "--size-log-std", "0.5", "--size-min", "6"]


def _synthetic(folder: Path, clients: int = 5, *extra: str) -> Path:
    assert dataset_utils.main_synthetic(["--num-clients", str(clients), "--out-dir", str(folder), *TINY, *extra],
                                        folder.parent) == 0
    return folder


def _image_folder(folder: Path, sizes=(3, 12, 25, 40, 17), classes: int = 3) -> Path:
    """An npz folder of flattened 8-bit images normalised like PFLlib's (256 levels: held as uint8 codes)."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        (folder / split).mkdir(parents=True)
    for c, n in enumerate(sizes):
        for split, rows in (("train", n), ("test", 4)):
            x = (rng.integers(0, 256, (rows, 16)) / 127.5 - 1).astype(np.float32)
            np.savez(folder / split / f"{c}.npz", x=x, y=rng.integers(0, classes, rows))
    config = {"num_clients": len(sizes), "num_classes": classes, "input_shape": [16], "format": "npz-xy-v1",
              "train_samples": list(sizes), "test_samples": [4] * len(sizes)}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    npz = _synthetic(root / "npz")
    packed = _synthetic(root / "packed", 5, "--layout", "packed")
    images = _image_folder(root / "images")
    convert_layout(images, root / "images_packed", "packed")
    return {"npz": npz, "packed": packed, "images": images, "images_packed": root / "images_packed"}


def test_generator_writes_the_same_arrays_in_either_layout(folders):
    npz, packed = (load_federated_dataset(str(folders[k])) for k in ("npz", "packed"))
    assert isinstance(packed.clients, PackedClients) and isinstance(npz.clients, list)
    for split in ("train", "test"):
        for a, b in zip((*npz.split(split), npz.owners(split)), (*packed.split(split), packed.owners(split))):
            assert a.dtype == b.dtype and torch.equal(a, b)
        assert npz.offsets(split) == packed.offsets(split)
        assert np.array_equal(npz.bounds(split), packed.bounds(split))
    for i in range(len(npz.clients)):
        for name in ("train_x", "train_y", "test_x", "test_y"):
            assert torch.equal(getattr(npz.clients[i], name), getattr(packed.clients[i], name))
    config = json.loads((folders["packed"] / "config.json").read_text())
    assert config["format"] == "packed-npy-v1" and "train_samples" not in config
    assert config["train_rows"] == len(packed.split("train")[1])


def test_conversion_goes_both_ways_bit_for_bit(folders, tmp_path):
    convert_layout(folders["packed"], tmp_path / "npz", "npz")
    convert_layout(tmp_path / "npz", tmp_path / "packed", "packed")
    for name in ("x.npy", "y.npy", "offsets.npy"):
        for split in ("train", "test"):
            assert (tmp_path / "packed" / split / name).read_bytes() == (folders["packed"] / split / name).read_bytes()
    back = json.loads((tmp_path / "npz" / "config.json").read_text())
    original = json.loads((folders["npz"] / "config.json").read_text())
    assert back == original
    assert check_folder(tmp_path / "npz")["num_clients"] == 5
    with pytest.raises(DatasetError, match="already in the packed layout"):
        convert_layout(folders["packed"], tmp_path / "other", "packed")


@pytest.mark.parametrize("engine", ["sequential", "threaded", "batched"])
@pytest.mark.parametrize("pair", [("npz", "packed"), ("images", "images_packed")])
def test_runs_on_either_layout_are_identical(folders, engine, pair):
    assert load_federated_dataset(str(folders["images"])).input_table is not None  # npz: uint8 codes
    runs = [engine_run("FedAvg", engine, load_federated_dataset(str(folders[k])), global_rounds=2, eval_auc=True)
            for k in pair]
    assert_same_training(*runs, exact=True)
    assert runs[0].history.test_auc == runs[1].history.test_auc


def test_a_personalised_algorithm_evaluates_the_same_on_either_layout(folders):
    runs = [engine_run("FedPer", "sequential", load_federated_dataset(str(folders[k])), global_rounds=2)
            for k in ("npz", "packed")]
    assert_same_training(*runs, exact=True)


# ------------------------------------------------------------------ refusals
def _copy(folders, tmp_path) -> Path:
    out = tmp_path / "copy"
    convert_layout(folders["npz"], out, "packed")
    return out


def _refused(folder: Path, match: str) -> None:
    with pytest.raises(FLError, match=match) as info:
        load_federated_dataset(str(folder))
    assert "\n" not in str(info.value)


def test_a_truncated_file_is_refused(folders, tmp_path):
    folder = _copy(folders, tmp_path)
    data = (folder / "train" / "x.npy").read_bytes()
    (folder / "train" / "x.npy").write_bytes(data[:-7])
    _refused(folder, "x.npy is truncated")


def test_a_file_longer_than_its_header_is_refused(folders, tmp_path):
    folder = _copy(folders, tmp_path)
    with open(folder / "test" / "y.npy", "ab") as handle:
        handle.write(b"\0" * 8)
    _refused(folder, "header lies about its size")


def _rewrite_offsets(folder: Path, change) -> None:
    offsets = np.load(folder / "train" / "offsets.npy")
    change(offsets)
    np.save(folder / "train" / "offsets.npy", offsets)


def test_overlapping_offsets_are_refused(folders, tmp_path):
    folder = _copy(folders, tmp_path)
    _rewrite_offsets(folder, lambda o: o.__setitem__(2, o[3] + 1))
    _refused(folder, "client 2's rows end before they start")


def test_out_of_range_offsets_are_refused(folders, tmp_path):
    folder = _copy(folders, tmp_path)
    _rewrite_offsets(folder, lambda o: o.__setitem__(-1, o[-1] + 5))
    _refused(folder, "offsets run from 0 to")


def test_a_config_that_lies_about_the_rows_or_clients_is_refused(folders, tmp_path):
    folder = _copy(folders, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "test_rows": config["test_rows"] + 1}))
    _refused(folder, "records test_rows")
    (folder / "config.json").write_text(json.dumps({**config, "num_clients": 4}))
    _refused(folder, r"expected int64 \[5\] \(4 clients")


def test_labels_out_of_range_are_refused_at_start_up(folders, tmp_path):
    folder = _copy(folders, tmp_path)
    y = np.load(folder / "test" / "y.npy")
    y[3] = 7
    np.save(folder / "test" / "y.npy", y)
    _refused(folder, r"labels 0\.\.7, outside \[0, 3\)")


def test_nan_inputs_are_refused_when_the_client_is_first_used(folders, tmp_path):
    folder = _copy(folders, tmp_path)
    offsets = np.load(folder / "train" / "offsets.npy")
    x = np.load(folder / "train" / "x.npy")
    x[offsets[3] + 1, 2] = np.nan
    np.save(folder / "train" / "x.npy", x)
    dataset = load_federated_dataset(str(folder))  # start-up reads no inputs
    client = dataset.clients[3]
    client.inputs("test"), dataset.clients[2].inputs("train")
    # the copy sent to another process (a Ray actor) is checked as a first use is
    assert torch.equal(dataset.clients[2].owned().train_x, dataset.clients[2].train_x)
    with pytest.raises(FLError, match="client 3 has 1 NaN or infinite train input values"):
        client.owned()
    with pytest.raises(FLError, match="client 3 has 1 NaN or infinite train input values") as info:
        client.inputs("train", slice(0, 2))
    assert "\n" not in str(info.value)
    with pytest.raises(DatasetError, match="client 3 .train.: NaN"):
        check_folder(folder)


def test_a_packed_folder_is_regenerated_in_place_and_skipped_when_current(folders, tmp_path, capsys):
    folder = _synthetic(tmp_path / "s", 5, "--layout", "packed")
    capsys.readouterr()
    _synthetic(folder, 5, "--layout", "packed")
    assert "skipped" in capsys.readouterr().out
    _synthetic(folder, 5, "--layout", "npz", "--force")  # the packed files make way for npz ones
    assert sorted(p.name for p in (folder / "train").iterdir()) == [f"{i}.npz" for i in range(5)]


def test_auto_layout_is_packed_above_the_threshold(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_utils, "resolve_layout",
                        lambda requested, n: requested if requested != "auto" else ("packed" if n > 3 else "npz"))
    small, large = _synthetic(tmp_path / "small", 3), _synthetic(tmp_path / "large", 4)
    assert json.loads((small / "config.json").read_text())["format"] == "npz-xy-v1"
    assert json.loads((large / "config.json").read_text())["format"] == "packed-npy-v1"


# ------------------------------------------------------------------ a large population
def _packed_population(folder: Path, clients: int, rows_per_client: int = 3, dim: int = 2) -> Path:
    """A packed folder of ``clients`` clients written with numpy (the generator's arrays, not its speed)."""
    rng = np.random.default_rng(0)
    rows = {"train": clients * rows_per_client, "test": clients}
    for split, count in rows.items():
        (folder / split).mkdir(parents=True)
        np.save(folder / split / "x.npy", rng.standard_normal((count, dim), dtype=np.float32))
        np.save(folder / split / "y.npy", rng.integers(0, 3, count))
        np.save(folder / split / "offsets.npy", np.arange(clients + 1, dtype=np.int64) * (count // clients))
    config = {"num_clients": clients, "num_classes": 3, "input_shape": [dim], "format": "packed-npy-v1",
              "train_rows": rows["train"], "test_rows": rows["test"], "content_digest": "test"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the RSS from /proc")
def test_a_hundred_thousand_clients_load_in_bounded_time_and_memory(tmp_path):
    import time

    folder = _packed_population(tmp_path / "large", 100_000)
    before, start = _rss_mb(), time.process_time()
    dataset = load_federated_dataset(str(folder))
    clients = [dataset.clients[i] for i in (0, 50_000, 99_999)]
    seconds, grown = time.process_time() - start, _rss_mb() - before
    assert len(dataset.clients) == 100_000 and [c.num_train for c in clients] == [3, 3, 3]
    assert torch.equal(clients[1].inputs("train"), torch.from_numpy(np.load(folder / "train" / "x.npy")[150_000:150_003]))
    # mapping, headers, offsets and one pass over 400,000 labels; the owner index (8 bytes a row)
    assert seconds < 2.0, seconds
    assert grown < 60, grown
    assert np.array_equal(dataset.bounds("test")[:3], [0, 1, 2])


def test_a_run_on_a_packed_folder_resumes_exactly_and_notices_a_regenerated_folder(tmp_path, monkeypatch, capsys):
    from test_resume import interrupted_and_resumed, run_main, stop_after_round
    from toydata import make_dataset

    npz = make_dataset(tmp_path / "toy", num_clients=4, input_shape=(1, 8, 8), train_sizes=[24, 31, 18, 40])
    packed = tmp_path / "packed"
    convert_layout(npz, packed, "packed")
    interrupted_and_resumed(packed, tmp_path, monkeypatch, "FedAvg", "--eval_clients", "3")
    with monkeypatch.context() as patch:
        stop_after_round(patch, 1, "signal")
        assert run_main(packed, tmp_path / "again", "FedAvg") == 130
    config = json.loads((packed / "config.json").read_text())
    (packed / "config.json").write_text(json.dumps({**config, "content_digest": "regenerated"}))
    capsys.readouterr()
    assert run_main(packed, tmp_path / "again", "FedAvg", "--resume") == 2
    assert "is not the one the checkpoint was trained on" in capsys.readouterr().err

