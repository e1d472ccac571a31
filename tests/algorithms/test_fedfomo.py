"""FedFomo: the weighting and the mixing by hand, M = 0 is Local, candidates by affinity, the
downloads in the byte count, PFLlib's reference, partial participation, main."""
from __future__ import annotations

import pytest
import torch

from fltest import (build_server, gradient_descent, linear_loss, make_args, random_dataset, run_main_two_rounds,
                    run_round, trained_server)


def fomo_server(*flags, **settings):
    data = random_dataset(num_clients=3, dim=2, num_classes=2, sizes=[10, 15, 20], seed=1)
    settings = {"batch_size": 32, "local_epochs": 2, "drop_last": False, "local_learning_rate": 0.2, **settings}
    return data, build_server(make_args("FedFomo", *flags, **settings), data)


def split(client):
    """(train rows, validation rows) as float64: the last 20% validate."""
    n = client.train_y.shape[0]
    v = int(0.2 * n)
    x, y = client.train_x.double(), client.train_y
    return (x[: n - v], y[: n - v]), (x[n - v:], y[n - v:])


def test_two_rounds_by_hand():
    data, server = fomo_server()
    lr = 0.2
    w0 = server.global_params.double()
    parts = [split(c) for c in data.clients]
    round0 = run_round(server, 0)
    assert all(p["ids"].numel() == 0 for p in round0.package.payloads.values())
    models = [gradient_descent(w0, *train, 2, 2, lr) for train, _ in parts]  # Local: no model received yet
    for i in range(3):
        assert torch.allclose(server.eval_params(i).double(), models[i], atol=1e-5)
    expected, weights = [], []
    for i, (train, (vx, vy)) in enumerate(parts):
        others = [j for j in range(3) if j != i]
        ref_loss = float(linear_loss(models[i], vx, vy, 2))
        w = [(ref_loss - float(linear_loss(models[j], vx, vy, 2))) / (float((models[j] - models[i]).norm()) + 1e-5)
             for j in others]
        weights.append(dict(zip(others, w)))
        positive = [max(v, 0.0) for v in w]
        start = models[i] if sum(positive) == 0 else sum(p / sum(positive) * models[j] for p, j in zip(positive, others))
        expected.append(gradient_descent(start, *train, 2, 2, lr))
    round1 = run_round(server, 1)
    for i in range(3):
        payload = round1.package.payload(i)
        assert sorted(payload["ids"].tolist()) == [j for j in range(3) if j != i]
        for k, j in enumerate(payload["ids"].tolist()):
            assert torch.allclose(payload[f"model_{k}"].double(), models[j], atol=1e-5)
            assert server.affinity[i, j] == pytest.approx(weights[i][j], abs=1e-4)
        assert torch.allclose(server.eval_params(i).double(), expected[i], atol=1e-5)
    assert any(v > 0 for w in weights for v in w.values())  # the mixing was exercised
    update = round1.updates[0]
    assert update.num_samples == 8 and update.extras["fomo_weights"].shape == (2,)


def test_m_zero_is_local():
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=2)
    settings = dict(global_rounds=3, join_ratio=0.5, batch_size=4, local_epochs=2)
    ours = trained_server(data, "FedFomo", "-M", "0", "--fedfomo_val_ratio", "0", **settings)
    local = trained_server(data, "Local", **settings)
    for i in range(4):
        assert torch.equal(ours.eval_params(i), local.eval_params(i))
    assert ours.history.test_acc == local.history.test_acc


def test_candidates_by_affinity_and_download_bytes():
    data, server = fomo_server("-M", "2", num_clients=3)
    server.affinity = torch.tensor([[1.0, 0.5, 0.5], [0.0, 1.0, -1.0], [3.0, 0.0, 1.0]], dtype=torch.float64)
    assert server.candidates(0) == []  # nobody has uploaded yet
    server.uploaded[:] = True
    assert server.candidates(0) == [1, 2] and server.candidates(1) == [0, 2] and server.candidates(2) == [0, 1]
    server.uploaded[1] = False
    assert server.candidates(2) == [0]
    server.uploaded[:] = False
    run_round(server, 0)
    package = run_round(server, 1).package
    d = server.global_params.numel()
    for i in package.cohort:
        count = package.payload(i)["ids"].numel()
        assert package.nbytes(i) == d * 4 + count * (d * 4 + 8)


def test_exploration_draws_at_random_then_decays():
    data = random_dataset(num_clients=6, dim=2, num_classes=2, sizes=[10] * 6, seed=5)
    servers = {}
    for epsilon, decay in (("0", "0"), ("1", "0"), ("1", "0.5")):
        server = build_server(make_args("FedFomo", "-M", "2", "--fedfomo_epsilon", epsilon,
                                        "--fedfomo_epsilon_decay", decay), data)
        server.uploaded[:] = True
        server.affinity[0] = torch.tensor([1.0, 5.0, 4.0, 0.0, 0.0, 0.0], dtype=torch.float64)
        servers[(epsilon, decay)] = server
    rounds = range(10)
    assert all(servers[("0", "0")].candidates(0, rnd) == [1, 2] for rnd in rounds)
    explored = [servers[("1", "0")].candidates(0, rnd) for rnd in rounds]
    assert all(len(c) == 2 and 0 not in c for c in explored) and any(c != [1, 2] for c in explored)
    assert explored == [servers[("1", "0")].candidates(0, rnd) for rnd in rounds]  # seeded by (seed, round, client)
    decaying = servers[("1", "0.5")]
    assert all(decaying.candidates(0, rnd) == [1, 2] for rnd in range(2, 10))  # ε_t = 0 from round 2


def test_pfllib_reference_can_send_a_client_its_own_model():
    data, server = fomo_server("--fedfomo_reference", "aggregate", "-M", "3")
    run_round(server, 0)
    for i in range(3):  # the start of round 0's training: the initial model
        assert torch.equal(server.state.get("fomo_start", i), server.global_params)
    package = run_round(server, 1).package
    assert all(i in package.payload(i)["ids"].tolist() for i in range(3))


def test_partial_participation():
    data = random_dataset(num_clients=5, dim=3, num_classes=3, sizes=[10] * 5, seed=4)
    server = build_server(make_args("FedFomo", join_ratio=0.4, batch_size=4), data)
    cohort0 = run_round(server, 0).cohort
    before = {i: server.eval_params(i).clone() for i in range(5)}
    round1 = run_round(server, 1)
    assert set(round1.package.payloads) == set(round1.cohort)
    for i in round1.cohort:
        assert set(round1.package.payload(i)["ids"].tolist()) <= set(cohort0) - {i}
    for i in set(range(5)) - set(round1.cohort):
        assert torch.equal(server.eval_params(i), before[i])
    assert server.uploaded.tolist() == [i in set(cohort0) | set(round1.cohort) for i in range(5)]


def test_bad_flags(tmp_path):
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    from utils.errors import FLError
    with pytest.raises(FLError):
        build_server(make_args("FedFomo", "--fedfomo_val_ratio", "0"), data)
    with pytest.raises(FLError):
        build_server(make_args("FedFomo", "-M", "-1"), data)


def test_two_round_run_through_main(tmp_path):
    run_main_two_rounds(tmp_path, "FedFomo")
