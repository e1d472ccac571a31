"""Two FedAvg rounds through ``main.main`` for a text model and a time-series model on tiny data the
tests write, integer token ids through the loader, and one-line errors for misfits."""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from test_main import run_main  # main.main on the CPU: (exit code, stdout, stderr)
from toydata import make_dataset
from fldata.loading import load_federated_dataset


def write_token_dataset(root: Path, name: str = "TinyText", num_clients: int = 3, length: int = 12,
                        vocab: int = 40, num_classes: int = 3, seed: int = 0) -> Path:
    """Right-padded int64 token ids [n, length] (id 0 = padding) whose class shows in their words:
    each class draws most tokens from its own block of the vocabulary."""
    rng = np.random.default_rng(seed)
    folder = root / name
    block = (vocab - 1) // num_classes
    for cid in range(num_clients):
        for split, size in (("train", 20 + 5 * cid), ("test", 8)):
            (folder / split).mkdir(parents=True, exist_ok=True)
            y = rng.integers(0, num_classes, size).astype(np.int64)
            x = np.zeros((size, length), dtype=np.int64)
            for row, label in enumerate(y):
                words = int(rng.integers(3, length + 1))
                own = 1 + label * block + rng.integers(0, block, words)
                noise = rng.integers(1, vocab, words)
                x[row, :words] = np.where(rng.random(words) < 0.7, own, noise)
            np.savez_compressed(folder / split / f"{cid}.npz", x=x, y=y)
    config = {"num_clients": num_clients, "num_classes": num_classes, "input_shape": [length],
              "dataset": name, "vocab_size": vocab, "max_len": length, "format": "npz-xy-v1"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def text_data(tmp_path_factory):
    return write_token_dataset(tmp_path_factory.mktemp("text"))


def test_token_ids_are_loaded_as_int64_also_with_compact_inputs(text_data):
    for compact in (True, False):
        dataset = load_federated_dataset(str(text_data), compact=compact)
        assert dataset.input_table is None
        assert dataset.merged["train"][0].dtype == dataset.merged["test"][0].dtype == torch.int64
        assert dataset.clients[0].inputs("train").dtype == dataset.sample_inputs(2).dtype == torch.int64
        with np.load(text_data / "train" / "1.npz") as archive:
            assert np.array_equal(dataset.clients[1].train_x.numpy(), archive["x"])


def _read(path: Path):
    with h5py.File(path) as f:
        return f["rs_test_acc"][()], f["rs_train_loss"][()]


@pytest.mark.parametrize("model,engine,lr", [("LSTM", "sequential", 0.1), ("TextCNN", "threaded", 0.02),
                                             ("fastText", "batched", 0.1)])
def test_two_fedavg_rounds_on_token_ids(text_data, tmp_path, capsys, model, engine, lr):
    code, out, err = run_main(capsys, "-data", str(text_data), "-m", model, "-vs", "40", "-fd", "16", "-gr", "2",
                              "-lr", str(lr), "--engine", engine, "--results_dir", str(tmp_path))
    assert code == 0, err
    acc, loss = _read(tmp_path / "TinyText_FedAvg_test_0.h5")
    assert acc.shape == loss.shape == (3,) and np.isfinite(loss).all()
    assert loss[-1] < loss[0]  # two rounds of FedAvg lower the training loss


def test_two_fedavg_rounds_on_sensor_windows(tmp_path, capsys):
    """HAR's shape: 9 signals x 1 x 128 steps, 6 activities."""
    data = make_dataset(tmp_path, name="TinyHAR", num_clients=3, input_shape=(9, 1, 128), num_classes=6,
                        train_sizes=[12, 15, 9], test_size=6)
    code, out, err = run_main(capsys, "-data", str(data), "-m", "HARCNN", "-gr", "2", "-lr", "0.05",
                              "--results_dir", str(tmp_path / "results"))
    assert code == 0, err
    acc, loss = _read(tmp_path / "results" / "TinyHAR_FedAvg_test_0.h5")
    assert acc.shape == (3,) and np.isfinite(loss).all() and loss[-1] < loss[0]


def test_a_vocabulary_smaller_than_the_data_is_one_line(text_data, tmp_path, capsys):
    code, _, err = run_main(capsys, "-data", str(text_data), "-m", "fastText", "-vs", "30", "-fd", "8", "-gr", "1",
                            "--results_dir", str(tmp_path))
    assert code == 2
    assert err.strip().count("\n") == 0 and "pass -vs 40" in err and "Traceback" not in err


def _embedding_rows(folder: Path, *flags: str) -> int:
    import main

    args = main.parse_args(["-data", str(folder), "-m", "fastText", "-fd", "8", "-dev", "cpu", *flags])
    given = vars(args).copy()
    module = main.build_model(args, load_federated_dataset(str(folder)), torch.device("cpu"))
    assert vars(args) == given  # the run's settings (stored in its result file) stay as given
    return next(m.num_embeddings for m in module.modules() if isinstance(m, torch.nn.Embedding))


def test_without_vs_text_models_take_the_vocabulary_from_config_json(tmp_path):
    folder = write_token_dataset(tmp_path, vocab=120)  # ids up to 119: PFLlib's -vs 80 is too small
    assert _embedding_rows(folder) == 120
    assert _embedding_rows(folder, "-vs", "300") == 300  # an explicit -vs wins


def test_without_vs_or_a_recorded_vocabulary_pfllibs_80_applies(tmp_path, capsys):
    folder = write_token_dataset(tmp_path, vocab=120)
    config = json.loads((folder / "config.json").read_text())
    del config["vocab_size"]  # a PFLlib folder records none
    (folder / "config.json").write_text(json.dumps(config))
    code, _, err = run_main(capsys, "-data", str(folder), "-m", "fastText", "-fd", "8", "-gr", "1",
                            "--results_dir", str(tmp_path))
    assert code == 2 and err.strip().count("\n") == 0
    assert "(-vs 80); pass -vs 120" in err and "Traceback" not in err


def test_an_explicit_vs_below_the_recorded_vocabulary_is_one_line(tmp_path, capsys):
    folder = write_token_dataset(tmp_path, vocab=120)
    code, _, err = run_main(capsys, "-data", str(folder), "-m", "fastText", "-vs", "80", "-fd", "8", "-gr", "1",
                            "--results_dir", str(tmp_path))
    assert code == 2 and err.strip().count("\n") == 0 and "pass -vs 120" in err


def test_a_bad_recorded_vocabulary_is_one_line(tmp_path, capsys):
    folder = write_token_dataset(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": "many"}))
    code, _, err = run_main(capsys, "-data", str(folder), "-m", "fastText", "-fd", "8", "-gr", "1",
                            "--results_dir", str(tmp_path))
    assert code == 2 and err.strip().count("\n") == 0 and "vocab_size 'many'" in err


@pytest.mark.parametrize("model,data", [("LSTM", "image"), ("CNN", "text"), ("AlexNet", "image")])
def test_a_model_that_does_not_fit_the_data_is_one_line(text_data, tmp_path, capsys, model, data):
    folder = text_data if data == "text" else make_dataset(tmp_path, num_clients=2, input_shape=(3, 32, 32))
    code, _, err = run_main(capsys, "-data", str(folder), "-m", model, "-gr", "1", "--results_dir", str(tmp_path))
    assert code == 2
    assert err.strip().count("\n") == 0 and "does not fit" in err and "Traceback" not in err


def test_without_training_data_the_probe_has_the_inputs_dtype(tmp_path):
    folder = write_token_dataset(tmp_path, num_clients=2)
    for cid in range(2):  # empty training splits, test data kept
        np.savez_compressed(folder / "train" / f"{cid}.npz", x=np.zeros((0, 12), np.int64), y=np.zeros(0, np.int64))
    dataset = load_federated_dataset(str(folder))
    probe = dataset.sample_inputs(2)
    assert probe.dtype == torch.int64 and probe.shape == (2, 12) and not probe.any()
