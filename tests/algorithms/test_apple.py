"""APPLE: the core and DR-vector steps by hand with the proximal schedule, one client is FedAvg,
the downloads in the byte count, PFLlib's DR gradient, partial participation, warnings, main."""
from __future__ import annotations

import math

import pytest
import torch

from fltest import (build_server, fl_log_messages, linear_grad, make_args, random_dataset, run_main_two_rounds,
                    run_round, trained_server)
from flcore.clients.clientapple import proximal_weight


def apple_server(*flags, **settings):
    data = random_dataset(num_clients=3, dim=2, num_classes=2, sizes=[4, 6, 10], seed=1)
    settings = {"batch_size": 16, "local_epochs": 2, "drop_last": False, "local_learning_rate": 0.1,
                "global_rounds": 4, **settings}
    return data, build_server(make_args("APPLE", *flags, **settings), data)


def test_proximal_schedule():
    assert proximal_weight(0, 10) == 1.0 and proximal_weight(10, 10) == 0.0 and proximal_weight(12, 10) == 0.0
    assert proximal_weight(5, 10) == pytest.approx(0.5)
    assert proximal_weight(2, 10) == pytest.approx((math.cos(0.2 * math.pi) + 1) / 2)


@pytest.mark.parametrize("p_grad,scale", [("inner", None), ("pfllib", True), ("inner", True)])
def test_two_rounds_by_hand(p_grad, scale):
    """scale None: the default, the paper's core rate lr (as False)."""
    lr, dlr, mu = 0.1, 0.05, 0.5
    flags = [] if scale is None else ["--apple_core_lr_scale", str(scale)]
    data, server = apple_server("-dlr", str(dlr), "-mu", str(mu), "-L", "0.5", "--apple_p_grad", p_grad, *flags)
    w0 = server.global_params.double()
    xy = [(c.train_x.double(), c.train_y) for c in data.clients]
    p0 = torch.tensor([4.0, 6.0, 10.0], dtype=torch.float64) / 20
    cores = [w0.clone() for _ in range(3)]
    dr = [torch.full((3,), 1 / 3, dtype=torch.float64) for _ in range(3)]

    def dr_grad(g, c):
        if p_grad == "inner":
            return float(g @ c)
        return float(((g[:4] * c[:4]).mean() + (g[4:] * c[4:]).mean()) / 2)  # head.weight (2x2), head.bias (2)

    for rnd in range(2):
        lam = (math.cos(math.pi * rnd / 2) + 1) / 2  # L = 0.5 * 4 rounds
        new_cores, personal = [], []
        for i, (x, y) in enumerate(xy):
            own, p = cores[i].clone(), dr[i].clone()
            for _ in range(2):
                mixed = sum(p[j] * (own if j == i else cores[j]) for j in range(3))
                g = linear_grad(mixed, x, y, 2)
                grad = torch.tensor([dr_grad(g, own if j == i else cores[j]) for j in range(3)], dtype=torch.float64)
                own = own - lr * (3 if scale else 1) * p[i] * g
                p = p - dlr * (grad + lam * mu * (p - p0))
            dr[i] = p
            new_cores.append(own)
            personal.append(sum(p[j] * (own if j == i else cores[j]) for j in range(3)))
        package = run_round(server, rnd).package
        assert torch.allclose(package.extras["apple_p0"], p0)
        for j in range(3):
            assert torch.allclose(package.extras["apple_cores"][j].double(), cores[j], atol=1e-5)
        cores = new_cores
        for i in range(3):
            assert torch.allclose(server.state.get("apple_p", i), dr[i], atol=1e-6)
            assert torch.allclose(server.state.get("core", i).double(), cores[i], atol=1e-5)
            assert torch.allclose(server.eval_params(i).double(), personal[i], atol=1e-5)
    assert not torch.allclose(dr[0], torch.full((3,), 1 / 3, dtype=torch.float64))


