"""APFL: two rounds by hand (w, v, α), α = 0 evaluates the global model, α = 1 is Local, partial
participation, main."""
from __future__ import annotations

import h5py
import pytest
import torch

from fltest import (build_server, linear_grad, make_args, random_dataset, run_main_two_rounds, run_round,
                    trained_server, two_client_server)
from utils.errors import FLError


def apfl_steps(w, v, alpha, x, y, lr, steps, num_classes, adaptive=True):
    """The paper's local steps, written out: all three updates use the values before the step."""
    for _ in range(steps):
        g_w = linear_grad(w, x, y, num_classes)
        g_mix = linear_grad(alpha * v + (1 - alpha) * w, x, y, num_classes)
        new_alpha = alpha - lr * float(torch.dot(v - w, g_mix)) if adaptive else alpha
        w, v, alpha = w - lr * g_w, v - lr * alpha * g_mix, min(1.0, max(0.0, new_alpha))
    return w, v, alpha


def test_two_rounds_by_hand():
    lr, alpha0 = 0.5, 0.3
    data, server = two_client_server("APFL", "--alpha", str(alpha0), seed=1, local_learning_rate=lr)
    w = server.global_params.double()
    personal = [(w.clone(), alpha0), (w.clone(), alpha0)]
    xy = [(c.train_x.double(), c.train_y) for c in data.clients]
    for rnd in range(2):
        uploads = []
        for i, (x, y) in enumerate(xy):
            w_i, v_i, a_i = apfl_steps(w, *personal[i], x, y, lr, 2, 2)
            uploads.append(w_i)
            personal[i] = (v_i, a_i)
        w = 0.4 * uploads[0] + 0.6 * uploads[1]
        updates = run_round(server, rnd).updates
        for i in range(2):
            v_i, a_i = personal[i]
            assert torch.allclose(updates[i].params.double(), uploads[i], atol=1e-5)
            assert torch.allclose(server.state.get("personal", i).double(), v_i, atol=1e-5)
            assert server.mixing_weight(i) == pytest.approx(a_i, abs=1e-5)
            assert torch.allclose(server.eval_params(i).double(), a_i * v_i + (1 - a_i) * w, atol=1e-5)
        assert torch.allclose(server.global_params.double(), w, atol=1e-5)
    assert all(a != alpha0 for _, a in personal)  # α moved


@pytest.mark.parametrize("join_ratio", [1.0, 0.5])
def test_alpha_zero_evaluates_the_global_model(join_ratio):
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=2)
    runs = {algo: trained_server(data, algo, *extra, global_rounds=2, join_ratio=join_ratio, batch_size=4,
                                 local_epochs=2)
            for algo, extra in (("FedAvg", ()), ("APFL", ("--alpha", "0", "--apfl_adaptive_alpha", "False")))}
    apfl = runs["APFL"]
    assert torch.equal(apfl.global_params, runs["FedAvg"].global_params)
    for i in range(4):
        assert torch.equal(apfl.eval_params(i), apfl.global_params)
    assert apfl.history.test_acc == runs["FedAvg"].history.test_acc
    assert apfl.history.test_acc == apfl.history.extra_series["test_acc_global"]


def test_alpha_one_fixed_is_local_training():
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=3)
    runs = {algo: trained_server(data, algo, *extra, global_rounds=2, join_ratio=0.5, batch_size=4, local_epochs=2)
            for algo, extra in (("Local", ()), ("APFL", ("--alpha", "1", "--apfl_adaptive_alpha", "False")))}
    for i in range(4):
        assert torch.equal(runs["APFL"].eval_params(i), runs["Local"].eval_params(i))


def test_partial_participation_keeps_state_and_first_timers_start_from_init():
    data = random_dataset(num_clients=4, dim=3, num_classes=3, seed=4)
    lr, alpha0 = 0.3, 0.4
    server = build_server(make_args("APFL", "--alpha", str(alpha0), join_ratio=0.5, batch_size=50, drop_last=False,
                                    local_learning_rate=lr), data)
    init = server.global_params.clone()
    cohort0 = run_round(server, 0).cohort
    for i in set(range(4)) - set(cohort0):
        assert server.state.get("personal", i) is None and server.state.get("alpha", i) is None
        assert torch.allclose(server.eval_params(i), alpha0 * init + (1 - alpha0) * server.global_params)
    before = {i: (server.state.get("personal", i), server.state.get("alpha", i)) for i in range(4)}
    before = {i: (v.clone(), a.clone()) for i, (v, a) in before.items() if v is not None}
    w1 = server.global_params.double()
    cohort1 = run_round(server, 1).cohort
    for i in range(4):
        if i not in cohort1 and i in before:
            assert torch.equal(server.state.get("personal", i), before[i][0])
            assert torch.equal(server.state.get("alpha", i), before[i][1])
        elif i in cohort1 and i not in cohort0:  # first time: v = initial model, α = -al
            c = data.clients[i]
            _, v, a = apfl_steps(w1, init.double(), alpha0, c.train_x.double(), c.train_y, lr, 1, 3)
            assert torch.allclose(server.state.get("personal", i).double(), v, atol=1e-6)
            assert server.mixing_weight(i) == pytest.approx(a, abs=1e-6)


def test_alpha_flag_is_checked():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    with pytest.raises(FLError):
        build_server(make_args("APFL", "--alpha", "1.5"), data)
    assert build_server(make_args("APFL"), data).summary() == {"alpha": 0.25, "adaptive_alpha": True}


def test_two_round_run_through_main(tmp_path):
    path = run_main_two_rounds(tmp_path, "APFL")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
        assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
        assert len(f["rs_test_acc_global"][:]) == 3
