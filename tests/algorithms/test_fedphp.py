"""FedPHP: the MMD-supervised step and the HPM's moving average by hand, λ = 0 is FedAvg's training,
partial participation, the evaluated model, warnings, main."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fltest import fl_log_messages, random_dataset, run_main_two_rounds, run_round
from fltest import one_thread  # noqa: F401  (fixture)
from twolayer import CLASSES, DIM, features, logits, trained_two_layer, two_layer_server


def mmd_by_hand(a, b):
    def kernel(u, v):
        d = ((u[:, None, :] - v[None, :, :]) ** 2).sum(-1)
        return sum(torch.exp(-d / (2 * s)) for s in (10.0, 15.0, 20.0, 50.0))
    return (kernel(a, a) + kernel(b, b) - 2 * kernel(a, b)).mean()


def local_steps(w, p, x, y, steps, lr, lam):
    target = features(p, x).detach()
    for _ in range(steps):
        w = w.detach().clone().requires_grad_(True)
        z = features(w, x)
        loss = (1 - lam) * F.cross_entropy(logits(w, z), y) + lam * mmd_by_hand(z, target)
        (g,) = torch.autograd.grad(loss, w)
        w = (w - lr * g).detach()
    return w


def test_two_rounds_by_hand():
    lr, lam, mu, rounds = 0.2, 0.6, 0.8, 4
    data, server = two_layer_server("FedPHP", "-lam", str(lam), "-mu", str(mu), local_learning_rate=lr,
                                    global_rounds=rounds)
    w = server.global_params.double()
    xy = [(c.train_x.double(), c.train_y) for c in data.clients]
    hpm = [w.clone(), w.clone()]  # the global model of the first participation
    for rnd in range(2):
        trained = [local_steps(w, hpm[i], x, y, 2, lr, lam) for i, (x, y) in enumerate(xy)]
        weight = mu * rnd / rounds
        hpm = [(1 - weight) * trained[i] + weight * hpm[i] for i in range(2)]
        w = 0.4 * trained[0] + 0.6 * trained[1]
        run_round(server, rnd)
        assert torch.allclose(server.global_params.double(), w, atol=1e-5)
        for i in range(2):
            assert torch.allclose(server.state.get("inherited", i).double(), hpm[i], atol=1e-5)
            assert torch.allclose(server.eval_params(i).double(), trained[i], atol=1e-5)
    assert not torch.allclose(hpm[0], trained[0])  # round 1's HPM keeps some history


def test_mmd_term_is_zero_at_the_hpm_and_positive_elsewhere():
    from flcore.clients.clientfedphp import mmd
    a = torch.randn(5, 3, dtype=torch.float64)
    assert float(mmd(a, a)) == pytest.approx(0.0, abs=1e-12)
    b = a + 1.0
    assert float(mmd(a, b)) == pytest.approx(float(mmd_by_hand(a, b)), rel=1e-10) and float(mmd(a, b)) > 0


@pytest.mark.parametrize("join_ratio", [1.0, 0.5])
def test_lambda_zero_trains_as_fedavg(join_ratio):
    data = random_dataset(num_clients=4, dim=DIM, num_classes=CLASSES, seed=2)
    settings = dict(global_rounds=3, join_ratio=join_ratio, batch_size=4)
    runs = {"FedPHP": trained_two_layer(data, "FedPHP", "-lam", "0", **settings),
            "FedAvg": trained_two_layer(data, "FedAvg", **settings)}
    assert torch.equal(runs["FedPHP"].global_params, runs["FedAvg"].global_params)
    assert runs["FedPHP"].history.extra_series["test_acc_global"] == runs["FedAvg"].history.test_acc


def test_partial_participation_and_first_timers():
    data, server = two_layer_server("FedPHP", num_clients=4, join_ratio=0.5, global_rounds=5)
    cohort0 = run_round(server, 0).cohort
    for i in set(range(4)) - set(cohort0):
        assert server.state.get("inherited", i) is None and torch.equal(server.eval_params(i), server.global_params)
    before = {i: (server.state.get("inherited", i).clone(), server.eval_params(i).clone()) for i in cohort0}
    g1 = server.global_params.clone()
    package = run_round(server, 1).package
    for i in range(4):
        if i in before and i not in package.cohort:
            assert torch.equal(server.state.get("inherited", i), before[i][0])
            assert torch.equal(server.eval_params(i), before[i][1])
        elif i in package.cohort and i not in cohort0:  # the first HPM is the received global model
            trained = server.eval_params(i)
            weight = 0.9 * 1 / 5
            assert torch.allclose(server.state.get("inherited", i), (1 - weight) * trained + weight * g1, atol=1e-6)


def test_inherited_evaluation_and_warnings():
    data, server = two_layer_server("FedPHP", "--fedphp_eval", "inherited")
    run_round(server, 0)
    for i in range(2):
        assert torch.equal(server.eval_params(i), server.state.get("inherited", i))
        assert server.state.get("personalised", i) is None
    with fl_log_messages() as messages:
        two_layer_server("FedPHP", "-lam", "1", "-mu", "0")
        assert any("cross-entropy weight 0" in m for m in messages) and any("-mu 0" in m for m in messages)
        messages.clear()
        _, server = two_layer_server("FedPHP")
        assert messages == []
    assert server.summary() == {"lamda": 0.5, "mu": 0.9, "eval": "local"}


def test_two_round_run_through_main(tmp_path):
    run_main_two_rounds(tmp_path, "FedPHP")
