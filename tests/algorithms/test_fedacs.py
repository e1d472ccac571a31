"""FedACS: the spec's hand example, one round by hand, partial participation, p = 1 is Local, main."""
from __future__ import annotations

import dataclasses

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from fltest import (build_server, gradient_descent, make_args, random_dataset, run_main_two_rounds, run_round,
                    trained_server)
from utils.errors import FLError


def hand_server(p, pool="selected", diag="include"):
    """A FedACS server on a 2-parameter model whose three clients hold the spec's §5 models."""
    data = random_dataset(num_clients=3, dim=2, num_classes=2)
    args = make_args("FedACS", "--fedacs_p", str(p), "--fedacs_pool", pool, "--fedacs_quantile_diag", diag)
    server = build_server(args, data, module=nn.Linear(2, 1, bias=False))
    for i, w in enumerate(([1.0, 0.0], [1.0, 1.0], [0.0, 1.0])):
        server.state.set("latest", i, torch.tensor(w))
    return server


def test_spec_hand_example_p02():
    server = hand_server(0.2)
    u = server.intermediate_models([0, 1, 2])
    assert server.history.extra_series["fedacs_delta"][0] == pytest.approx(0.4242641, abs=1e-7)
    assert torch.allclose(u[0], torch.tensor([1.0, 0.4142136]), atol=1e-6)
    assert torch.allclose(u[1], torch.tensor([0.7071068, 0.7071068]), atol=1e-6)
    assert torch.allclose(u[2], torch.tensor([0.4142136, 1.0]), atol=1e-6)
    assert server.history.extra_series["fedacs_kept"][0] == pytest.approx(7 / 3)


def test_spec_hand_example_p05_tie_is_dropped():
    # δ equals s_12 = s_23 exactly in float64 (it is one of them); strict ">" drops them, so every
    # u_i is w_i. Their value is 1/√2 up to the last bit, which depends on the CPU's math library.
    server = hand_server(0.5)
    u = server.intermediate_models([0, 1, 2])
    assert server.history.extra_series["fedacs_delta"][0] == pytest.approx(1 / np.sqrt(2), rel=1e-15)
    for i, w in enumerate(([1.0, 0.0], [1.0, 1.0], [0.0, 1.0])):
        assert torch.equal(u[i], torch.tensor(w))


def test_quantile_without_diagonal_and_alpha():
    # Off-diagonal entries only: [0, 0, s, s, s, s]; p = 0.2 gives δ = 0 (position 1), which keeps
    # every positive similarity: u_1 = (w_1 + s w_2) / (1 + s), u_2 = (s w_1 + w_2 + s w_3) / (1 + 2s).
    server = hand_server(0.2, diag="exclude")
    u = server.intermediate_models([0, 1, 2])
    s = 1 / np.sqrt(2)
    assert server.history.extra_series["fedacs_delta"][0] == 0.0
    assert torch.allclose(u[0].double(), torch.tensor([1 + s, s], dtype=torch.float64) / (1 + s), atol=1e-6)
    assert torch.allclose(u[1].double(), torch.tensor([1 + s, 1 + s], dtype=torch.float64) / (1 + 2 * s), atol=1e-6)
    server.hp = dataclasses.replace(server.hp, fedacs_alpha=0.5)
    u_half = server.intermediate_models([0, 1, 2])
    assert torch.allclose(u_half[0], 0.5 * torch.tensor([1.0, 0.0]) + 0.5 * u[0], atol=1e-6)


def test_pool_all_uses_non_selected_clients():
    server = hand_server(0.2, pool="all")
    u = server.intermediate_models([0])  # S over all three clients although only client 0 trains
    assert list(u) == [0]
    assert torch.allclose(u[0], torch.tensor([1.0, 0.4142136]), atol=1e-6)


