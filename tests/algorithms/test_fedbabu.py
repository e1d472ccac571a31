"""FedBABU: a round by hand (body trained and averaged, head frozen at its initial values),
fine-tuning by hand (whole model or head), when fine-tuned models are evaluated, fine-tuning never
changes training, flags and warnings.

Shared with the other partial-sharing algorithms (``test_partial_sharing.py``): the head is never
uploaded, bytes count the body only, state under partial participation (the head never moves)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fltest import build_server, fl_log_messages, make_args, random_dataset, run_round
from test_partial_sharing import TwoLayer, body_mask, masked_descent, two_layer_server, unpack
from utils.errors import FLError


def test_two_rounds_by_hand():
    lr = 0.1
    data, server = two_layer_server("FedBABU", local_learning_rate=lr)
    w = server.global_params.double()
    body = body_mask(w)
    for rnd in range(2):
        trained = [masked_descent(w, c.train_x.double(), c.train_y, 2, lr, trainable=body) for c in data.clients]
        assert torch.equal(trained[0][~body], w[~body])  # the head never moves
        w = 0.4 * trained[0] + 0.6 * trained[1]
        run_round(server, rnd)
        assert torch.allclose(server.global_params.double(), w, atol=1e-6)
        for i in range(2):
            assert torch.equal(server.eval_params(i), server.global_params)  # no fine-tuning outside evaluation


def _accuracy(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    W1, b1, W2, b2 = unpack(w)
    return float((((x @ W1.T + b1) @ W2.T + b2).argmax(1) == y).double().mean())


@pytest.mark.parametrize("part", ["all", "head"])
def test_final_evaluation_fine_tunes_by_hand(part):
    # -gr 1: round 0 trains, the evaluation of round 1 (the last) fine-tunes 3 full-batch epochs.
    lr = 0.1
    data, server = two_layer_server("FedBABU", "-fte", "3", "--fedbabu_finetune", part, local_learning_rate=lr,
                                    global_rounds=1)
    server.train(progress=False)
    w = server.global_params.double()
    tuned_entries = None if part == "all" else ~body_mask(w)
    tuned = [masked_descent(w, c.train_x.double(), c.train_y, 3, lr, trainable=tuned_entries) for c in data.clients]
    server.tuning_round = 1
    for i in range(2):
        with torch.no_grad():  # fine-tuning turns gradients on for itself
            assert torch.allclose(server.eval_params(i).double(), tuned[i], atol=1e-6)
        if part == "head":
            assert torch.equal(server.eval_params(i)[body_mask(w)], server.global_params[body_mask(w)])
    server.tuning_round = None
    accs = [_accuracy(t, c.test_x.double(), c.test_y) for t, c in zip(tuned, data.clients)]
    globals_ = [_accuracy(w, c.test_x.double(), c.test_y) for c in data.clients]
    history = server.history
    assert np.allclose(history.client_acc[-1], accs)
    assert history.test_acc[-1] == pytest.approx((accs[0] + accs[1]) / 2)
    assert history.extra_series["test_acc_global"][-1] == pytest.approx(sum(globals_) / 2)


def test_fine_tuned_points_and_training_unchanged():
    """``final`` fine-tunes only the last evaluation, ``every`` each one; training is the same bit
    for bit either way (fine-tuning restores the RNG and stores nothing)."""
    data = random_dataset(num_clients=3, dim=4, num_classes=3, seed=4)
    runs = {}
    for at in ("final", "every"):
        torch.manual_seed(0)
        args = make_args("FedBABU", "-fte", "2", "--fedbabu_finetune_at", at, global_rounds=2, batch_size=4,
                         local_learning_rate=0.1)
        runs[at] = build_server(args, data, TwoLayer(4, 3, 3))
        runs[at].train(progress=False)
    final, every = runs["final"].history, runs["every"].history
    assert torch.equal(runs["final"].global_params, runs["every"].global_params)
    assert runs["final"].state.names() == runs["every"].state.names() == ["private"]
    # final: the first points are the global model's; every: all points are fine-tuned
    assert final.test_acc[:2] == final.extra_series["test_acc_global"][:2]
    assert final.test_acc[2] == every.test_acc[2]
    assert every.extra_series["test_acc_global"] == final.extra_series["test_acc_global"]


def test_flags_and_warnings():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    with fl_log_messages() as messages:
        server = build_server(make_args("FedBABU"), data, TwoLayer())
        assert messages == []
        build_server(make_args("FedBABU", "-fte", "0"), data, TwoLayer())
        assert any("fine-tuning" in m for m in messages)
    assert server.summary() == {"fine_tuning_epochs": 10, "fedbabu_finetune": "all", "fedbabu_finetune_at": "final"}
    with pytest.raises(FLError):
        build_server(make_args("FedBABU", "-fte", "-1"), data, TwoLayer())

