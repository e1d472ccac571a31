"""FedDBE: warm-up, PRBM and mean regularisation by hand on a two-layer model, the folded evaluation,
the FedAvg reduction, the bias never uploaded, partial participation, warnings, main."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fltest import (build_server, fl_log_messages, make_args, random_dataset, run_main_two_rounds, run_round,
                    trained_server)
from fltest import one_thread  # noqa: F401  (fixture)
from twolayer import CLASSES, DIM, HIDDEN, TwoLayer, features, logits, trained_two_layer, two_layer_server



def local_round(w, bias, x, y, steps, lr, mo, kappa, consensus):
    """``steps`` full-batch DBE steps by hand; returns (model, bias, running mean)."""
    running = torch.zeros(HIDDEN, dtype=w.dtype)
    for _ in range(steps):
        w = w.detach().clone().requires_grad_(True)
        b = bias.detach().clone().requires_grad_(True) if bias is not None else None
        z = features(w, x)
        running = (1 - mo) * running.detach() + mo * z.mean(0)
        loss = F.cross_entropy(logits(w, z if b is None else z + b), y)
        if consensus is not None:
            loss = loss + kappa * (0.5 * (running - consensus) ** 2).mean()
        grads = torch.autograd.grad(loss, [w] + ([b] if b is not None else []))
        w = (w - lr * grads[0]).detach()
        if b is not None:
            bias = (b - lr * grads[1]).detach()
    return w, bias, running.detach()


def test_two_rounds_by_hand():
    lr, mo, kappa = 0.1, 0.3, 2.0
    data, server = two_layer_server("FedDBE", "-mo", str(mo), "-klw", str(kappa), local_learning_rate=lr)
    w0 = server.global_params.double()
    xy = [(c.train_x.double(), c.train_y) for c in data.clients]
    warm = [local_round(w0, None, x, y, 2, lr, mo, kappa, None)[2] for x, y in xy]
    consensus = 0.4 * warm[0] + 0.6 * warm[1]
    w, biases = w0, [torch.zeros(HIDDEN, dtype=torch.float64)] * 2
    for rnd in range(2):
        trained = []
        for i, (x, y) in enumerate(xy):
            model, biases[i], _ = local_round(w, biases[i], x, y, 2, lr, mo, kappa, consensus)
            trained.append(model)
        w = 0.4 * trained[0] + 0.6 * trained[1]
        package = run_round(server, rnd).package
        assert torch.allclose(package.extras["dbe_consensus"].double(), consensus, atol=1e-6)
        assert torch.allclose(server.global_params.double(), w, atol=1e-5)
        for i, (x, y) in enumerate(xy):
            assert torch.allclose(server.state.get("dbe_bias", i).double(), biases[i], atol=1e-5)
            # the evaluated model (the bias folded into the head) gives head(z + b_i)
            evaluated = server.eval_params(i).double()
            z = features(w, x)
            assert torch.allclose(logits(evaluated, z), logits(w, z + biases[i]), atol=1e-5)
    assert server.clients[0].participations == 3  # the warm-up counts once, as PFLlib's scheduler step


@pytest.mark.parametrize("join_ratio", [1.0, 0.5])
def test_frozen_bias_without_regulariser_is_fedavg(join_ratio):
    data = random_dataset(num_clients=4, dim=DIM, num_classes=CLASSES, seed=2)
    settings = dict(global_rounds=3, join_ratio=join_ratio, batch_size=4)
    runs = {"FedDBE": trained_two_layer(data, "FedDBE", "--dbe_prbm", "False", "-klw", "0", **settings),
            "FedAvg": trained_two_layer(data, "FedAvg", **settings)}
    assert torch.equal(runs["FedDBE"].global_params, runs["FedAvg"].global_params)
    assert runs["FedDBE"].history.test_acc == runs["FedAvg"].history.test_acc
    assert runs["FedDBE"].state.names() == []


def test_bias_never_leaves_the_client_and_partial_participation():
    data, server = two_layer_server("FedDBE", "-klw", "1", num_clients=4, join_ratio=0.5)
    round0 = run_round(server, 0)
    for u in round0.updates:
        assert u.extras == {} and u.params.shape == server.global_params.shape
    for i in set(range(4)) - set(round0.cohort):
        assert server.state.get("dbe_bias", i) is None
        assert torch.equal(server.eval_params(i), server.global_params)
    consensus = server.consensus.clone()
    before = {i: b.clone() for i in range(4) if (b := server.state.get("dbe_bias", i)) is not None}
    round1 = run_round(server, 1)
    assert torch.equal(server.consensus, consensus)  # fixed after the warm-up
    for i in range(4):
        if i in before and i not in round1.cohort:
            assert torch.equal(server.state.get("dbe_bias", i), before[i])
        if i in round1.cohort:
            assert server.state.get("dbe_bias", i) is not None


def test_warnings_and_flags():
    data = random_dataset(num_clients=2, dim=DIM, num_classes=CLASSES)
    with fl_log_messages() as messages:
        torch.manual_seed(0)
        build_server(make_args("FedDBE"), data, TwoLayer())
        assert any("-klw" in m for m in messages)
        messages.clear()
        torch.manual_seed(0)
        server = build_server(make_args("FedDBE", "-klw", "1"), data, TwoLayer())
        assert messages == []
    assert server.summary() == {"momentum": 0.1, "kl_weight": 1.0, "prbm": True}


def test_linear_model_runs():
    data = random_dataset(num_clients=3, dim=3, num_classes=3, seed=7)
    server = trained_server(data, "FedDBE", "-klw", "1", global_rounds=2)
    assert len(server.history.test_acc) == 3


def test_two_round_run_through_main(tmp_path):
    run_main_two_rounds(tmp_path, "FedDBE", "-klw", "1")
