"""MOON: the contrastive loss by hand over two rounds, μ = 0 is FedAvg, the first participation
(none / initial), previous models under partial participation, warnings, engines, main."""
from __future__ import annotations

import h5py
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fltest import (assert_same_training, build_server, engine_run, fl_log_messages, make_args, random_dataset,
                    run_main_two_rounds, run_round)
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from utils.errors import FLError


class HiddenLayer(nn.Module):
    """A body with parameters (tanh layer) and a linear head: the contrastive term has a gradient."""

    def __init__(self, dim: int, num_classes: int, hidden: int = 3):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def moon_server(data, *flags, **settings):
    torch.manual_seed(0)
    module = HiddenLayer(data.input_shape[0], data.num_classes)
    settings = {"batch_size": 6, "local_epochs": 2, "drop_last": False, **settings}
    return build_server(make_args("MOON", *flags, **settings), data, module)


def hand_forward(v: torch.Tensor, x: torch.Tensor, dim: int, hidden: int, classes: int):
    """(features, logits) of HiddenLayer with flat parameters v = [W1, b1, W2, b2]."""
    sizes = [hidden * dim, hidden, classes * hidden, classes]
    w1, b1, w2, b2 = torch.split(v, sizes)
    z = torch.tanh(x @ w1.view(hidden, dim).T + b1)
    return z, z @ w2.view(classes, hidden).T + b2


def hand_moon_steps(w, glob, prev, x, y, mu, tau, lr, steps, dim, hidden=3, classes=2):
    """Full-batch gradient steps on CE + μ·ℓ_con written out (prev None: no contrastive term)."""
    def cosine(a, b):
        return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))

    for _ in range(steps):
        w = w.detach().requires_grad_(True)
        z, logits = hand_forward(w, x, dim, hidden, classes)
        loss = F.cross_entropy(logits, y)
        if prev is not None:
            z_glob = hand_forward(glob, x, dim, hidden, classes)[0]
            z_prev = hand_forward(prev, x, dim, hidden, classes)[0]
            a, b = cosine(z, z_glob) / tau, cosine(z, z_prev) / tau
            loss = loss + mu * (-(a - torch.logaddexp(a, b))).mean()
        (grad,) = torch.autograd.grad(loss, w)
        w = w - lr * grad
    return w.detach()


def test_contrastive_loss_matches_hand_computation_over_two_rounds():
    mu, tau, lr = 2.0, 0.5, 0.2
    data = random_dataset(num_clients=2, dim=2, num_classes=2, sizes=[4, 6], seed=3)
    server = moon_server(data, "-mu", str(mu), "-tau", str(tau), local_learning_rate=lr)
    glob = server.global_params.double()
    previous = [None, None]
    for rnd in range(2):
        expected = [hand_moon_steps(glob, glob, previous[k], c.train_x.double(), c.train_y, mu, tau, lr, 2, dim=2)
                    for k, c in enumerate(data.clients)]
        updates = run_round(server, rnd).updates
        for update, want in zip(updates, expected):
            assert torch.allclose(update.params.double(), want, atol=1e-6, rtol=0)
        if rnd == 1:  # the contrastive gradient is really there: plain SGD lands elsewhere
            plain = hand_moon_steps(glob, glob, None, data.clients[0].train_x.double(), data.clients[0].train_y,
                                    mu, tau, lr, 2, dim=2)
            assert (plain - expected[0]).abs().max() > 1e-4
        glob = 0.4 * expected[0] + 0.6 * expected[1]
        assert torch.allclose(server.global_params.double(), glob, atol=1e-6, rtol=0)
        previous = expected


def test_mu_zero_is_fedavg_over_two_rounds():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, seed=2)
    finals = []
    for algo, extra in (("FedAvg", ()), ("MOON", ("-mu", "0"))):
        torch.manual_seed(0)
        server = build_server(make_args(algo, *extra, batch_size=4, local_epochs=2), data, HiddenLayer(4, 3))
        for rnd in range(2):
            run_round(server, rnd)
        finals.append(server.global_params)
    assert torch.equal(finals[0], finals[1])
    # the term weighted 0 is not computed, and no previous model is kept for it
    assert not list(server.state.indices("previous"))


@pytest.mark.parametrize("first_previous", ["none", "initial"])
def test_first_participation_without_or_with_the_initial_model(first_previous):
    # client 1 first takes part in round 1, after client 0 moved the global model in round 0
    mu, tau, lr = 1.0, 0.5, 0.2
    data = random_dataset(num_clients=2, dim=2, num_classes=2, sizes=[4, 6], seed=4)
    server = moon_server(data, "-mu", str(mu), "-tau", str(tau), "--moon_first_previous", first_previous,
                         local_learning_rate=lr)
    initial = server.global_params.double()
    run_round(server, 0, cohort=[0])
    glob = server.global_params.double()
    update = run_round(server, 1, cohort=[1]).updates[0]
    prev = initial if first_previous == "initial" else None
    client = data.clients[1]
    want = hand_moon_steps(glob, glob, prev, client.train_x.double(), client.train_y, mu, tau, lr, 2, dim=2)
    assert torch.allclose(update.params.double(), want, atol=1e-6, rtol=0)
    other = hand_moon_steps(glob, glob, initial if prev is None else None, client.train_x.double(), client.train_y,
                            mu, tau, lr, 2, dim=2)
    assert (other - want).abs().max() > 1e-4  # the two readings really differ here


def test_previous_models_under_partial_participation():
    data = random_dataset(num_clients=4, dim=3, num_classes=2, seed=5)
    server = moon_server(data, "-mu", "1", join_ratio=0.5, batch_size=4, drop_last=True)
    for rnd in range(4):
        before = {i: server.state.get("previous", i).clone() for i in server.state.indices("previous")}
        _, package, updates = run_round(server, rnd)
        assert len(package.cohort) == 2
        uploaded = {u.index: u.params for u in updates}
        for i in range(4):
            if i in package.cohort:
                assert torch.equal(server.state.get("previous", i), uploaded[i])
            elif i in before:
                assert torch.equal(server.state.get("previous", i), before[i])  # skipped: kept
            else:
                assert not server.state.has("previous", i)  # created by the first participation only


def test_flags_warnings_and_errors():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    with fl_log_messages() as messages:
        build_server(make_args("MOON"), data)
        assert any("FedAvg" in m for m in messages)
        messages.clear()
        server = build_server(make_args("MOON", "-mu", "1", "-tau", "0.5"), data)
        assert messages == []
    assert server.summary() == {"mu": 1.0, "tau": 0.5, "moon_first_previous": "none"}
    with pytest.raises(FLError, match="-tau"):
        build_server(make_args("MOON", "-mu", "1", "-tau", "0"), data)


@pytest.mark.parametrize("engine", ["threaded", "batched"])
def test_engines_match_the_sequential_engine(engine):
    def module_fn(dataset):
        return HiddenLayer(dataset.input_shape[0], dataset.num_classes, hidden=4)

    ref = engine_run("MOON", "sequential", module_fn=module_fn, mu=1.0, tau=0.5)
    out = engine_run("MOON", engine, module_fn=module_fn, mu=1.0, tau=0.5)
    assert out.engine.stats[f"{engine}_clients"] > 0  # the loss hook really ran on this engine
    assert_same_training(ref, out, exact=engine == "threaded", atol=2e-5, rtol=1e-4)  # batched: up to rounding


def test_two_round_run_through_main(tmp_path):
    path = run_main_two_rounds(tmp_path, "MOON", "-mu", "1", "-tau", "0.5")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
    assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
