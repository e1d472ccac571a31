"""FedAMP: server message passing and client step by hand, Local reductions, partial participation, main."""
from __future__ import annotations

import math

import h5py
import pytest
import torch

from fltest import (build_server, fl_log_messages, linear_grad, make_args, random_dataset, run_main_two_rounds,
                    run_round, trained_server, two_client_server)


def hand_cloud_model(i, models, pool, alpha_k, sigma):
    """u_i = Σ_{j≠i} ξ_ij w_j + (1 − Σ ξ_ij) w_i with ξ_ij = α_K exp(−‖w_i − w_j‖²/σ)/σ."""
    xi = {j: alpha_k * math.exp(-float((models[i] - models[j]).pow(2).sum()) / sigma) / sigma for j in pool if j != i}
    return sum(x * models[j] for j, x in xi.items()) + (1 - sum(xi.values())) * models[i]


@pytest.mark.parametrize("prox", ["squared", "norm"])
def test_two_rounds_by_hand(prox):
    # Two clients, one full batch per epoch, two local epochs; round 0 has no previous uploads
    # (u_i = w_0), round 1 mixes the round-0 models.
    lr, lam, alpha_k, sigma = 0.1, 0.6, 0.4, 2.0
    data, server = two_client_server("FedAMP", "-lam", str(lam), "-alk", str(alpha_k), "-sg", str(sigma),
                                     "--fedamp_prox", prox, seed=1, local_learning_rate=lr)
    w0 = server.global_params.double()
    xy = [(c.train_x.double(), c.train_y) for c in data.clients]

    def train(u, x, y):
        w = u.clone()
        for _ in range(2):
            d = w - u
            if prox == "squared":
                extra = lam / alpha_k * d
            else:
                n = float(d.norm())
                extra = 0.5 * lam / alpha_k * d / n if n > 0 else torch.zeros_like(d)
            w = w - lr * (linear_grad(w, x, y, 2) + extra)
        return w

    models = {i: train(w0, x, y) for i, (x, y) in enumerate(xy)}
    run_round(server, 0)
    for i in range(2):
        assert torch.allclose(server.eval_params(i).double(), models[i], atol=1e-6)
    assert torch.equal(server.global_params, w0.float())  # no global model

    cloud = {i: hand_cloud_model(i, models, [0, 1], alpha_k, sigma) for i in range(2)}
    expected = {i: train(cloud[i], x, y) for i, (x, y) in enumerate(xy)}
    sent = run_round(server, 1).package
    for i in range(2):
        assert torch.allclose(sent.payload(i)["u"].double(), cloud[i], atol=1e-6)
        assert torch.allclose(server.eval_params(i).double(), expected[i], atol=1e-5)


def test_cloud_models_over_previous_or_all():
    data = random_dataset(num_clients=3, dim=2, num_classes=2)
    models = {0: torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0]), 1: torch.tensor([0.5, 0.0, 1.0, 0.0, 0.0, 0.0]),
              2: torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 0.0])}
    for pool in ("previous", "all"):
        server = build_server(make_args("FedAMP", "-alk", "0.3", "-sg", "1.5", "--fedamp_pool", pool), data)
        for i, w in models.items():
            server.state.set("latest", i, w)
        server.previous_uploads = [1, 2]
        u = server.cloud_models([0, 1])
        members = [1, 2] if pool == "previous" else [0, 1, 2]
        for i in (0, 1):
            want = hand_cloud_model(i, {k: v.double() for k, v in models.items()}, members, 0.3, 1.5)
            assert torch.allclose(u[i].double(), want, atol=1e-6)


def test_negative_self_weight_warns():
    data = random_dataset(num_clients=4, dim=2, num_classes=2)
    server = build_server(make_args("FedAMP", "--fedamp_pool", "all"), data)  # ξ = 1 for 3 identical others
    with fl_log_messages() as messages:
        u = server.cloud_models([0])
    assert any("self weight" in m for m in messages)
    assert torch.allclose(u[0], server.global_params)  # −2·w + 3·w


@pytest.mark.parametrize("extra", [("--fedamp_start", "own"), ("-alk", "1e-30")])
def test_lambda_zero_is_local_training(extra):
    # λ = 0 removes the proximal pull: from the client's own model (PFLlib's start) or with
    # α_K → 0 (u_i = w_i) FedAMP is Local training step for step, also under partial participation.
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=5)
    servers = [trained_server(data, algo, *flags, global_rounds=2, join_ratio=0.5, batch_size=4, local_epochs=2)
               for algo, flags in (("Local", ()), ("FedAMP", ("-lam", "0", *extra)))]
    for i in range(4):
        assert torch.equal(servers[0].eval_params(i), servers[1].eval_params(i))


def test_partial_participation_keeps_state_and_first_timers_start_from_init():
    data = random_dataset(num_clients=4, dim=3, num_classes=3, seed=4)
    server = build_server(make_args("FedAMP", "-alk", "0.2", join_ratio=0.5, batch_size=4), data)
    init = server.global_params.clone()
    cohort0 = run_round(server, 0).cohort
    for i in set(range(4)) - set(cohort0):
        assert server.state.get("latest", i) is None and torch.equal(server.eval_params(i), init)
    before = {i: server.eval_params(i).clone() for i in range(4)}
    cohort1 = server.select_clients(1)
    package = server.make_package(1, cohort1)
    for i in cohort1:  # a first-timer's own model in u_i is the initial model
        members = {j: before[j].double() for j in set(cohort0) | {i}}
        want = hand_cloud_model(i, members, cohort0, 0.2, 1.0)
        assert torch.allclose(package.payload(i)["u"].double(), want, atol=1e-6)
    updates = server.engine.train([server.clients[i] for i in cohort1], package)
    server.aggregate(updates, package)
    for i in set(range(4)) - set(cohort1):
        assert torch.equal(server.eval_params(i), before[i])
    assert server.previous_uploads == cohort1


def test_two_round_run_through_main(tmp_path):
    path = run_main_two_rounds(tmp_path, "FedAMP", "-alk", "0.2")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
        assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
        assert "rs_test_acc_global" not in f


@pytest.mark.parametrize("block_elements", [1 << 24, 7])
def test_squared_distances_match_the_direct_difference(monkeypatch, block_elements):
    # The Gram form ‖r‖² + ‖p‖² − 2 r·p, over one block and over many ragged column blocks, equals
    # the direct ‖r_i − p_j‖² (rows and pool of different sizes, a row repeated in the pool gives 0).
    from flcore.servers import serverfedamp

    monkeypatch.setattr(serverfedamp, "BLOCK_ELEMENTS", block_elements)
    g = torch.Generator().manual_seed(3)
    pool = 5.0 + 0.01 * torch.randn(4, 23, generator=g)  # large norms, small distances
    rows = torch.cat([pool[2:3], torch.randn(2, 23, generator=g)])
    direct = (rows.double()[:, None, :] - pool.double()[None, :, :]).pow(2).sum(-1)
    got = serverfedamp.squared_distances(rows, pool)
    assert got.dtype == torch.float64 and got.shape == (3, 4)
    torch.testing.assert_close(got, direct, rtol=1e-9, atol=1e-12)
    assert got[0, 2] == 0.0
