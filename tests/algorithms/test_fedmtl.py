"""FedMTL: the multi-task step by hand, zero regulariser is Local, pools, partial participation, main."""
from __future__ import annotations

import pytest
import torch

from fltest import (build_server, fl_log_messages, linear_grad, make_args, random_dataset, run_main_two_rounds,
                    run_round, trained_server, two_client_server)


def test_two_rounds_by_hand():
    lr, lam_mean, lam_norm = 0.1, 0.3, 0.05
    data, server = two_client_server("FedMTL", "--fedmtl_lambda_mean", str(lam_mean),
                                     "--fedmtl_lambda_norm", str(lam_norm), seed=1, local_learning_rate=lr)
    w0 = server.global_params.double()
    xy = [(c.train_x.double(), c.train_y) for c in data.clients]
    models = [w0.clone(), w0.clone()]
    for rnd in range(2):
        trained = []
        for t, (x, y) in enumerate(xy):
            others = models[1 - t]  # fixed during the round: the other client's model at the round's start
            w = models[t].clone()
            for _ in range(2):
                mean = (w + others) / 2
                w = w - lr * (linear_grad(w, x, y, 2) + 2 * lam_mean * (w - mean) + 2 * lam_norm * w)
            trained.append(w)
        package = run_round(server, rnd).package
        for t in range(2):
            assert torch.allclose(package.payload(t)["others"].double(), models[1 - t], atol=1e-6)
            assert float(package.payload(t)["pool_size"]) == 2
        models = trained
        for t in range(2):
            assert torch.allclose(server.eval_params(t).double(), models[t], atol=1e-5)
            assert torch.allclose(server.state.get("latest", t).double(), models[t], atol=1e-5)
    assert torch.equal(server.global_params, w0.float())  # no global model


@pytest.mark.parametrize("join_ratio", [1.0, 0.5])
def test_zero_regulariser_is_local(join_ratio):
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=2)
    settings = dict(global_rounds=3, join_ratio=join_ratio, batch_size=4, local_epochs=2)
    ours = trained_server(data, "FedMTL", "--fedmtl_lambda_mean", "0", **settings)
    local = trained_server(data, "Local", **settings)
    for i in range(4):
        assert torch.equal(ours.eval_params(i), local.eval_params(i))
    assert ours.history.test_acc == local.history.test_acc


def test_pools_under_partial_participation():
    data = random_dataset(num_clients=4, dim=3, num_classes=3, seed=4)
    for pool in ("cohort", "all"):
        server = build_server(make_args("FedMTL", "--fedmtl_pool", pool, join_ratio=0.5, batch_size=50,
                                        drop_last=False), data)
        init = server.global_params.clone()
        cohort0 = run_round(server, 0).cohort
        for i in set(range(4)) - set(cohort0):
            assert server.state.get("personal", i) is None and torch.equal(server.eval_params(i), init)
        before = {i: server.eval_params(i).clone() for i in range(4)}
        package = run_round(server, 1).package
        members = package.cohort if pool == "cohort" else list(range(4))
        for i in package.cohort:
            expected = sum(before[j].double() for j in members if j != i)
            assert torch.allclose(package.payload(i)["others"].double(), expected, atol=1e-6)
            assert float(package.payload(i)["pool_size"]) == len(members)
        for i in set(range(4)) - set(package.cohort):
            assert torch.equal(server.eval_params(i), before[i])


def test_upload_is_the_personal_model_and_pulls_towards_the_mean():
    data, server = two_client_server("FedMTL", "--fedmtl_lambda_mean", "5", seed=3, local_learning_rate=0.05)
    run_round(server, 0)
    gap0 = (server.eval_params(0) - server.eval_params(1)).norm()
    updates = run_round(server, 1).updates
    for u in updates:
        assert torch.equal(u.params, server.eval_params(u.index)) and u.uploads_params
    lonely = trained_server(data, "FedMTL", "--fedmtl_lambda_mean", "0", global_rounds=2, batch_size=6,
                            local_epochs=2, drop_last=False, local_learning_rate=0.05)
    assert (server.eval_params(0) - server.eval_params(1)).norm() < (lonely.eval_params(0) - lonely.eval_params(1)).norm()
    assert gap0 > 0


def test_warnings_and_flags():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    with fl_log_messages() as messages:
        build_server(make_args("FedMTL", "--fedmtl_lambda_mean", "0"), data)
        assert any("Local" in m for m in messages)
        messages.clear()
        server = build_server(make_args("FedMTL", "-itk", "10"), data)
        assert messages == []
    assert server.summary() == {"lambda_mean": 0.05, "lambda_norm": 0.0, "pool": "cohort"}


def test_two_round_run_through_main(tmp_path):
    run_main_two_rounds(tmp_path, "FedMTL")
