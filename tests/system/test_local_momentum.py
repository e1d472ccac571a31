"""``--local_momentum β``: heavy-ball momentum in the clients' local SGD (PyTorch's convention,
no dampening: v ← β·v + g, w ← w − lr·v), with a buffer that starts at zero in every local
training call, as the official Sageflow code's new ``torch.optim.SGD`` per client and round."""
from __future__ import annotations

import pytest
import torch

import main
from flcore.clients.clientbase import Client
from fltest import (assert_same_training, build_server, engine_run, linear_grad, make_args, random_dataset, run_round,
                    sequential_reference)
from fltest import one_thread  # noqa: F401  (fixture)
from toydata import make_dataset
from utils.errors import FLError

ATOL, RTOL = 2e-5, 1e-4  # the batched engine's tolerance against the sequential one (tests/engines)


def _plain_sgd_before(self, model, package, ctx, plan, lr):
    """``Client.sgd`` as it was before ``--local_momentum`` existed (the reference for β = 0)."""
    model.module.train()
    loss_sum = torch.zeros((), device=model.device)
    for step, idx in enumerate(plan):
        step_ctx = self.context_at(ctx, step)
        loss_sum += self.step_gradient(model, idx, step_ctx, package, step)
        model.params.add_(self.adjust_grad(model.params, model.grad, step_ctx), alpha=-lr)
    return self.check_loss(loss_sum, len(plan), package.round)


@pytest.mark.parametrize("algo", ["FedAvg", "FedProx"])
def test_zero_momentum_is_plain_sgd_bit_for_bit(algo, monkeypatch):
    explicit = engine_run(algo, "sequential", local_momentum=0)
    default = engine_run(algo, "sequential")
    monkeypatch.setattr(Client, "sgd", _plain_sgd_before)
    before = engine_run(algo, "sequential")
    assert_same_training(before, default, exact=True)
    assert_same_training(before, explicit, exact=True)


def test_three_steps_by_hand_with_a_fresh_buffer_each_round():
    # one client of 6 samples, one full batch per epoch, 3 epochs: each local step is a full-batch step
    data = random_dataset(num_clients=1, dim=2, num_classes=2, sizes=[6], seed=4)
    lr, beta = 0.5, 0.9
    server = build_server(make_args("FedAvg", batch_size=6, local_epochs=3, drop_last=False, join_ratio=1.0,
                                    local_learning_rate=lr, local_momentum=beta), data)
    x, y = data.clients[0].train_x.double(), data.clients[0].train_y

    def by_hand(w):
        velocity = torch.zeros_like(w)  # a fresh buffer in every local training
        for _ in range(3):
            velocity = beta * velocity + linear_grad(w, x, y, 2)
            w = w - lr * velocity
        return w

    w0 = server.global_params.double()
    w1 = by_hand(w0)
    run_round(server, 0)
    torch.testing.assert_close(server.global_params.double(), w1, atol=1e-5, rtol=1e-5)
    # the test can fail: plain SGD's three steps end elsewhere
    plain = w0
    for _ in range(3):
        plain = plain - lr * linear_grad(plain, x, y, 2)
    assert (plain - w1).abs().max() > 1e-2
    # round 2 restarts the buffer at zero (a buffer kept from round 1 would end elsewhere)
    run_round(server, 1)
    torch.testing.assert_close(server.global_params.double(), by_hand(w1), atol=1e-5, rtol=1e-5)


def test_threaded_engine_equals_sequential_bit_for_bit():
    ref = engine_run("FedAvg", "sequential", local_momentum=0.9)
    out = engine_run("FedAvg", "threaded", workers=2, local_momentum=0.9)
    assert out.engine.stats["threaded_clients"] > 0
    assert_same_training(ref, out, exact=True)
    assert not torch.equal(ref.global_params, engine_run("FedAvg", "sequential").global_params)


@pytest.mark.parametrize("algo", ["FedAvg", "FedProx"])  # per-parameter update; FedProx's flat adjust_grad path
def test_batched_engine_agrees_with_sequential(algo):
    ref = sequential_reference(algo, local_momentum=0.9)
    out = engine_run(algo, "batched", local_momentum=0.9)
    assert out.engine.stats["batched_clients"] > 0 and out.engine.stats["sequential_clients"] == 0
    assert_same_training(ref, out, atol=ATOL, rtol=RTOL)


def test_batched_chunks_restart_the_buffer():
    # clients trained in chunks of 2 get their own zero buffers, as when trained all at once
    ref = engine_run("FedAvg", "sequential", local_momentum=0.5)
    out = engine_run("FedAvg", "batched", local_momentum=0.5, cohort_chunk=2)
    assert_same_training(ref, out, atol=ATOL, rtol=RTOL)


def test_own_optimiser_clients_refuse_momentum_in_one_line(tmp_path, capsys):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 8, 8))
    capsys.readouterr()
    code = main.main(["-data", str(folder), "--results_dir", str(tmp_path / "res"), "-dev", "cpu", "-gr", "1",
                      "-m", "DNN", "-algo", "pFedMe", "--local_momentum", "0.9", "--progress", "False", "-q", "True"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--local_momentum" in err and "Traceback" not in err, err
    assert not (tmp_path / "res").exists() or not list((tmp_path / "res").glob("*.h5"))


def test_clients_whose_own_loop_calls_sgd_accept_it():
    from flcore.registry import ALGORITHMS, load_all
    load_all()
    for algo in ("Ditto", "FedALA", "pFedMe", "FedAvg"):
        client_cls = ALGORITHMS.get(algo).client_cls
        assert client_cls.uses_local_momentum() == (algo != "pFedMe"), algo


def test_flag_range_is_checked():
    with pytest.raises(FLError, match=r"--local_momentum must be in \[0, 1\)"):
        make_args("FedAvg", local_momentum=1.0)
