"""Compact inputs (``--compact_inputs``): 8-bit inputs held as uint8 codes, decoded bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from toydata import make_dataset

from fltest import build_server, make_args
from fltest import one_thread  # noqa: F401  (an autouse fixture: importing it switches it on here)
from fldata.loading import _InputCoder, decode_inputs, load_federated_dataset


def _file(folder, split, cid):
    with np.load(folder / split / f"{cid}.npz") as archive:
        return archive["x"], archive["y"]


def _assert_inputs_equal_files(dataset, folder):
    for split in ("train", "test"):
        x_all, _ = dataset.merged[split]
        start = 0
        for client in dataset.clients:
            x, _ = _file(folder, split, client.cid)
            assert torch.equal(client.inputs(split), torch.from_numpy(x)), (split, client.cid)
            if len(x):  # still a view of the merged tensor
                assert getattr(client, f"{split}_x").data_ptr() == x_all[start:].data_ptr()
            start += len(x)


def test_eight_bit_inputs_are_held_as_codes_and_decode_to_the_file_floats(tmp_path):
    folder = make_dataset(tmp_path, num_clients=4, input_shape=(1, 6, 6), eight_bit=True)
    dataset = load_federated_dataset(str(folder))
    table = dataset.input_table
    assert table is not None and table.dtype == torch.float32 and len(table) <= 256
    assert bool((table[1:] > table[:-1]).all())  # sorted, distinct
    for split in ("train", "test"):
        assert dataset.merged[split][0].dtype == torch.uint8
        assert all(c.table is table for c in dataset.clients)
    _assert_inputs_equal_files(dataset, folder)
    rows = torch.tensor([3, 0, 5])
    x, _ = _file(folder, "train", 2)
    assert torch.equal(dataset.clients[2].inputs("train", rows), torch.from_numpy(x[rows.numpy()]))


def test_compact_inputs_take_a_quarter_of_the_memory(tmp_path):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 8, 8), eight_bit=True)
    compact = load_federated_dataset(str(folder))
    plain = load_federated_dataset(str(folder), compact=False)
    assert plain.input_table is None and plain.merged["train"][0].dtype == torch.float32
    for split in ("train", "test"):
        c, p = compact.merged[split][0], plain.merged[split][0]
        assert 4 * c.numel() * c.element_size() == p.numel() * p.element_size()
        assert torch.equal(decode_inputs(c, compact.input_table), p)


def test_codes_are_renumbered_when_later_files_bring_smaller_values():
    coder = _InputCoder()
    first = np.array([[0.5, 1.0], [1.0, 0.5]], np.float32)
    codes, renumber = coder.encode(first)
    assert renumber is None and codes.tolist() == [[0, 1], [1, 0]]
    second = np.array([-1.0, 0.5, 0.25], np.float32)  # two new values below the known ones
    codes2, renumber = coder.encode(second)
    assert coder.table.tolist() == [-1.0, 0.25, 0.5, 1.0]
    assert renumber.tolist() == [2, 3]  # old code 0 (0.5) -> 2, old code 1 (1.0) -> 3
    assert coder.table[codes2].tolist() == second.tolist()
    assert coder.table[renumber[codes]].tolist() == first.tolist()
    codes3, renumber = coder.encode(np.array([1.0, -1.0], np.float32))  # nothing new: no renumbering
    assert renumber is None and codes3.tolist() == [3, 0]


def test_loader_renumbers_codes_written_earlier(tmp_path):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 4, 4), eight_bit=True)
    # client 0 only has large values, so every later value below them renumbers its codes
    x, y = _file(folder, "train", 0)
    np.savez(folder / "train" / "0.npz", x=np.full_like(x, x.max()), y=y)
    dataset = load_federated_dataset(str(folder))
    assert dataset.merged["train"][0].dtype == torch.uint8
    _assert_inputs_equal_files(dataset, folder)


@pytest.mark.parametrize("where", ["train", "test"])
def test_more_than_256_values_fall_back_to_float32(tmp_path, where):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 6, 6), eight_bit=True)
    x, y = _file(folder, where, 2)  # the last file read of that split brings 300 new values
    noisy = x.copy()
    noisy.reshape(-1)[:300] = np.linspace(3.0, 4.0, 300, dtype=np.float32)
    np.savez(folder / where / "2.npz", x=noisy, y=y)
    dataset = load_federated_dataset(str(folder))
    assert dataset.input_table is None and all(c.table is None for c in dataset.clients)
    for split in ("train", "test"):
        assert dataset.merged[split][0].dtype == torch.float32
    _assert_inputs_equal_files(dataset, folder)


def test_nan_inputs_are_not_coded():
    assert _InputCoder().encode(np.array([0.0, np.nan], np.float32)) is None


@pytest.mark.parametrize("engine", ["sequential", "batched", "threaded"])
def test_training_on_codes_equals_training_on_floats(tmp_path, engine):
    from flcore.trainmodel.models import cnn

    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 16, 16), num_classes=4, eight_bit=True,
                          train_sizes=[20, 30, 25], test_size=8)
    runs = []
    for compact in (True, False):
        dataset = load_federated_dataset(str(folder), compact=compact)
        args = make_args("FedAvg", global_rounds=2, batch_size=5, local_learning_rate=0.05, engine=engine,
                         eval_auc=False, save_model=False, compact_inputs=compact)
        torch.manual_seed(0)
        server = build_server(args, dataset, cnn((1, 16, 16), 4, args))
        server.train(progress=False)
        runs.append(server)
    coded, floats = runs
    assert coded.dataset.input_table is not None and floats.dataset.input_table is None
    assert torch.equal(coded.global_params, floats.global_params)
    assert coded.history.test_acc == floats.history.test_acc
    assert coded.history.train_loss == floats.history.train_loss
