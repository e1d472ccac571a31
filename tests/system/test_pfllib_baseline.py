"""The benchmark's PFLlib-procedure baseline computes FedAvg and PFLlib's metrics, so comparing its
speed with our engines compares the same work."""
from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from toydata import make_dataset

import main
from flcore.flat import FlatModel
from flcore.registry import ALGORITHMS, load_all
from fldata.loading import load_federated_dataset
from runner.pfllib_baseline import PFLlibStyleFedAvg, memory_reader, npz_reader, npz_train_sizes


def _setup(tmp_path, sizes=(8, 8, 8)):
    folder = make_dataset(tmp_path, num_clients=len(sizes), input_shape=(5,), num_classes=3, train_sizes=list(sizes),
                          test_size=7)
    load_all()
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    return folder, module


def test_one_round_is_fedavg_of_full_batch_steps(tmp_path):
    """With a batch as large as each client's data, batch order cannot matter: the baseline and the
    platform's FedAvg must give the same global model after two rounds."""
    folder, module = _setup(tmp_path)
    baseline = PFLlibStyleFedAvg(npz_reader(folder), npz_train_sizes(folder, 3), 3, copy.deepcopy(module),
                                 batch_size=8, lr=0.4, local_epochs=2, join_ratio=1.0, seed=0)
    for _ in range(2):
        baseline.round(evaluate=False)
    assert baseline.last_steps == 3 * 2

    args = main.parse_args(["-algo", "FedAvg", "-lbs", "8", "-ls", "2", "-lr", "0.4", "-gr", "2", "-q", "True",
                            "--progress", "False", "-data", str(folder)])
    dataset = load_federated_dataset(str(folder))
    server = ALGORITHMS.get("FedAvg")(args, dataset, copy.deepcopy(module), torch.device("cpu"))
    server.train(progress=False)
    expected = FlatModel(baseline.global_model).params
    assert torch.allclose(server.global_params, expected, atol=1e-5)


def test_evaluation_reports_pfllib_metrics(tmp_path):
    folder, module = _setup(tmp_path, sizes=(12, 8))  # whole batches of 4: drop_last drops nothing
    baseline = PFLlibStyleFedAvg(npz_reader(folder), [12, 8], 3, module, batch_size=4, lr=0.1, local_epochs=1,
                                 join_ratio=1.0, seed=0)
    baseline.send_models()
    baseline.evaluate()
    correct = tested = 0
    auc = loss = 0.0
    with torch.no_grad():
        for cid in range(2):
            with np.load(folder / "test" / f"{cid}.npz") as archive:
                x, y = torch.from_numpy(archive["x"]), torch.from_numpy(archive["y"])
            out = module(x)
            correct += int((out.argmax(1) == y).sum())
            tested += len(y)
            auc += roc_auc_score(np.eye(3)[y.numpy()], out.numpy(), average="micro") * len(y)
            with np.load(folder / "train" / f"{cid}.npz") as archive:
                tx, ty = torch.from_numpy(archive["x"]), torch.from_numpy(archive["y"])
            loss += float(F.cross_entropy(module(tx), ty, reduction="sum"))
    assert baseline.test_acc == [correct / tested]
    assert np.isclose(baseline.test_auc[0], auc / tested)
    assert np.isclose(baseline.train_loss[0], loss / 20, rtol=1e-5)


def test_memory_reader_copies_like_a_file_read(tmp_path):
    folder, _ = _setup(tmp_path)
    dataset = load_federated_dataset(str(folder))
    x, y = memory_reader(dataset)(1, "train")
    assert torch.equal(x, dataset.clients[1].inputs("train")) and x.data_ptr() != dataset.clients[1].train_x.data_ptr()
    fx, fy = npz_reader(folder)(1, "train")
    assert torch.equal(fx, x) and torch.equal(fy, y)
