"""FedProto: the prototype-regularised loss and the uploaded prototypes by hand over two rounds,
the server's weighted (paper) and plain (PFLlib) averages, what travels (and its bytes), λ = 0 is
Local, state under partial participation, nearest-prototype evaluation, bad input."""
from __future__ import annotations

import math

import h5py
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fltest import build_server, make_args, random_dataset, run_main_two_rounds, run_round
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from knowledgetest import refusal, HIDDEN, HiddenBody, hand_forward, hidden_server, per_class_sums

LR, LAM = 0.3, 2.0


def hand_client(w, x, y, prototypes, present, steps=2, classes=2):
    """Full-batch steps on CE + λ·MSE(z, C̄_y) written out; returns (final w, prototypes, seen classes)."""
    sums = torch.zeros(classes, HIDDEN, dtype=w.dtype)
    seen = torch.zeros(classes, dtype=w.dtype)
    for _ in range(steps):
        w = w.detach().requires_grad_(True)
        z, logits = hand_forward(w, x, classes)
        batch_sums, batch_seen = per_class_sums(z.detach(), y, classes)
        sums, seen = sums + batch_sums, seen + batch_seen
        loss = F.cross_entropy(logits, y)
        if prototypes is not None:
            mask = present[y].to(w.dtype).unsqueeze(1)
            loss = loss + LAM * ((z - prototypes[y]) * mask).pow(2).mean()
        (grad,) = torch.autograd.grad(loss, w)
        w = w - LR * grad
    held = seen > 0
    return w.detach(), sums[held] / seen[held].unsqueeze(1), torch.nonzero(held).flatten()


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_two_rounds_by_hand(weighting):
    data = random_dataset(num_clients=2, dim=2, num_classes=2, sizes=[4, 6], seed=5)
    server = hidden_server("FedProto", data, "-lam", str(LAM), "--fedproto_weighting", weighting,
                           local_learning_rate=LR)
    models = [server.global_params.double()] * 2
    prototypes = present = None
    for rnd in range(2):
        expected = [hand_client(models[k], c.train_x.double(), c.train_y, prototypes, present)
                    for k, c in enumerate(data.clients)]
        updates = run_round(server, rnd).updates
        for k, (update, (w, protos, labels)) in enumerate(zip(updates, expected)):
            assert torch.equal(update.extras["labels"], labels)
            assert torch.allclose(update.extras["means"].double(), protos, atol=1e-6, rtol=0)
            counts = torch.bincount(data.clients[k].train_y, minlength=2)[labels]
            assert torch.equal(update.extras["counts"], counts.float())
            assert torch.allclose(server.eval_params(k).double(), w, atol=1e-6, rtol=0)
        if rnd == 1:  # the prototype term really acts: plain SGD lands elsewhere
            plain = hand_client(models[0], data.clients[0].train_x.double(), data.clients[0].train_y, None, None)[0]
            assert (plain - expected[0][0]).abs().max() > 1e-4
        models = [w for w, _, _ in expected]
        # the global prototypes: per class, over the clients holding it
        total = torch.zeros(2, HIDDEN, dtype=torch.float64)
        weight = torch.zeros(2, dtype=torch.float64)
        for k, (_, protos, labels) in enumerate(expected):
            counts = torch.bincount(data.clients[k].train_y, minlength=2).double()
            for row, label in enumerate(labels.tolist()):
                share = counts[label] if weighting == "samples" else 1.0
                total[label] += share * protos[row]
                weight[label] += share
        present = weight > 0
        prototypes = total / weight.clamp_min(1e-12).unsqueeze(1)
        assert torch.equal(server.global_present, present)
        assert torch.allclose(server.global_prototypes.double()[present], prototypes[present], atol=1e-6, rtol=0)
    # the global model never moves: no weights travel
    assert torch.equal(server.global_params, hidden_server("FedProto", data).global_params)


