"""Ditto: two rounds by hand, λ = 0 is Local (personal) and FedAvg (global), partial participation, main."""
from __future__ import annotations

import h5py
import pytest
import torch

from fltest import (build_server, fl_log_messages, gradient_descent, linear_grad, make_args, random_dataset,
                    run_main_two_rounds, run_round, trained_server, two_client_server)
from utils.errors import FLError


def test_two_rounds_by_hand():
    # 2 global and 3 personal epochs, λ = 0.5.
    lr, lam = 0.1, 0.5
    data, server = two_client_server("Ditto", "-mu", str(lam), "-pls", "3", seed=1, local_learning_rate=lr)
    w = server.global_params.double()
    personal = [w.clone(), w.clone()]
    xy = [(c.train_x.double(), c.train_y) for c in data.clients]
    for rnd in range(2):
        trained = []
        for i, (x, y) in enumerate(xy):
            v = personal[i]
            for _ in range(3):
                v = v - lr * (linear_grad(v, x, y, 2) + lam * (v - w))
            personal[i] = v
            trained.append(gradient_descent(w, x, y, 2, 2, lr))
        w = 0.4 * trained[0] + 0.6 * trained[1]
        updates = run_round(server, rnd).updates
        assert [u.num_steps for u in updates] == [2, 2]
        for i in range(2):
            assert torch.allclose(updates[i].params.double(), trained[i], atol=1e-5)
            assert torch.allclose(server.eval_params(i).double(), personal[i], atol=1e-5)
        assert torch.allclose(server.global_params.double(), w, atol=1e-5)


@pytest.mark.parametrize("join_ratio", [1.0, 0.5])
def test_lambda_zero_is_local_and_fedavg(join_ratio):
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=2)
    runs = {algo: trained_server(data, algo, *extra, global_rounds=2, join_ratio=join_ratio, batch_size=4,
                                 local_epochs=2)
            for algo, extra in (("Local", ()), ("FedAvg", ()), ("Ditto", ("-mu", "0", "-pls", "2")))}
    for i in range(4):
        assert torch.equal(runs["Ditto"].eval_params(i), runs["Local"].eval_params(i))
    assert torch.equal(runs["Ditto"].global_params, runs["FedAvg"].global_params)
    assert runs["Ditto"].history.test_acc == runs["Local"].history.test_acc
    assert runs["Ditto"].history.extra_series["test_acc_global"] == runs["FedAvg"].history.test_acc


def test_partial_participation_keeps_state_and_first_timers_start_from_init():
    data = random_dataset(num_clients=4, dim=3, num_classes=3, seed=4)
    lr, lam = 0.05, 0.3
    server = build_server(make_args("Ditto", "-mu", str(lam), join_ratio=0.5, batch_size=50, drop_last=False,
                                    local_learning_rate=lr), data)
    init = server.global_params.clone()
    cohort0 = run_round(server, 0).cohort
    for i in set(range(4)) - set(cohort0):
        assert server.state.get("personal", i) is None and torch.equal(server.eval_params(i), init)
    before = {i: server.eval_params(i).clone() for i in range(4)}
    w1 = server.global_params.double()
    cohort1 = run_round(server, 1).cohort
    for i in range(4):
        if i not in cohort1:
            assert torch.equal(server.eval_params(i), before[i])
        elif i not in cohort0:  # first time: one full-batch step from the initial model, proximal to w^1
            c = data.clients[i]
            v = init.double()
            v = v - lr * (linear_grad(v, c.train_x.double(), c.train_y, 3) + lam * (v - w1))
            assert torch.allclose(server.eval_params(i).double(), v, atol=1e-6)


def test_warnings_and_flags():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    with fl_log_messages() as messages:
        build_server(make_args("Ditto"), data)
        assert any("Local" in m for m in messages)
        messages.clear()
        server = build_server(make_args("Ditto", "-mu", "0.1"), data)
        assert messages == []
    assert server.summary() == {"mu": 0.1, "plocal_epochs": 1}
    with pytest.raises(FLError):
        build_server(make_args("Ditto", "-pls", "0"), data)


def test_two_round_run_through_main(tmp_path):
    path = run_main_two_rounds(tmp_path, "Ditto", "-mu", "0.1")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
        assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
        assert len(f["rs_test_acc_global"][:]) == 3


def test_threaded_engine_trains_ditto_on_one_intra_op_thread():
    """Ditto's clients are not handed to workers: the threaded engine (``auto`` on a multi-core CPU)
    trains them on the main thread, which must then use one intra-op thread as the workers do. On
    PyTorch's default team every batch-10 operation waits for a descheduled core of a busy machine,
    and the numbers would be those of ``--num_threads N`` rather than of ``--num_threads 1``."""
    data = random_dataset(num_clients=3, dim=4, num_classes=3, seed=5)
    server = build_server(make_args("Ditto", "-mu", "0.1", engine="threaded", workers=2, batch_size=4), data)
    seen = []
    for client in server.clients:
        def train_job(job, model, _original=client.train_job):
            seen.append(torch.get_num_threads())
            return _original(job, model)
        client.train_job = train_job
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        server.engine.train(server.clients, server.make_package(1, [0, 1, 2]))
        assert torch.get_num_threads() == 2  # the process's setting is restored after training
    finally:
        torch.set_num_threads(threads)
    assert seen == [1, 1, 1] and server.engine.stats["threaded_clients"] == 0


def test_personal_models_are_evaluated_on_one_intra_op_thread():
    """Each personal model's pass is one small batch on the calling thread: its operations and the
    metrics run on one intra-op thread (the batch workers, when a pass has several batches, are as
    many as the process's threads), and the process's setting is restored afterwards."""
    data = random_dataset(num_clients=3, dim=4, num_classes=3, seed=6)
    server = build_server(make_args("Ditto", "-mu", "0.1", batch_size=4), data)
    run_round(server, 0)
    seen = []
    server.model.module.register_forward_pre_hook(lambda module, inputs: seen.append(torch.get_num_threads()))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        server.evaluate_models(server.eval_params)
        assert torch.get_num_threads() == 2 and server.evaluator.batch_workers() == 2
    finally:
        torch.set_num_threads(threads)
        server.evaluator.close()
    assert seen and set(seen) == {1}
