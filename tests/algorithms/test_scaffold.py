"""SCAFFOLD: option-II controls by hand, first round = FedAvg, K = 0, partial participation, main."""
from __future__ import annotations

import h5py
import torch

from fltest import (build_server, linear_grad, make_args, random_dataset, run_main_two_rounds, run_round,
                    two_client_server)


def clients_by_hand(data, x, c, c_i, lr, steps, local):
    """One round of both clients by hand: each trains ``local(y, gradient, correction)`` for ``steps``
    steps from ``x``; returns their models and Δc_i, and updates ``c_i`` (option II)."""
    ys, dcs = [], []
    for k, client in enumerate(data.clients):
        y = local(x.clone(), lambda w, cl=client: linear_grad(w, cl.train_x.double(), cl.train_y, 2), c - c_i[k])
        new_c = c_i[k] - c + (x - y) / (steps * lr)
        ys.append(y)
        dcs.append(new_c - c_i[k])
        c_i[k] = new_c
    return ys, dcs


def test_controls_and_global_step_match_hand_computation_over_two_rounds():
    # K = 2 local steps, η_g = 0.7.
    lr, slr, steps = 0.3, 0.7, 2
    data, server = two_client_server("SCAFFOLD", "-slr", str(slr), seed=7, local_learning_rate=lr, local_epochs=steps)
    x = server.global_params.double()
    c = torch.zeros_like(x)
    c_i = [torch.zeros_like(x), torch.zeros_like(x)]

    def local(y, grad, correction):
        for _ in range(steps):
            y = y - lr * (grad(y) + correction)
        return y
    for rnd in range(2):
        ys, dcs = clients_by_hand(data, x, c, c_i, lr, steps, local)
        x = x + slr * ((ys[0] - x) + (ys[1] - x)) / 2  # uniform mean over the received uploads
        c = c + (dcs[0] + dcs[1]) / 2  # 1/N with N = 2 clients
        updates = run_round(server, rnd).updates
        for k, update in enumerate(updates):
            assert torch.allclose(update.params.double(), ys[k], atol=1e-6, rtol=0)
            assert torch.allclose(update.extras["delta_control"].double(), dcs[k], atol=1e-5, rtol=0)
            assert torch.allclose(server.state.get("control", k).double(), c_i[k], atol=1e-5, rtol=0)
        assert torch.allclose(server.global_params.double(), x, atol=1e-6, rtol=0)
        assert torch.allclose(server.control.double(), c, atol=1e-5, rtol=0)
    assert c.abs().max() > 1e-3  # the second round really used non-zero controls


def test_first_round_with_zero_controls_is_fedavg():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[8, 8, 8], seed=8)
    fedavg = build_server(make_args("FedAvg", batch_size=4, local_epochs=2), data)
    scaffold = build_server(make_args("SCAFFOLD", batch_size=4, local_epochs=2), data)
    run_round(fedavg, 0)
    run_round(scaffold, 0)
    assert torch.allclose(fedavg.global_params, scaffold.global_params, atol=1e-7, rtol=0)
    # With unequal sizes the samples weighting matches FedAvg's aggregation.
    data = random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[8, 12, 16], seed=8)
    fedavg = build_server(make_args("FedAvg", batch_size=4), data)
    scaffold = build_server(make_args("SCAFFOLD", batch_size=4, scaffold_weighting="samples"), data)
    run_round(fedavg, 0)
    run_round(scaffold, 0)
    assert torch.allclose(fedavg.global_params, scaffold.global_params, atol=1e-7, rtol=0)


def test_client_without_local_steps_keeps_its_control():
    # Client 1 has 2 samples < batch size 4: with drop_last it takes K = 0 steps.
    data = random_dataset(num_clients=2, dim=2, num_classes=2, sizes=[8, 2], seed=9)
    server = build_server(make_args("SCAFFOLD", batch_size=4), data)
    updates = run_round(server, 0).updates
    assert [u.num_steps for u in updates] == [2, 0]
    assert torch.equal(updates[1].extras["delta_control"], torch.zeros_like(server.control))
    assert torch.equal(server.state.get("control", 1), torch.zeros_like(server.control))
    updates = run_round(server, 1).updates  # now c ≠ 0: c_1 still unchanged, nothing is NaN
    assert torch.equal(server.state.get("control", 1), torch.zeros_like(server.control))
    assert torch.isfinite(server.global_params).all() and torch.isfinite(server.control).all()


