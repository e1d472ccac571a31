"""PFL-DA: both phases by hand on a two-layer model, the global part is LG-FedAvg, the upload holds
only the global head, partial participation, warnings, main."""
from __future__ import annotations

import pytest
import torch

from fltest import (build_server, fl_log_messages, make_args, random_dataset, run_main_two_rounds, run_round,
                    trained_server)
from fltest import one_thread  # noqa: F401  (fixture)
from twolayer import CLASSES, DIM, HEAD, TwoLayer, grad_of, trained_two_layer, two_layer_server



@pytest.mark.parametrize("penalty", ["norm", "squared", "none"])
def test_two_rounds_by_hand(penalty):
    lr, lam = 0.1, 0.7
    data, server = two_layer_server("PFL-DA", "-lam", str(lam), "--pflda_penalty", penalty, local_learning_rate=lr)
    w0 = server.global_params.double()
    xy = [(c.train_x.double(), c.train_y) for c in data.clients]
    body = {i: w0.clone() for i in range(2)}      # each client's model, of which the body is its own
    personal = {i: None for i in range(2)}
    global_head = w0[HEAD].clone()
    for rnd in range(2):
        heads = []
        for i, (x, y) in enumerate(xy):
            start = body[i].clone()
            start[HEAD] = global_head
            p = start.clone()
            if personal[i] is not None:
                p[HEAD] = personal[i]
            for _ in range(2):  # phase 1: only the head moves
                g = grad_of(p, x, y)[HEAD]
                d = p[HEAD] - global_head
                if penalty == "norm":
                    g = g + lam * d / d.norm() if d.norm() > 0 else g
                elif penalty == "squared":
                    g = g + lam * d
                p[HEAD] = p[HEAD] - lr * g
            personal[i] = p[HEAD].clone()
            w = start.clone()
            for _ in range(2):  # phase 2: FedAvg's step on (body, global head)
                w = w - lr * grad_of(w, x, y)
            body[i] = w
            heads.append(w[HEAD])
        global_head = 0.4 * heads[0] + 0.6 * heads[1]
        updates = run_round(server, rnd).updates
        for i in range(2):
            expected = body[i].clone()
            expected[HEAD] = personal[i]
            assert torch.allclose(server.eval_params(i).double(), expected, atol=1e-5)
            # the upload: the new global head, and the server's own (initial) body, never the client's
            assert torch.allclose(updates[i].params[HEAD].double(), heads[i], atol=1e-5)
            assert torch.equal(updates[i].params[: HEAD.start], server.initial_params[: HEAD.start])
            assert updates[i].shared_numel == w0[HEAD].numel() and updates[i].extras == {}
        assert torch.allclose(server.global_params[HEAD].double(), global_head, atol=1e-5)
    if penalty != "none":  # the regulariser moved the personal heads
        assert not torch.allclose(personal[0], body[0][HEAD])


@pytest.mark.parametrize("join_ratio", [1.0, 0.5])
def test_global_part_is_lg_fedavg(join_ratio):
    data = random_dataset(num_clients=4, dim=DIM, num_classes=CLASSES, seed=3)
    settings = dict(global_rounds=3, join_ratio=join_ratio, batch_size=4)
    ours = trained_two_layer(data, "PFL-DA", "-lam", "0.5", **settings)
    lg = trained_two_layer(data, "LG-FedAvg", **settings)
    assert torch.equal(ours.global_params, lg.global_params)
    for i in range(4):
        assert ours.clients[i].participations == lg.clients[i].participations
        if lg.state.get("private", i) is not None:
            assert torch.equal(ours.state.get("private", i), lg.state.get("private", i))


def test_partial_participation_and_first_timers():
    data, server = two_layer_server("PFL-DA", "-lam", "0.3", num_clients=4, join_ratio=0.5)
    init = server.initial_params.clone()
    cohort0 = run_round(server, 0).cohort
    for i in set(range(4)) - set(cohort0):
        assert server.state.get("personal_head", i) is None and torch.equal(server.eval_params(i), init)
    before = {i: server.eval_params(i).clone() for i in range(4)}
    heads_before = {i: h.clone() for i in cohort0 if (h := server.state.get("personal_head", i)) is not None}
    g1 = server.global_params.clone()
    cohort1 = run_round(server, 1).cohort
    for i in range(4):
        if i not in cohort1:
            assert torch.equal(server.eval_params(i), before[i])
        elif i not in cohort0:  # a first-timer's personal head starts from the global head of its round
            c = data.clients[i]
            p = g1.double()
            for _ in range(2):
                g = grad_of(p, c.train_x.double(), c.train_y)[HEAD]
                d = p[HEAD] - g1[HEAD].double()
                p[HEAD] = p[HEAD] - 0.005 * (g + (0.3 * d / d.norm() if d.norm() > 0 else 0))
            assert torch.allclose(server.state.get("personal_head", i).double(), p[HEAD], atol=1e-6)
        else:
            assert not torch.equal(server.state.get("personal_head", i), heads_before[i])


def test_no_regulariser_is_local_head_training_and_warns():
    data = random_dataset(num_clients=3, dim=DIM, num_classes=CLASSES, seed=5)
    runs = []
    for flags in (("-lam", "0"), ("--pflda_penalty", "none")):
        with fl_log_messages() as messages:
            torch.manual_seed(0)
            server = build_server(make_args("PFL-DA", *flags, global_rounds=2), data, TwoLayer())
            assert any("local data only" in m for m in messages)
        server.train(progress=False)
        runs.append(server)
    for i in range(3):
        assert torch.equal(runs[0].eval_params(i), runs[1].eval_params(i))
    with fl_log_messages() as messages:
        torch.manual_seed(0)
        server = build_server(make_args("PFL-DA"), data, TwoLayer())
        assert messages == []
    assert server.summary() == {"lamda": 1.0, "penalty": "norm"}


def test_bodiless_model_shares_everything():
    data = random_dataset(num_clients=2, dim=DIM, num_classes=CLASSES, seed=6)
    ours = trained_server(data, "PFL-DA", global_rounds=2)
    fedavg = trained_server(data, "FedAvg", global_rounds=2)
    assert torch.equal(ours.global_params, fedavg.global_params)


def test_two_round_run_through_main(tmp_path):
    run_main_two_rounds(tmp_path, "PFL-DA", "-lam", "0.1")


def test_both_phases_are_charged_as_work():
    data = random_dataset(num_clients=3, dim=DIM, num_classes=CLASSES, sizes=[4, 6, 8], seed=7)
    torch.manual_seed(0)
    server = build_server(make_args("PFL-DA", batch_size=2, local_epochs=1), data, TwoLayer())
    updates = run_round(server, 0).updates
    assert [u.samples_processed for u in updates] == [8, 12, 16]
    assert [c.expected_gradient_samples() for c in server.clients] == [8, 12, 16]