def test_two_rounds_by_hand():
    # Three clients (with two, the off-diagonal cosine is the minimum of S and is never kept),
    # one full batch per epoch, two local epochs; round 1 mixes the round-0 models by Eq. 4.
    data = random_dataset(num_clients=3, dim=2, num_classes=2, sizes=[4, 5, 6], seed=3)
    p, lr = 0.1, 0.2
    args = make_args("FedACS", "--fedacs_p", str(p), local_learning_rate=lr, batch_size=6, local_epochs=2,
                     drop_last=False)
    server = build_server(args, data)
    w0 = server.global_params.double()
    data_xy = [(c.train_x.double(), c.train_y) for c in data.clients]
    latest = [gradient_descent(w0, x, y, 2, 2, lr) for x, y in data_xy]  # round 0: S = all ones, u_i = w_0
    run_round(server, 0)
    for i in range(3):
        assert torch.allclose(server.eval_params(i).double(), latest[i], atol=1e-6)

    W = torch.stack(latest).numpy()
    norms = np.linalg.norm(W, axis=1)
    S = W @ W.T / np.outer(norms, norms)
    np.fill_diagonal(S, 1.0)
    delta = np.quantile(S.reshape(-1), p)
    keep = (S > delta) | np.eye(3, dtype=bool)
    A = np.where(keep, S, 0.0)
    U = (A / A.sum(1, keepdims=True)) @ W
    assert 1 < keep.sum() - 3 < 6  # some but not all pairs collaborate
    expected = [gradient_descent(torch.from_numpy(U[i]), x, y, 2, 2, lr) for i, (x, y) in enumerate(data_xy)]
    run_round(server, 1)
    assert server.history.extra_series["fedacs_delta"][-1] == pytest.approx(delta, abs=1e-6)
    for i in range(3):
        assert torch.allclose(server.eval_params(i).double(), expected[i], atol=1e-5)
    weights = np.array([4, 5, 6]) / 15
    mean = sum(float(wt) * e for wt, e in zip(weights, expected))
    assert torch.allclose(server.global_params.double(), mean, atol=1e-5)


def test_partial_participation_keeps_state_and_first_timers_start_from_init():
    data = random_dataset(num_clients=4, dim=3, num_classes=3, seed=4)
    server = build_server(make_args("FedACS", join_ratio=0.5, batch_size=4), data)
    init = server.global_params.clone()
    cohort0 = run_round(server, 0).cohort
    for i in range(4):
        if i in cohort0:
            assert not torch.equal(server.eval_params(i), init)
        else:  # never trained: the common initial model
            assert server.state.get("latest", i) is None and torch.equal(server.eval_params(i), init)
    before = {i: server.eval_params(i).clone() for i in range(4)}
    cohort1 = run_round(server, 1).cohort
    assert cohort1 != cohort0
    for i in range(4):
        if i not in cohort1:
            assert torch.equal(server.eval_params(i), before[i])
        else:
            assert not torch.equal(server.eval_params(i), before[i])


def test_local_steps_flag():
    data = random_dataset(num_clients=2, dim=2, num_classes=2, sizes=[10, 7])
    server = build_server(make_args("FedACS", "--fedacs_local_steps", "5", batch_size=3, local_epochs=1), data)
    plans = [len(c.batch_plan(0)) for c in server.clients]
    assert plans == [5, 5]
    with pytest.raises(FLError):
        build_server(make_args("FedACS", "--fedacs_local_steps", "0"), data)


@pytest.mark.parametrize("join_ratio", [1.0, 0.5])
def test_p_one_is_local_training(join_ratio):
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=5)
    local, acs = (trained_server(data, algo, *extra, global_rounds=2, join_ratio=join_ratio, batch_size=4,
                                local_epochs=2)
                  for algo, extra in (("Local", ()), ("FedACS", ("--fedacs_p", "1"))))
    for i in range(4):
        assert torch.equal(local.eval_params(i), acs.eval_params(i))
    assert local.history.test_acc == acs.history.test_acc


def test_two_round_run_through_main(tmp_path):
    path = run_main_two_rounds(tmp_path, "FedACS")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
        assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
        assert len(f["rs_test_acc_global"][:]) == 3
        assert len(f["rs_fedacs_delta"][:]) == 2