def test_upload_is_the_prototypes_only_and_bytes_count_them():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[10, 12, 9], seed=2)
    server = hidden_server("FedProto", data)
    first = run_round(server, 0)
    assert first.package.total_nbytes() == 0  # round 0: no prototypes yet, and no model
    for update in first.updates:
        assert set(update.extras) == {"labels", "means", "counts"}
        assert not update.uploads_params
        k = len(update.extras["labels"])
        assert update.extras["means"].shape == (k, HIDDEN)
        assert update.nbytes() == k * 8 + k * HIDDEN * 4 + k * 4
    second = run_round(server, 1)
    assert second.package.nbytes(0) == 3 * HIDDEN * 4 + 3  # C x d prototypes and a C-byte mask
    assert set(second.package.extras) == {"global_prototypes", "global_present"}


def test_lambda_zero_trains_exactly_like_local():
    data = random_dataset(num_clients=4, dim=4, num_classes=3, sizes=[7, 12, 9, 15], seed=4)
    flags = dict(batch_size=4, local_epochs=2, join_ratio=0.5, global_rounds=3, local_learning_rate=0.1)
    servers = []
    for algorithm, extra in (("FedProto", ["-lam", "0"]), ("Local", [])):
        torch.manual_seed(0)
        module = HiddenBody(4, 3)
        server = build_server(make_args(algorithm, *extra, **flags), data, module)
        server.train(progress=False)
        servers.append(server)
    proto, local = servers
    assert [c.participations for c in proto.clients] == [c.participations for c in local.clients]
    for i in range(4):
        assert torch.equal(proto.eval_params(i), local.eval_params(i)), i
    assert proto.history.test_acc == local.history.test_acc


def test_partial_participation_keeps_each_clients_model():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[10, 12, 9], seed=6)
    server = hidden_server("FedProto", data)
    initial = server.global_params.clone()
    run_round(server, 0, cohort=[0, 2])
    assert torch.equal(server.eval_params(1), initial)  # never selected: the initial model
    trained = server.eval_params(0).clone()
    assert not torch.equal(trained, initial)
    run_round(server, 1, cohort=[1])
    assert torch.equal(server.eval_params(0), trained)  # not selected: unchanged
    # the global prototypes of round 1 come from client 1's upload alone
    held = torch.unique(data.clients[1].train_y)
    assert torch.equal(torch.nonzero(server.global_present).flatten(), held)


def test_nearest_prototype_accuracy():
    data = random_dataset(num_clients=2, dim=2, num_classes=2, sizes=[4, 6], seed=1)
    server = hidden_server("FedProto", data)
    assert math.isnan(server.prototype_accuracy())  # no prototypes yet
    server.global_prototypes = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    server.global_present = torch.tensor([True, True])
    correct = total = 0
    for i, client in enumerate(data.clients):
        z = hand_forward(server.eval_params(i), client.test_x, 2)[0]
        for row, label in zip(z, client.test_y.tolist()):
            distances = [float((row - p).norm()) for p in server.global_prototypes]
            correct += int(distances.index(min(distances)) == label)
            total += 1
    assert server.prototype_accuracy() == pytest.approx(correct / total)
    server.global_present = torch.tensor([False, True])  # one class only: every sample is given it
    share = sum(int((c.test_y == 1).sum()) for c in data.clients) / total
    assert server.prototype_accuracy() == pytest.approx(share)


def test_main_records_personal_and_prototype_accuracy(tmp_path):
    path = run_main_two_rounds(tmp_path, "FedProto")
    with h5py.File(path) as f:
        assert "rs_test_acc_global" not in f  # no global model
        proto = f["rs_test_acc_proto"][()]
        assert proto.shape == f["rs_test_acc"].shape == (3,)
        assert math.isnan(proto[0]) and ((proto[1:] >= 0) & (proto[1:] <= 1)).all()
        assert (f["rs_bytes_up"][()] > 0).all() and (f["rs_bytes_up"][()] < 20_000).all()


def test_bad_input():
    assert "body (features) and head (classifier)" in refusal("FedProto", module=nn.Linear(3, 2))
    assert "-lam" in refusal("FedProto", "-lam", "-1")



def test_dp_sgd_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(AssertionError, match="exited with 2"):
        run_main_two_rounds(tmp_path, "FedProto", "-dp", "True")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "FedProtoClient" in err[0]

