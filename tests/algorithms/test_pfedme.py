"""pFedMe: inner/outer steps and the β server step by hand, β = 1 is averaging, θ_i kept, main."""
from __future__ import annotations

import h5py
import torch

from flcore.servers.serverbase import weighted_average
from fltest import (build_server, linear_grad, make_args, random_dataset, run_main_two_rounds, run_round,
                    two_client_server)
from fltest import one_thread  # noqa: F401  (an autouse fixture: importing it switches it on here)


def test_local_and_server_steps_match_hand_computation():
    # K = 2 inner steps per local epoch.
    lr, lrp, lam, mu, beta, inner = 0.2, 0.1, 2.0, 0.01, 0.5, 2
    data, server = two_client_server("pFedMe", "-K", str(inner), "-lrp", str(lrp), "-lam", str(lam), "--pfedme_mu",
                                     str(mu), "-bt", str(beta), seed=1, local_learning_rate=lr)
    g = server.global_params.double()
    uploads, personal = [], []
    for client in data.clients:
        x, y = client.train_x.double(), client.train_y
        theta, w = g.clone(), g.clone()
        for _ in range(2):
            for _ in range(inner):
                theta = theta - lrp * (linear_grad(theta, x, y, 2) + lam * (theta - w) + mu * theta)
            w = w - lr * lam * (w - theta)
        uploads.append(w)
        personal.append(theta)
    updates = run_round(server, 0).updates
    for i, update in enumerate(updates):
        assert update.num_steps == 2
        assert torch.allclose(update.params.double(), uploads[i], atol=1e-6, rtol=0)
        assert torch.allclose(server.eval_params(i).double(), personal[i], atol=1e-6, rtol=0)
    mean = 0.4 * uploads[0] + 0.6 * uploads[1]
    assert torch.allclose(server.global_params.double(), (1 - beta) * g + beta * mean, atol=1e-6, rtol=0)


def test_beta_one_is_plain_averaging_and_beta_zero_freezes():
    data = random_dataset(num_clients=3, dim=3, num_classes=2, seed=2)
    server = build_server(make_args("pFedMe", "-bt", "1", batch_size=3, local_learning_rate=0.1), data)
    for rnd in range(2):
        updates = run_round(server, rnd).updates
        assert torch.equal(server.global_params, weighted_average(updates))
    frozen = build_server(make_args("pFedMe", "-bt", "0", batch_size=3, local_learning_rate=0.1), data)
    start = frozen.global_params.clone()
    run_round(frozen, 0)
    assert torch.equal(frozen.global_params, start)


def test_personal_models_survive_partial_participation():
    data = random_dataset(num_clients=3, dim=3, num_classes=2, sizes=[6, 9, 7], seed=3)
    server = build_server(make_args("pFedMe", batch_size=3, local_learning_rate=0.1), data)
    assert all(server.eval_params(i) is server.global_params for i in range(3))
    run_round(server, 0, [0, 1])
    theta1 = server.state.get("personal", 1).clone()
    run_round(server, 1, [0])
    run_round(server, 2, [0, 2])
    assert torch.equal(server.eval_params(1), theta1)  # kept while away
    assert not torch.equal(server.eval_params(0), server.eval_params(2))
    assert server.eval_params(2) is not server.global_params
    assert [c.participations for c in server.clients] == [3, 1, 1]


def test_two_round_run_through_main(tmp_path):
    path = run_main_two_rounds(tmp_path, "pFedMe", "-K", "2")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
        acc_global = f["rs_test_acc_global"][:]
    assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
    assert len(acc_global) == 3
