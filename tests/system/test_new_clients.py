"""New clients (``-nnc``, ``-ften``): the dataset's last clients are held out of training and of
the ordinary evaluation, fine-tune the final global model and are evaluated apart
(``rs_new_client_acc``); ``-fs`` applies to them as in PFLlib."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import main
from fltest import (TinyLinear, build_server, dataset_from_arrays, linear_grad, make_args, one_thread,  # noqa: F401
                    random_dataset)
from flcore.features.newclients import hold_out
from fldata.loading import load_federated_dataset
from utils.errors import FLError
from reporting.results import read_results


def write_dataset(root, labels_per_client: list[list[int]], train: int = 24, test: int = 12, seed: int = 0):
    """Clients on disk whose inputs are their label's prototype plus small noise (4 features):
    client c holds only the labels ``labels_per_client[c]``."""
    rng = np.random.default_rng(seed)
    classes = 1 + max(max(labels) for labels in labels_per_client)
    prototypes = 3 * rng.normal(size=(classes, 4)).astype(np.float32)
    folder = root / "Split"
    for split, size in (("train", train), ("test", test)):
        (folder / split).mkdir(parents=True, exist_ok=True)
        for cid, labels in enumerate(labels_per_client):
            y = np.asarray(labels * size)[:size].astype(np.int64)
            x = (prototypes[y] + 0.3 * rng.normal(size=(size, 4))).astype(np.float32)
            np.savez(folder / split / f"{cid}.npz", x=x, y=y)
    (folder / "config.json").write_text(json.dumps({"num_clients": len(labels_per_client), "num_classes": classes,
                                                    "input_shape": [4]}))
    return folder


def run(folder, tmp_path, *flags: str):
    results = tmp_path / "res"
    code = main.main(["-data", str(folder), "-m", "MLR", "-gr", "8", "-lr", "0.1", "-dev", "cpu", "--results_dir",
                      str(results), "--progress", "False", "-q", "True", "--save_model", "False", *flags])
    assert code == 0
    return read_results(next(results.glob("*.h5")))


def test_new_client_accuracy_is_measured_on_the_held_out_clients_only(tmp_path, capsys):
    """Training clients hold labels 0 and 1, the two held-out ones only label 2: the global model
    never learns label 2, so the new clients score 0 as it is and well once fine-tuned, while the
    ordinary accuracy, over the training clients alone, is high."""
    folder = write_dataset(tmp_path, [[0, 1], [1, 0], [0, 1], [2], [2]])
    as_is = run(folder, tmp_path / "a", "-nnc", "2")
    assert as_is["rs_client_acc"].shape[1] == 3  # the ordinary evaluation: the 3 training clients
    assert as_is["rs_test_acc"][-1] > 0.95
    assert as_is["rs_new_client_acc"].tolist() == [0.0]
    assert as_is["rs_new_client_rounds"].tolist() == [8]
    assert json.loads(as_is["attrs"]["config"])["num_clients"] == 3
    tuned = run(folder, tmp_path / "b", "-nnc", "2", "-ften", "3", "-lbs", "4")
    assert tuned["rs_new_client_acc"][0] > 0.95
    np.testing.assert_array_equal(tuned["rs_test_acc"], as_is["rs_test_acc"])  # training is unchanged
    assert tuned["attrs"]["new_client_acc"] == tuned["rs_new_client_acc"][-1]
    assert "new clients: accuracy" in capsys.readouterr().out


def test_nc_may_count_the_training_clients_as_pfllib(tmp_path):
    folder = write_dataset(tmp_path, [[0, 1], [1, 0], [0, 1], [2]])
    ours = run(folder, tmp_path / "a", "-nnc", "1")
    pfllib = run(folder, tmp_path / "b", "-nnc", "1", "-nc", "3")
    total = run(folder, tmp_path / "c", "-nnc", "1", "-nc", "4")
    for other in (pfllib, total):
        np.testing.assert_array_equal(other["rs_test_acc"], ours["rs_test_acc"])
        np.testing.assert_array_equal(other["rs_new_client_acc"], ours["rs_new_client_acc"])


def test_hold_out_takes_the_last_clients_as_views():
    data = random_dataset(num_clients=5, sizes=[4, 5, 6, 7, 8])
    train, new = hold_out(data, 2)
    assert [c.cid for c in train.clients] == [0, 1, 2] and [c.cid for c in new.clients] == [3, 4]
    assert train.config["num_clients"] == 3 and new.config["num_clients"] == 2
    for split in ("train", "test"):
        x, owner = data.split(split)[0], data.owners(split)
        for part, first in ((train, 0), (new, 3)):
            (px, py), powner = part.split(split), part.owners(split)
            rows = sum(len(getattr(c, f"{split}_y")) for c in data.clients[:first])
            assert torch.equal(px, x[rows : rows + len(py)]) and px.data_ptr() == x[rows:].data_ptr()
            assert torch.equal(powner, owner[rows : rows + len(py)] - first)
            assert part.offsets(split)[0] == 0
    assert hold_out(data, 0) == (data, None)
    with pytest.raises(FLError, match="leaves no client"):
        hold_out(data, 5)
    with pytest.raises(FLError, match="pass -nc 3"):
        hold_out(data, 2, requested=4)


def new_client_setup(*flags: str, **settings):
    """A FedAvg server built on 5 toy clients (tiny linear model) with -nnc 2: it trains on 3 of them,
    and its new-clients plug-in evaluates the other 2."""
    data = random_dataset(num_clients=5, dim=3, num_classes=3, sizes=[6, 7, 8, 9, 10], seed=2)
    args = make_args("FedAvg", "-nnc", "2", *flags, global_rounds=2, eval_auc=False, engine="sequential", **settings)
    server = build_server(args, data)
    evaluation = server.plugin("new_clients")
    assert len(server.clients) == 3 and [c.cid for c in evaluation.data.clients] == [3, 4]
    return server, evaluation, evaluation.data


def test_ften_zero_evaluates_the_global_model_as_is():
    server, evaluation, new = new_client_setup()
    server.train(progress=False)
    server.model.load(server.global_params)
    with torch.no_grad():
        hits = sum(int((server.model.module(c.test_x).argmax(1) == c.test_y).sum()) for c in new.clients)
    assert server.history.extra_series["new_client_acc"] == [pytest.approx(hits / sum(c.num_test for c in new.clients))]
    assert evaluation.fine_tuned(0, 2) is server.global_params


def test_fine_tuning_is_sgd_from_the_global_model_on_the_client_own_data():
    """-ften 2 with full batches: two gradient steps of the client's cross-entropy from the global model."""
    server, evaluation, new = new_client_setup("-ften", "2", batch_size=20, drop_last=False, local_learning_rate=0.3)
    client = new.clients[1]
    w = server.global_params.double()
    expected = w
    for _ in range(2):
        expected = expected - 0.3 * linear_grad(expected, client.train_x.double(), client.train_y, 3)
    torch.testing.assert_close(evaluation.fine_tuned(1, 0).double(), expected, rtol=1e-5, atol=1e-6)


