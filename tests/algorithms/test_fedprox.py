"""FedProx: the proximal step by hand, μ = 0 is FedAvg, the μ = 0 warning, a run through main."""
from __future__ import annotations

import h5py
import torch

from fltest import (build_server, fl_log_messages, linear_grad, make_args, random_dataset, run_main_two_rounds,
                    run_round, trained_server, two_client_server)


def test_proximal_step_matches_hand_computation():
    mu, lr = 0.5, 0.1
    data, server = two_client_server("FedProx", "-mu", str(mu), seed=1, local_learning_rate=lr)
    w0 = server.global_params.double()
    expected_models = []
    for client in data.clients:
        x, y = client.train_x.double(), client.train_y
        w = w0.clone()
        for _ in range(2):
            w = w - lr * (linear_grad(w, x, y, 2) + mu * (w - w0))
        expected_models.append(w)
    expected = 0.4 * expected_models[0] + 0.6 * expected_models[1]
    updates = run_round(server, 0).updates
    assert [u.num_steps for u in updates] == [2, 2]
    for update, want in zip(updates, expected_models):
        assert torch.allclose(update.params.double(), want, atol=1e-6, rtol=0)
    assert torch.allclose(server.global_params.double(), expected, atol=1e-6, rtol=0)


def test_mu_zero_is_fedavg_over_two_rounds():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, seed=2)
    finals = [trained_server(data, algo, *extra, global_rounds=2, batch_size=4, local_epochs=2).global_params
              for algo, extra in (("FedAvg", ()), ("FedProx", ("-mu", "0")))]
    assert torch.equal(finals[0], finals[1])


def test_mu_zero_warns_and_positive_mu_does_not():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    with fl_log_messages() as messages:
        build_server(make_args("FedProx"), data)
        assert any("FedAvg" in m for m in messages)
        messages.clear()
        server = build_server(make_args("FedProx", "-mu", "0.01"), data)
        assert messages == []
        assert server.summary() == {"mu": 0.01}


def test_two_round_run_through_main(tmp_path):
    path = run_main_two_rounds(tmp_path, "FedProx", "-mu", "0.01")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
    assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)


def test_adjust_grad_is_vmappable():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    server = build_server(make_args("FedProx", "-mu", "0.3"), data)
    client = server.clients[0]
    n = server.model.num_params
    w, g = torch.randn(3, n), torch.randn(3, n)
    anchor = torch.randn(3, server.model.num_total)
    batched = torch.func.vmap(lambda w_, g_, a_: client.adjust_grad(w_, g_, {"anchor": a_}))(w, g, anchor)
    assert torch.allclose(batched, g + 0.3 * (w - anchor[:, :n]))
