"""FedLC: the calibrated loss by hand (with a class a client lacks), τ = 0 is FedAvg, no per-client
state under partial participation, margins, warnings, engines."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flcore.clients.clientfedlc import calibration_margins
from fltest import (assert_same_training, build_server, dataset_from_arrays, engine_run, fl_log_messages, make_args,
                    random_dataset, run_round)
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from utils.errors import FLError


def skewed_dataset(seed: int = 0):
    """Two clients, 3 classes; client 0 never holds class 2, client 1 holds class 0 once."""
    g = torch.Generator().manual_seed(seed)
    labels = [torch.tensor([0, 0, 0, 1]), torch.tensor([2, 1, 2, 0, 2, 2])]
    clients = [(torch.randn(len(y), 2, generator=g), y, torch.randn(3, 2, generator=g), torch.tensor([0, 1, 2]))
               for y in labels]
    return dataset_from_arrays(clients, num_classes=3)


def hand_calibrated_steps(w, x, y, tau, lr, steps, classes=3):
    """Full-batch steps on −log softmax over the classes the client holds of (f − τ·n^(−1/4))."""
    counts = torch.bincount(y, minlength=classes)
    held = [c for c in range(classes) if counts[c] > 0]
    position = {c: i for i, c in enumerate(held)}
    margins = torch.tensor([tau * float(counts[c]) ** -0.25 for c in held], dtype=w.dtype)
    target = torch.tensor([position[int(label)] for label in y])
    for _ in range(steps):
        w = w.detach().requires_grad_(True)
        logits = x @ w[: 2 * classes].view(classes, 2).T + w[2 * classes:]
        loss = F.cross_entropy(logits[:, held] - margins, target)
        (grad,) = torch.autograd.grad(loss, w)
        w = w - lr * grad
    return w.detach()


def test_calibrated_loss_matches_hand_computation_over_two_rounds():
    tau, lr = 1.5, 0.3
    data = skewed_dataset(seed=1)
    server = build_server(make_args("FedLC", "-tau", str(tau), local_learning_rate=lr, batch_size=6, local_epochs=2,
                                    drop_last=False), data)
    glob = server.global_params.double()
    for rnd in range(2):
        expected = [hand_calibrated_steps(glob, c.train_x.double(), c.train_y, tau, lr, 2) for c in data.clients]
        updates = run_round(server, rnd).updates
        for update, want in zip(updates, expected):
            assert torch.allclose(update.params.double(), want, atol=1e-6, rtol=0)
        glob = 0.4 * expected[0] + 0.6 * expected[1]
        assert torch.allclose(server.global_params.double(), glob, atol=1e-6, rtol=0)
    plain = hand_calibrated_steps(glob, data.clients[1].train_x.double(), data.clients[1].train_y, 0.0, lr, 2)
    assert (plain - hand_calibrated_steps(glob, data.clients[1].train_x.double(), data.clients[1].train_y,
                                          tau, lr, 2)).abs().max() > 1e-3  # the margins really act


def test_margins():
    margins = calibration_margins(torch.tensor([4, 1, 0]), 2.0, torch.float64)
    assert torch.allclose(margins[:2], torch.tensor([2.0 * 4 ** -0.25, 2.0], dtype=torch.float64))
    assert margins[2] == float("inf")  # an absent class takes no part in the softmax
    assert torch.equal(calibration_margins(torch.tensor([1, 1, 0]), 0.0, torch.float32), torch.zeros(3))


def test_pfllib_global_counts_are_shared_by_every_client():
    data = skewed_dataset(seed=3)
    server = build_server(make_args("FedLC", "-tau", "2", "--fedlc_counts", "global"), data)
    package = server.make_package(0, [0, 1])
    total = torch.tensor([4, 2, 4])  # class counts over both clients
    for client in server.clients:
        margins = client.begin_round(package, 1)["margins"]
        assert torch.allclose(margins, 2.0 * total.double().pow(-0.25).float())
    own = build_server(make_args("FedLC", "-tau", "2"), data).clients[0].begin_round(package, 1)["margins"]
    assert own[2] == float("inf")  # the paper's per-client counts: client 0 holds no class 2


def test_tau_zero_is_fedavg_over_two_rounds():
    data = skewed_dataset(seed=2)
    finals = []
    for algo, extra in (("FedAvg", ()), ("FedLC", ("-tau", "0"))):
        server = build_server(make_args(algo, *extra, batch_size=3, local_epochs=2), data)
        for rnd in range(2):
            run_round(server, rnd)
        finals.append(server.global_params)
    assert torch.equal(finals[0], finals[1])


def test_no_per_client_state_under_partial_participation():
    data = random_dataset(num_clients=4, dim=3, num_classes=3, seed=6)
    server = build_server(make_args("FedLC", join_ratio=0.5, batch_size=4), data)
    seen = set()
    for rnd in range(3):
        cohort, package, updates = run_round(server, rnd)
        assert len(cohort) == 2 and len(updates) == 2
        seen |= set(cohort)
        # each client's margins come from its own labels only, whoever else takes part
        for i in cohort:
            ctx = server.clients[i].begin_round(package, 1)
            counts = torch.bincount(data.clients[i].train_y, minlength=3)
            assert torch.equal(ctx["margins"], calibration_margins(counts, 1.0, torch.float32))
    assert server.state.names() == [] and len(seen) > 2


def test_flags_warnings_and_errors():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    with fl_log_messages() as messages:
        server = build_server(make_args("FedLC"), data)
        assert messages == [] and server.summary() == {"tau": 1.0, "fedlc_counts": "client"}
        build_server(make_args("FedLC", "-tau", "0"), data)
        assert any("FedAvg" in m for m in messages)
    with pytest.raises(FLError, match="-tau"):
        build_server(make_args("FedLC", "-tau", "-1"), data)


@pytest.mark.parametrize("engine", ["threaded", "batched"])
def test_engines_match_the_sequential_engine(engine):
    ref = engine_run("FedLC", "sequential", tau=2.0)
    out = engine_run("FedLC", engine, tau=2.0)
    assert out.engine.stats[f"{engine}_clients"] > 0
    assert_same_training(ref, out, exact=engine == "threaded", atol=2e-5, rtol=1e-4)  # batched: up to rounding


def test_a_client_holding_one_class_uploads_what_it_received_and_the_server_warns():
    # with its own counts (the paper's) every other class has an infinite margin: the softmax runs over
    # one class, the loss is 0 and the client never moves; PFLlib's global counts leave it training
    g = torch.Generator().manual_seed(4)
    labels = [torch.tensor([1, 1, 1, 1]), torch.tensor([2, 1, 2, 0, 2, 2])]
    data = dataset_from_arrays([(torch.randn(len(y), 2, generator=g), y, torch.randn(3, 2, generator=g),
                                 torch.tensor([0, 1, 2])) for y in labels], num_classes=3)
    with fl_log_messages() as messages:
        server = build_server(make_args("FedLC", batch_size=2), data)
        assert any("1 of 2 clients hold one class" in m and "--fedlc_counts global" in m for m in messages)
    received = server.global_params.clone()
    updates = run_round(server, 0).updates
    assert torch.equal(updates[0].params, received) and not torch.equal(updates[1].params, received)
    with fl_log_messages() as messages:
        server = build_server(make_args("FedLC", "--fedlc_counts", "global", batch_size=2), data)
        assert messages == []
    assert not torch.equal(run_round(server, 0).updates[0].params, received)