@pytest.mark.parametrize("scale", [False, True])
def test_with_fixed_dr_vectors_a_round_moves_the_mean_of_the_cores_by_lr_over_n(scale):
    # -dlr 0, one full-batch step a round: p = 1/3, so every client's gradient is taken at the mean m
    # of the cores and its core moves by η_c/3 · g_i; the mean moves by η_c/9 · Σ_i g_i(m): η/N² at the
    # default rate, η/N (N times more) at PFLlib's N·η. Client i's personalised model is m with only its
    # own core's step: m − η_c/9 · g_i(m)
    lr = 0.3
    data, server = apple_server("-dlr", "0", "--apple_core_lr_scale", str(scale), local_epochs=1,
                                local_learning_rate=lr)
    mean = server.global_params.double()
    core_lr = lr * (3 if scale else 1)
    for rnd in range(2):
        grads = [linear_grad(mean, c.train_x.double(), c.train_y, 2) for c in data.clients]
        run_round(server, rnd)
        for i in range(3):
            assert torch.allclose(server.eval_params(i).double(), mean - core_lr / 9 * grads[i], atol=1e-6)
        mean = mean - core_lr / 9 * sum(grads)
        cores = torch.stack([server.core(i).double() for i in range(3)])
        assert torch.allclose(cores.mean(0), mean, atol=1e-6)


def test_one_client_with_a_fixed_dr_vector_is_fedavg():
    # N = 1 and η_p = 0: p = 1, w̃ = c, and the core's step is lr · 1 · 1 · g
    data = random_dataset(num_clients=1, dim=3, num_classes=3, sizes=[12], seed=3)
    settings = dict(global_rounds=3, batch_size=4, local_epochs=2)
    ours = trained_server(data, "APPLE", "-dlr", "0", "-mu", "1", **settings)
    fedavg = trained_server(data, "FedAvg", **settings)
    assert torch.allclose(ours.state.get("core", 0), fedavg.global_params, atol=1e-6)
    assert torch.allclose(ours.eval_params(0), fedavg.global_params, atol=1e-6)
    assert torch.equal(ours.state.get("apple_p", 0), torch.ones(1, dtype=torch.float64))


def test_downloads_and_partial_participation():
    data = random_dataset(num_clients=4, dim=3, num_classes=3, seed=4)
    server = build_server(make_args("APPLE", "-dlr", "0.01", join_ratio=0.5, batch_size=4), data)
    round0 = run_round(server, 0)
    d = server.global_params.numel()
    for i in round0.cohort:
        assert round0.package.nbytes(i) == d * 4 + 4 * d * 4 + 4 * 8  # the model, N cores, p0
        assert round0.package.payload(i) == {}
    before = {i: (server.eval_params(i).clone(), server.core(i).clone()) for i in range(4)}
    round1 = run_round(server, 1)
    for i in range(4):
        if i not in round1.cohort:
            assert torch.equal(server.eval_params(i), before[i][0]) and torch.equal(server.core(i), before[i][1])
        else:
            assert not torch.equal(server.core(i), before[i][1])
    for i in set(range(4)) - set(round0.cohort) - set(round1.cohort):
        assert server.state.get("apple_p", i) is None and torch.equal(server.eval_params(i), server.global_params)


def test_warnings_and_flags():
    with fl_log_messages() as messages:
        apple_server()
        assert any("-dlr 0" in m for m in messages) and any("-mu 0" in m for m in messages)
        messages.clear()
        _, server = apple_server("-dlr", "0.01", "-mu", "0.1")
        assert messages == []
    assert server.summary() == {"dr_learning_rate": 0.01, "mu": 0.1, "L": 1.0, "core_lr_scale": False,
                                "p_grad": "inner"}
    with fl_log_messages() as messages:
        apple_server("-dlr", "0.01", "-mu", "0.1", "--apple_core_lr_scale", "True")
        assert len(messages) == 1 and "N·lr" in messages[0] and "one after another" in messages[0]


def test_two_round_run_through_main(tmp_path):
    run_main_two_rounds(tmp_path, "APPLE", "-dlr", "0.01", "-mu", "0.1")
