"""FedNova: the normalised average by hand (plain and momentum SGD, unequal step counts), the
reduction to FedAvg when every client takes the same steps, a client without steps, main."""
from __future__ import annotations

import h5py
import pytest
import torch

from flcore.clients.clientfednova import normalising_norm
from fltest import (build_server, linear_grad, make_args, random_dataset, run_main_two_rounds, run_round,
                    trained_server)


def _local_sgd(w, client, plan, lr, beta):
    """The client's local SGD by hand over its minibatch plan, with a fresh momentum buffer."""
    x, y = client.data.train_x.double(), client.data.train_y
    velocity = torch.zeros_like(w)
    for idx in plan:
        velocity = beta * velocity + linear_grad(w, x[idx], y[idx], 2)
        w = w - lr * velocity
    return w


def test_normalising_norm_sums_the_gradient_weights():
    # step k of τ (k = 1..τ) weighs Σ_{j<=τ-k} ρ^j in the accumulated update; the norm is their sum
    for steps, rho in [(1, 0.9), (3, 0.5), (7, 0.9)]:
        weights = [sum(rho**j for j in range(steps - k + 1)) for k in range(1, steps + 1)]
        assert normalising_norm(steps, rho) == pytest.approx(sum(weights), rel=1e-12)
    assert normalising_norm(5, 0.0) == 5.0
    assert normalising_norm(0, 0.9) == 0.0


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_global_step_matches_hand_computation_with_unequal_steps(beta):
    # clients of 4 and 6 samples, batch 2: τ = 2 and 3 steps, weights p = 0.4 and 0.6
    lr = 0.3
    data = random_dataset(num_clients=2, dim=2, num_classes=2, sizes=[4, 6], seed=3)
    server = build_server(make_args("FedNova", batch_size=2, local_epochs=1, local_learning_rate=lr,
                                    local_momentum=beta), data)
    x = server.global_params.double()
    for rnd in range(2):
        ys, norms = [], []
        for client in server.clients:
            plan = client.batch_plan(rnd)
            ys.append(_local_sgd(x, client, plan, lr, beta))
            norms.append(normalising_norm(len(plan), beta))
        assert [len(client.batch_plan(rnd)) for client in server.clients] == [2, 3]
        p = [0.4, 0.6]
        tau_eff = p[0] * norms[0] + p[1] * norms[1]
        fednova = x - tau_eff * (p[0] * (x - ys[0]) / norms[0] + p[1] * (x - ys[1]) / norms[1])
        fedavg = p[0] * ys[0] + p[1] * ys[1]
        updates = run_round(server, rnd).updates
        for update, y, a in zip(updates, ys, norms):
            assert torch.allclose(update.params.double(), y, atol=1e-6, rtol=0)
            assert float(update.extras["a_i"]) == pytest.approx(a, rel=1e-6)
        assert torch.allclose(server.global_params.double(), fednova, atol=1e-6, rtol=0)
        assert (fednova - fedavg).abs().max() > 1e-3  # unequal steps: not FedAvg's average
        x = fednova


@pytest.mark.parametrize("beta", [0.0, 0.9])
def test_equal_steps_is_fedavg_over_two_rounds(beta):
    # equal sizes: every client takes the same τ steps, so every a_i is equal and τ_eff·d̄ = x − Σ p_i y_i
    data = random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[8, 8, 8], seed=5)
    flags = dict(global_rounds=2, batch_size=4, local_epochs=2, local_momentum=beta)
    fedavg = trained_server(data, "FedAvg", **flags)
    fednova = trained_server(data, "FedNova", **flags)
    torch.testing.assert_close(fednova.global_params, fedavg.global_params, atol=1e-6, rtol=1e-6)
    assert fedavg.history.test_acc == pytest.approx(fednova.history.test_acc, abs=1e-6)


def test_client_without_steps_adds_nothing():
    # client 1 has 2 samples < batch 4 with drop_last: τ = 0, so a = 0; the step is client 0's own
    data = random_dataset(num_clients=2, dim=2, num_classes=2, sizes=[8, 2], seed=9)
    server = build_server(make_args("FedNova", batch_size=4), data)
    x = server.global_params.clone()
    updates = run_round(server, 0).updates
    assert [u.num_steps for u in updates] == [2, 0] and float(updates[1].extras["a_i"]) == 0.0
    expected = x - 0.8 * 2 * (0.8 * (x - updates[0].params) / 2)  # τ_eff = 0.8·2; p_0 = 0.8
    assert torch.allclose(server.global_params, expected, atol=1e-6, rtol=0)
    assert torch.isfinite(server.global_params).all()


def test_two_round_run_through_main(tmp_path):
    path = run_main_two_rounds(tmp_path, "FedNova", "--local_momentum", "0.9")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
    assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
