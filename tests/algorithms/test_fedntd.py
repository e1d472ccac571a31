"""FedNTD: not-true distillation by hand (with and without the τ² factor), β = 0 is FedAvg, no
per-client state under partial participation, not-true logits, warnings, engines."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flcore.clients.clientfedntd import not_true_logits
from fltest import (assert_same_training, build_server, engine_run, fl_log_messages, make_args, random_dataset,
                    run_round)
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from utils.errors import FLError

CLASSES = 3


def linear_logits(w, x):
    dim = x.shape[1]
    return x @ w[: dim * CLASSES].view(CLASSES, dim).T + w[dim * CLASSES:]


def hand_ntd_steps(w, glob, x, y, beta, tau, scale, lr, steps):
    """Full-batch steps on CE + β·scale·mean_i KL(q̃_g ‖ q̃_l), the true class dropped sample by sample."""
    teacher = linear_logits(glob, x)
    for _ in range(steps):
        w = w.detach().requires_grad_(True)
        logits = linear_logits(w, x)
        kl = 0.0
        for i, label in enumerate(y.tolist()):
            others = [c for c in range(CLASSES) if c != label]
            p_g = torch.softmax(teacher[i, others] / tau, 0)
            log_p_l = torch.log_softmax(logits[i, others] / tau, 0)
            kl = kl + (p_g * (p_g.log() - log_p_l)).sum()
        loss = F.cross_entropy(logits, y) + beta * scale * kl / len(y)
        (grad,) = torch.autograd.grad(loss, w)
        w = w - lr * grad
    return w.detach()


@pytest.mark.parametrize("tau_squared", [False, True])
def test_distillation_matches_hand_computation_over_two_rounds(tau_squared):
    beta, tau, lr = 2.0, 2.0, 0.5
    data = random_dataset(num_clients=2, dim=2, num_classes=CLASSES, sizes=[4, 6], seed=11)
    server = build_server(make_args("FedNTD", "-bt", str(beta), "-tau", str(tau), "--fedntd_tau_squared",
                                    str(tau_squared), local_learning_rate=lr, batch_size=6, local_epochs=3,
                                    drop_last=False), data)
    scale = tau * tau if tau_squared else 1.0
    glob = server.global_params.double()
    for rnd in range(2):
        expected = [hand_ntd_steps(glob, glob, c.train_x.double(), c.train_y, beta, tau, scale, lr, 3)
                    for c in data.clients]
        updates = run_round(server, rnd).updates
        for update, want in zip(updates, expected):
            assert torch.allclose(update.params.double(), want, atol=1e-6, rtol=0)
        plain = hand_ntd_steps(glob, glob, data.clients[1].train_x.double(), data.clients[1].train_y, 0.0, tau,
                               scale, lr, 3)
        assert (plain - expected[1]).abs().max() > 1e-4  # the distillation really acts
        glob = 0.4 * expected[0] + 0.6 * expected[1]
        assert torch.allclose(server.global_params.double(), glob, atol=1e-6, rtol=0)


def test_not_true_logits_drop_the_true_class_in_order():
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0]])
    out = not_true_logits(logits, torch.tensor([1, 2, 0]))
    assert torch.equal(out, torch.tensor([[0.0, 2.0], [3.0, 4.0], [7.0, 8.0]]))


def test_beta_zero_is_fedavg_over_two_rounds():
    data = random_dataset(num_clients=3, dim=4, num_classes=CLASSES, seed=12)
    finals = []
    for algo, extra in (("FedAvg", ()), ("FedNTD", ("-bt", "0", "-tau", "3"))):
        server = build_server(make_args(algo, *extra, batch_size=4, local_epochs=2), data)
        for rnd in range(2):
            run_round(server, rnd)
        finals.append(server.global_params)
    assert torch.equal(finals[0], finals[1])


def test_no_per_client_state_under_partial_participation():
    data = random_dataset(num_clients=4, dim=3, num_classes=CLASSES, seed=13)
    server = build_server(make_args("FedNTD", "-bt", "1", join_ratio=0.5, batch_size=4), data)
    for rnd in range(3):
        cohort, package, updates = run_round(server, rnd)
        assert len(cohort) == 2 and [u.index for u in updates] == cohort
        assert all(torch.isfinite(u.params).all() for u in updates)
    assert server.state.names() == []


def test_flags_warnings_and_errors():
    data = random_dataset(num_clients=2, dim=2, num_classes=CLASSES)
    with fl_log_messages() as messages:
        build_server(make_args("FedNTD"), data)
        assert any("FedAvg" in m for m in messages)
        messages.clear()
        server = build_server(make_args("FedNTD", "-bt", "1", "-tau", "3"), data)
        assert messages == []
    assert server.summary() == {"beta": 1.0, "tau": 3.0, "fedntd_tau_squared": False}
    with pytest.raises(FLError, match="-tau"):
        build_server(make_args("FedNTD", "-bt", "1", "-tau", "0"), data)


@pytest.mark.parametrize("engine", ["threaded", "batched"])
def test_engines_match_the_sequential_engine(engine):
    ref = engine_run("FedNTD", "sequential", beta=1.0, tau=2.0)
    out = engine_run("FedNTD", engine, beta=1.0, tau=2.0)
    assert out.engine.stats[f"{engine}_clients"] > 0
    assert_same_training(ref, out, exact=engine == "threaded", atol=2e-5, rtol=1e-4)  # batched: up to rounding