def test_controls_survive_partial_participation():
    data = random_dataset(num_clients=4, dim=3, num_classes=2, seed=10)
    server = build_server(make_args("SCAFFOLD", batch_size=4, join_ratio=0.5), data)
    seen: set[int] = set()
    for rnd in range(4):
        before = {i: server.state.get("control", i).clone() for i in server.state.indices("control")}
        _, package, updates = run_round(server, rnd)
        assert len(package.cohort) == 2
        for i in range(4):
            if i in package.cohort:
                assert not torch.equal(server.state.get("control", i), before.get(i, torch.zeros_like(server.control)))
            elif i in before:
                assert torch.equal(server.state.get("control", i), before[i])  # skipped: kept
            else:
                assert not server.state.has("control", i)  # created on first participation only
        seen |= set(package.cohort)
        # With every upload received, c stays the mean of all N clients' controls (absent = 0).
        total = sum(server.state.get("control", i) for i in server.state.indices("control"))
        assert torch.allclose(server.control, total / 4, atol=1e-6)
    assert server.state.indices("control") == sorted(seen)


def test_traffic_counts_the_controls():
    data = random_dataset(num_clients=2, dim=2, num_classes=2, sizes=[4, 4])
    server = build_server(make_args("SCAFFOLD", batch_size=4), data)
    _, package, updates = run_round(server, 0)
    model_bytes = server.global_params.numel() * 4
    control_bytes = server.control.numel() * 4
    assert package.nbytes() == model_bytes + control_bytes
    assert all(u.nbytes() == model_bytes + control_bytes for u in updates)


def test_two_round_run_through_main(tmp_path):
    path = run_main_two_rounds(tmp_path, "SCAFFOLD", "-jr", "0.5")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
    assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)


def test_adjust_grad_is_vmappable():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    server = build_server(make_args("SCAFFOLD"), data)
    package = server.make_package(0, [0, 1])
    client = server.clients[0]
    ctx = client.begin_round(package, 3)
    stacked = {k: torch.stack([v, v + 1]) for k, v in ctx.items()}
    n = server.model.num_params
    w, g = torch.randn(2, n), torch.randn(2, n)
    batched = torch.func.vmap(client.adjust_grad)(w, g, stacked)
    assert torch.allclose(batched, g + stacked["correction"])


def _momentum_rounds(correction: str, engine: str = "sequential"):
    """Two rounds of SCAFFOLD with momentum on the two-client set-up, and the same by hand."""
    import pytest

    lr, beta, steps = 0.3, 0.5, 3
    data, server = two_client_server("SCAFFOLD", "--scaffold_correction", correction, seed=7, local_learning_rate=lr,
                                     local_epochs=steps, local_momentum=beta, engine=engine)
    x = server.global_params.double()
    c = torch.zeros_like(x)
    c_i = [torch.zeros_like(x), torch.zeros_like(x)]

    def local(y, grad, corr):
        v = None
        for _ in range(steps):
            if correction == "gradient":  # the correction passes through the buffer
                d = grad(y) + corr
                v = d.clone() if v is None else beta * v + d
                y = y - lr * v
            else:  # the optimiser steps on g; the correction is applied to the weights after it
                g = grad(y)
                v = g.clone() if v is None else beta * v + g
                y = y - lr * v - lr * corr
        return y
    for rnd in range(2):
        ys, dcs = clients_by_hand(data, x, c, c_i, lr, steps, local)
        x = x + ((ys[0] - x) + (ys[1] - x)) / 2
        c = c + (dcs[0] + dcs[1]) / 2
        updates = run_round(server, rnd).updates
        for k, update in enumerate(updates):
            assert update.params.double() == pytest.approx(ys[k], abs=1e-5), (correction, rnd, k)
    assert c.abs().max() > 1e-3
    return server


def test_with_momentum_the_correction_passes_through_the_buffer_or_after_the_step():
    """--scaffold_correction: ``gradient`` (default) puts c - c_i into the momentum buffer; ``step`` applies it to
    the weights after each optimiser step (NIID-Bench's and Flower's code); both against a hand computation, and
    ``step`` the same on the batched engine."""
    _momentum_rounds("gradient")
    sequential = _momentum_rounds("step")
    batched = _momentum_rounds("step", engine="batched")
    assert torch.allclose(sequential.global_params, batched.global_params, atol=1e-6, rtol=0)


def test_the_step_correction_without_momentum_is_refused(tmp_path, capsys):
    import main

    from toydata import make_dataset
    folder = make_dataset(tmp_path, num_clients=2)
    assert main.main(["-data", str(folder), "-m", "DNN", "-algo", "SCAFFOLD", "-gr", "1", "--scaffold_correction", "step",
                      "--results_dir", str(tmp_path / "r"), "-dev", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--scaffold_correction step differs from the default only with --local_momentum" in err
