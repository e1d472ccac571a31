"""Per-FedAvg: MAML steps by hand (FO, HF, second order), the adapted evaluation, main."""
from __future__ import annotations

import h5py
import pytest
import torch

from fltest import (build_server, linear_grad, linear_loss, make_args, random_dataset, run_main_two_rounds,
                    run_round, trained_server)
from fltest import one_thread  # noqa: F401  (an autouse fixture: importing it switches it on here)
from utils.seeding import torch_generator


def hvp_linear(w, x, y, v):
    _, product = torch.autograd.functional.hvp(lambda p: linear_loss(p, x, y, 2), w, v)
    return product


def epochs_of(client, rnd, epochs):
    """The round's minibatch plan split into epochs (the plan itself is the base's, tested there)."""
    plan = client.batch_plan(rnd, epochs)
    k = len(plan) // epochs
    return [plan[e * k : (e + 1) * k] for e in range(epochs)]


@pytest.mark.parametrize("beta_flag,order", [("0", "first"), ("0.2", "first"), ("0.2", "hessian_free"),
                                             ("0.2", "second")])
def test_local_steps_match_hand_computation(beta_flag, order):
    # Two clients (4 and 6 samples), batches of 2, two local epochs: per epoch one step from the
    # first two (three) batches; client 1's third batch is left over in first-order mode.
    data = random_dataset(num_clients=2, dim=2, num_classes=2, sizes=[4, 6], seed=1)
    alpha = 0.3
    beta = float(beta_flag) or alpha
    delta = 0.01
    args = make_args("PerAvg", "-bt", beta_flag, "--peravg_order", order, "--peravg_delta", str(delta),
                     local_learning_rate=alpha, batch_size=2, local_epochs=2)
    server = build_server(args, data)
    w0 = server.global_params.double()
    expected = []
    for client in server.clients:
        x, y = client.data.train_x.double(), client.data.train_y
        w = w0.clone()
        steps = 0
        for epoch in epochs_of(client, 0, 2):
            if order != "first" and len(epoch) < 3:
                continue
            d1, d2 = epoch[0], epoch[1]
            temp = w - alpha * linear_grad(w, x[d1], y[d1], 2)
            outer = linear_grad(temp, x[d2], y[d2], 2)
            if order == "second":
                d3 = epoch[2]
                outer = outer - alpha * hvp_linear(w, x[d3], y[d3], outer)
            elif order == "hessian_free":
                d3 = epoch[2]
                difference = (linear_grad(w + delta * outer, x[d3], y[d3], 2)
                              - linear_grad(w - delta * outer, x[d3], y[d3], 2))
                outer = outer - alpha * difference / (2 * delta)
            w = w - beta * outer
            steps += 1
        expected.append((w, steps))
    updates = run_round(server, 0).updates
    for update, (want, steps) in zip(updates, expected):
        assert update.num_steps == steps
        assert torch.allclose(update.params.double(), want, atol=1e-5 if order == "hessian_free" else 1e-6, rtol=0)
    assert [u.num_steps for u in updates] == ([2, 2] if order == "first" else [0, 2])
    weights = torch.tensor([0.4, 0.6], dtype=torch.float64)
    assert torch.allclose(server.global_params.double(), weights[0] * expected[0][0] + weights[1] * expected[1][0],
                          atol=1e-5, rtol=0)


def test_beta_zero_means_the_learning_rate():
    data = random_dataset(num_clients=3, dim=3, num_classes=2, seed=2)
    finals = [trained_server(data, "PerAvg", "-bt", beta, global_rounds=2, batch_size=2,
                             local_learning_rate=0.05).global_params for beta in ("0", "0.05")]
    assert torch.equal(finals[0], finals[1])


def test_evaluation_adapts_the_global_model_on_one_training_batch():
    data = random_dataset(num_clients=2, dim=2, num_classes=2, sizes=[5, 7], seed=3)
    alpha = 0.4
    server = build_server(make_args("PerAvg", local_learning_rate=alpha, batch_size=3, seed=7), data)
    run_round(server, 0)
    server.evaluate(1)
    g = server.global_params.double()
    for i, client in enumerate(server.clients):
        x, y = client.data.train_x.double(), client.data.train_y
        idx = torch.randperm(client.num_train, generator=torch_generator(7, "peravg-adapt", 1, client.cid))[:3]
        want = g - alpha * linear_grad(g, x[idx], y[idx], 2)
        assert torch.allclose(server.eval_params(i).double(), want, atol=1e-6, rtol=0)
        # Only training data is used: scrambling the test split changes nothing.
        client.data.test_y.copy_(1 - client.data.test_y)
        client.data.test_x.mul_(-3)
        assert torch.equal(server.eval_params(i), server.eval_params(i))
        assert torch.allclose(server.eval_params(i).double(), want, atol=1e-6, rtol=0)
    history = server.history
    assert len(history.test_acc) == 1 and len(history.extra_series["test_acc_global"]) == 1


def test_nothing_is_kept_per_client_under_partial_participation():
    data = random_dataset(num_clients=3, dim=3, num_classes=2, sizes=[6, 8, 4], seed=4)
    args = make_args("PerAvg", "-ld", "True", local_learning_rate=0.2, batch_size=2)
    server = build_server(args, data)
    run_round(server, 0, [0, 1])
    run_round(server, 1, [0])
    assert server.state.nbytes() == 0
    assert [c.participations for c in server.clients] == [2, 1, 0]
    lrs = [c.learning_rate() for c in server.clients]
    assert lrs == pytest.approx([0.2 * 0.99**2, 0.2 * 0.99, 0.2])
    # A client that never trained is evaluated on the current global model adapted with its own lr.
    server.evaluate(2)
    client = server.clients[2]
    g = server.global_params.double()
    idx = torch.randperm(4, generator=torch_generator(0, "peravg-adapt", 2, client.cid))[:2]
    want = g - 0.2 * linear_grad(g, client.data.train_x.double()[idx], client.data.train_y[idx], 2)
    assert torch.allclose(server.eval_params(2).double(), want, atol=1e-6, rtol=0)


def test_client_smaller_than_a_batch_keeps_the_global_model():
    data = random_dataset(num_clients=2, dim=2, num_classes=2, sizes=[2, 6])
    server = build_server(make_args("PerAvg", batch_size=4), data)
    server.evaluate(0)
    assert server.eval_params(0) is server.global_params
    start = server.global_params.clone()
    small, _ = run_round(server, 0).updates
    assert small.num_steps == 0 and torch.equal(small.params, start)


def test_two_round_run_through_main(tmp_path):
    path = run_main_two_rounds(tmp_path, "PerAvg")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
        acc_global = f["rs_test_acc_global"][:]
    assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
    assert len(acc_global) == 3