def test_new_clients_fine_tune_without_dp_in_a_dp_run():
    """-nnc with -dp: the federation's clients take DP-SGD steps, the new clients' fine-tuning is
    still plain SGD (no Poisson batches, no noise), as the module docstring says: the same two
    full-batch gradient steps as without -dp."""
    server, evaluation, new = new_client_setup("-ften", "2", "-dp", "-dps", "1.0", batch_size=20, drop_last=False,
                                               local_learning_rate=0.3, dp_sampling="shuffle")
    assert server.clients[0].local_step.name.startswith("DP-SGD")  # the federation trains with DP-SGD
    client = new.clients[1]
    assert not hasattr(evaluation.clients[1], "dp_steps") and evaluation.clients[1].local_step.plain
    w = server.global_params.double()
    expected = w
    for _ in range(2):
        expected = expected - 0.3 * linear_grad(expected, client.train_x.double(), client.train_y, 3)
    torch.testing.assert_close(evaluation.fine_tuned(1, 0).double(), expected, rtol=1e-5, atol=1e-6)


def test_every_eval_mode_records_each_evaluation_and_leaves_training_unchanged():
    plain, _, _ = new_client_setup("-ften", "1", "-ld", "True")
    plain.train(progress=False)
    once = new_client_setup("-ften", "1", "-ld", "True")[0]
    once.train(progress=False)
    every = new_client_setup("-ften", "1", "-ld", "True", "--new_clients_every_eval", "True")[0]
    every.train(progress=False)
    assert torch.equal(every.global_params, plain.global_params) and torch.equal(once.global_params, plain.global_params)
    assert once.history.extra_series["new_client_rounds"] == [2]
    assert every.history.extra_series["new_client_rounds"] == [0, 1, 2]
    # the final evaluation: the same model fine-tuned with the same seeds
    assert every.history.extra_series["new_client_acc"][-1] == once.history.extra_series["new_client_acc"][0]


def test_few_shot_limits_the_new_clients_training_data_too(tmp_path):
    """PFLlib reads new clients with the same ``few_shot``: at most fs training samples per label,
    the first in file order; test data untouched."""
    folder = write_dataset(tmp_path, [[0, 1], [1, 0], [0, 2, 1]])
    data = load_federated_dataset(str(folder), few_shot=3)
    _, new = hold_out(data, 1)
    client = new.clients[0]
    assert client.cid == 2 and client.train_y.tolist() == [0, 2, 1] * 3
    assert client.num_test == 12
    with np.load(folder / "train" / "2.npz") as raw:
        np.testing.assert_array_equal(client.inputs("train").numpy(), raw["x"][:9])
