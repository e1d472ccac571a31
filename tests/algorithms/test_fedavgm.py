"""FedAvgM: server momentum by hand over two rounds, β = 0 is FedAvg, buffers, a run through main."""
from __future__ import annotations

import h5py
import torch
from torch import nn

from fltest import (build_server, gradient_descent, make_args, random_dataset, run_main_two_rounds, run_round,
                    trained_server, two_client_server)


def test_server_momentum_matches_hand_computation_over_two_rounds():
    beta, slr, lr = 0.9, 0.5, 0.1
    data, server = two_client_server("FedAvgM", "-slr", str(slr), seed=3, server_momentum=beta, local_learning_rate=lr)
    w = server.global_params.double()
    v = torch.zeros_like(w)
    for rnd in range(2):
        local = [gradient_descent(w, c.train_x.double(), c.train_y, 2, 2, lr) for c in data.clients]
        delta = 0.4 * local[0] + 0.6 * local[1] - w
        v = beta * v + delta
        w = w + slr * v
        run_round(server, rnd)
        assert torch.allclose(server.global_params.double(), w, atol=1e-6, rtol=0)
    assert torch.allclose(server.velocity.double(), v, atol=1e-6, rtol=0)


def test_matches_flowers_fedavgm_recursion_under_partial_participation():
    # Flower's form: pseudo-gradient g = w − mean, momentum = g in the first round and β·momentum + g
    # after it, w ← w − η_s·momentum (sample-weighted mean of the results received).
    beta, slr, lr = 0.8, 0.7, 0.1
    data = random_dataset(num_clients=3, dim=2, num_classes=2, sizes=[4, 6, 5], seed=7)
    server = build_server(make_args("FedAvgM", "-slr", str(slr), server_momentum=beta, batch_size=6,
                                    local_epochs=2, drop_last=False, local_learning_rate=lr), data)
    w, momentum = server.global_params.double(), None
    for rnd, cohort in enumerate([[0, 1], [1, 2], [0, 2]]):
        local = [gradient_descent(w, data.clients[i].train_x.double(), data.clients[i].train_y, 2, 2, lr)
                 for i in cohort]
        sizes = [data.clients[i].num_train for i in cohort]
        mean = sum(n * m for n, m in zip(sizes, local)) / sum(sizes)
        pseudo_gradient = w - mean
        momentum = pseudo_gradient if momentum is None else beta * momentum + pseudo_gradient
        w = w - slr * momentum
        run_round(server, rnd, cohort)
        assert torch.allclose(server.global_params.double(), w, atol=1e-6, rtol=0)


def test_zero_momentum_is_fedavg_over_two_rounds():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, seed=4)
    finals = [trained_server(data, algo, *extra, global_rounds=2, batch_size=4, local_epochs=2).global_params
              for algo, extra in (("FedAvg", ()), ("FedAvgM", ("--server_momentum", "0")))]
    assert torch.allclose(finals[0], finals[1], atol=1e-7, rtol=0)


class TinyBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.bn(x))


def test_float_buffers_take_the_plain_weighted_mean():
    data = random_dataset(num_clients=2, dim=3, num_classes=2, sizes=[4, 8], seed=5)
    torch.manual_seed(0)
    server = build_server(make_args("FedAvgM", batch_size=4), data, TinyBN())
    n = server.model.num_params
    updates = run_round(server, 0).updates
    mean = (4 * updates[0].params + 8 * updates[1].params) / 12
    assert server.model.num_total > n
    assert torch.allclose(server.global_params[n:], mean[n:], atol=1e-6)


def test_two_round_run_through_main(tmp_path):
    path = run_main_two_rounds(tmp_path, "FedAvgM")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
    assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
