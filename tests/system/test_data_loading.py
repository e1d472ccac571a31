"""The loader holds every split once: clients' tensors are views of one merged tensor per split."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from toydata import make_dataset

from fldata.loading import load_federated_dataset
from utils.errors import FLError


def _file(folder, split, cid):
    with np.load(folder / split / f"{cid}.npz") as archive:
        return archive["x"], archive["y"]


def test_clients_are_views_of_the_merged_split_and_equal_their_files(tmp_path):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 4, 4), train_sizes=[5, 0, 9], test_size=4)
    dataset = load_federated_dataset(str(folder))
    for split in ("train", "test"):
        (x_all, y_all), owner = dataset.merged[split], dataset.owners(split)
        start = 0
        for index, client in enumerate(dataset.clients):
            x, y = _file(folder, split, client.cid)
            cx, cy = getattr(client, f"{split}_x"), getattr(client, f"{split}_y")
            assert client.inputs(split).dtype == torch.float32 and cy.dtype == torch.int64
            assert torch.equal(client.inputs(split), torch.from_numpy(x)) and torch.equal(cy, torch.from_numpy(y))
            if len(y):  # shares the merged storage at its own rows: no second copy of the data
                assert cx.data_ptr() == x_all[start:].data_ptr() and cy.data_ptr() == y_all[start:].data_ptr()
            assert torch.equal(owner[start : start + len(y)], torch.full((len(y),), index))
            start += len(y)
        assert start == len(x_all) == len(y_all) == len(owner)


def test_few_shot_keeps_the_first_samples_of_each_label_in_file_order(tmp_path):
    folder = make_dataset(tmp_path, num_clients=2, input_shape=(2,), train_sizes=[20, 25])
    dataset = load_federated_dataset(str(folder), few_shot=2)
    for client in dataset.clients:
        x, y = _file(folder, "train", client.cid)
        rows = sorted(i for label in set(y.tolist()) for i in np.flatnonzero(y == label)[:2])
        assert torch.equal(client.train_y, torch.from_numpy(y[rows]))
        assert torch.equal(client.inputs("train"), torch.from_numpy(x[rows]))
        assert client.num_test == 12  # the test split is never cut


def test_inputs_of_the_wrong_shape_are_one_clear_error(tmp_path):
    folder = make_dataset(tmp_path, num_clients=2, input_shape=(1, 4, 4))
    np.savez(folder / "train" / "1.npz", x=np.zeros((3, 1, 5, 5), np.float32), y=np.zeros(3, np.int64))
    with pytest.raises(FLError, match=r"client 1 inputs have shape \[1, 5, 5\].*--force"):
        load_federated_dataset(str(folder))


def test_input_shape_is_taken_from_the_files_when_config_lacks_it(tmp_path):
    folder = make_dataset(tmp_path, num_clients=2, input_shape=(3, 2, 2))
    config = json.loads((folder / "config.json").read_text())
    del config["input_shape"]
    (folder / "config.json").write_text(json.dumps(config))
    dataset = load_federated_dataset(str(folder))
    assert dataset.input_shape == (3, 2, 2)
    assert dataset.merged["train"][0].shape[1:] == (3, 2, 2)


def test_a_dataset_larger_than_the_gpus_free_memory_is_one_line_before_it_is_copied(tmp_path, monkeypatch):
    import fldata.loading as data_utils

    folder = make_dataset(tmp_path, num_clients=2, input_shape=(1, 4, 4), train_sizes=[10, 6], test_size=4)
    # 24 samples of 16 float32 inputs plus an 8-byte label each: 1,728 bytes
    monkeypatch.setattr(data_utils, "device_room", lambda device: (1_727, 8 * 1024**3))  # as a GPU would answer
    with pytest.raises(FLError, match=r"^dataset .* needs 0\.0 GiB on cpu \(24 samples, loaded whole onto the training "
                                      r"device\) and 0\.0 of its 8\.0 GiB are free: run with -dev cpu"):
        load_federated_dataset(str(folder), compact=False)
    monkeypatch.setattr(data_utils, "device_room", lambda device: (1_728, 8 * 1024**3))
    assert len(load_federated_dataset(str(folder), compact=False).split("train")[1]) == 16
