"""The threaded engine (``--engine threaded``, ``auto`` on a multi-core CPU) against the sequential one.

Each worker trains on one intra-op thread, and these tests run the sequential engine on one
thread too (the ``one_thread`` fixture), so the two must agree to the last bit: global model,
personalised models, per-client state, curves.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from flcore.clients.clientbase import Client
from flcore.engines.auto import choose_engine
from flcore.engines.batched import BatchedEngine
from flcore.engines.sequential import SequentialEngine
from flcore.engines.threaded import ThreadedEngine
from flcore.registry import ALGORITHMS, MODELS, list_algorithms
from flcore.servers.serverbase import Server
from fltest import (OwnLoopServer, TinyLinear, assert_same_training, build_server, engine_run, image_dataset, make_args, random_dataset,
                    sequential_reference)
from fltest import notices, one_thread  # noqa: F401  (fixtures: importing them switches them on here)
from utils.errors import FLError

ALGOS = list_algorithms()


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algorithm_gives_the_sequential_numbers_exactly(algo):
    ref = sequential_reference(algo)
    out = engine_run(algo, "threaded", workers=3)
    stats = out.engine.stats
    client_cls = ALGORITHMS.get(algo).client_cls
    if client_cls.vectorisable and client_cls.train_job is Client.train_job:
        # only a cohort of one is trained on the main thread (3 rounds: at most 3 such clients)
        assert stats["sequential_clients"] <= 3
    else:
        assert stats["threaded_clients"] == 0
    assert_same_training(ref, out, exact=True)


@pytest.mark.parametrize("workers", [2, 4])
def test_cnn_matches_sequential_for_any_worker_count(workers):
    dataset = image_dataset([2, 9, 14, 5, 21, 11])
    cnn = lambda d: MODELS.get("CNN")(d.input_shape, d.num_classes, None)  # noqa: E731
    ref = engine_run("FedAvg", "sequential", dataset, cnn, batch_size=4, join_ratio=1.0, global_rounds=2)
    out = engine_run("FedAvg", "threaded", dataset, cnn, batch_size=4, join_ratio=1.0, global_rounds=2,
                     workers=workers)
    assert out.engine.stats == {"threaded_clients": 12, "sequential_clients": 0}
    assert_same_training(ref, out, exact=True)
    # the server's working model ends where the sequential engine leaves it: the last client's model
    assert torch.equal(out.model.vector, ref.model.vector)


def test_order_of_the_cohort_does_not_change_an_update():
    dataset = random_dataset(num_clients=5, dim=6, num_classes=3, sizes=[7, 12, 25, 40, 17], seed=11)

    def train(cohort):
        server = build_server(make_args("FedAvg", engine="threaded", workers=2, batch_size=5), dataset)
        package = server.make_package(1, sorted(cohort))
        updates = server.engine.train([server.clients[i] for i in cohort], package)
        return {u.index: u.params for u in updates}, [u.index for u in updates]

    forward, order = train([0, 1, 2, 3, 4])
    backward, border = train([4, 3, 2, 1, 0])
    assert order == [0, 1, 2, 3, 4] and border == [4, 3, 2, 1, 0]
    for i in range(5):
        assert torch.equal(forward[i], backward[i])


def test_global_rng_is_left_as_the_sequential_engine_leaves_it():
    dataset = random_dataset(num_clients=4, dim=6, num_classes=3, sizes=[9, 14, 6, 20], seed=2)
    states = []
    for engine in ("sequential", "threaded"):
        server = build_server(make_args("FedAvg", engine=engine, batch_size=5), dataset)
        torch.manual_seed(123)
        package = server.make_package(2, [0, 1, 2, 3])
        server.engine.train(server.clients, package)
        states.append(torch.get_rng_state())
    assert torch.equal(*states)


def test_hooks_run_on_one_thread_while_workers_train_and_the_thread_count_is_restored():
    """The main thread's own intra-op team on top of the workers oversubscribed the cores (SCAFFOLD's
    P3 rounds were slower threaded than sequential); its hooks run on one thread during training."""
    dataset = random_dataset(num_clients=4, dim=6, num_classes=3, sizes=[9, 14, 6, 20], seed=2)
    server = build_server(make_args("SCAFFOLD", engine="threaded", workers=2, batch_size=5), dataset)
    seen = []
    for client in server.clients:
        def end_round(*a, _original=client.end_round, **k):
            seen.append(torch.get_num_threads())
            return _original(*a, **k)
        client.end_round = end_round
    torch.set_num_threads(2)  # the one_thread fixture restores the suite's setting afterwards
    server.engine.train(server.clients, server.make_package(1, [0, 1, 2, 3]))
    assert seen == [1, 1, 1, 1] and server.engine.stats["threaded_clients"] == 4
    assert torch.get_num_threads() == 2


class _RandomHooksClient(Client):
    """Hooks that draw from the global RNG and keep a model-sized context, and count live contexts."""

    live, most_live = 0, 0

    def begin_round(self, package, steps):
        type(self).live += 1
        type(self).most_live = max(type(self).most_live, type(self).live)
        return {"shift": torch.rand(package.global_params.numel()) * 1e-3}

    def adjust_grad(self, w, g, ctx):
        return g + ctx["shift"][: w.shape[-1]]

    def end_round(self, params, package, ctx, steps, loss):
        type(self).live -= 1
        update = super().end_round(params, package, ctx, steps, loss)
        update.extras["noise"] = torch.randn(3)
        return update


class _RandomHooksServer(Server):
    client_cls = _RandomHooksClient


def test_hooks_see_the_sequential_random_stream_and_only_a_window_of_contexts_is_alive():
    dataset = random_dataset(num_clients=12, dim=6, num_classes=3, sizes=[5 * (1 + i % 4) for i in range(12)], seed=3)
    runs = {}
    for engine in ("sequential", "threaded"):
        _RandomHooksClient.live = _RandomHooksClient.most_live = 0
        torch.manual_seed(0)
        flags = {"workers": 2} if engine == "threaded" else {}
        server = _RandomHooksServer(make_args("FedAvg", engine=engine, batch_size=5, **flags), dataset,
                                    TinyLinear(6, 3), torch.device("cpu"))
        torch.manual_seed(7)
        updates = server.engine.train(server.clients, server.make_package(1, list(range(12))))
        runs[engine] = (updates, torch.get_rng_state(), _RandomHooksClient.most_live)
    (ref, ref_rng, _), (out, out_rng, most_live) = runs["sequential"], runs["threaded"]
    assert [u.index for u in out] == list(range(12))
    for a, b in zip(ref, out):
        assert torch.equal(a.params, b.params) and torch.equal(a.extras["noise"], b.extras["noise"])
    assert torch.equal(ref_rng, out_rng)
    assert most_live <= 2 * 2  # two per worker, not the cohort's twelve


def test_a_failing_client_in_a_worker_gives_the_first_failure_in_cohort_order():
    dataset = random_dataset(num_clients=6, dim=6, num_classes=3, sizes=[10, 10, 400, 10, 10, 10], seed=6)
    messages = []
    for engine in ("sequential", "threaded"):
        flags = {"workers": 2} if engine == "threaded" else {}
        server = build_server(make_args("FedAvg", engine=engine, batch_size=5, **flags), dataset)
        original = type(server.clients[0]).check_loss

        def check_loss(client, loss_sum, steps, rnd):  # clients 2 and 4 diverge (4 is done first)
            return original(client, loss_sum * float("nan") if client.index in (2, 4) else loss_sum, steps, rnd)

        type(server.clients[0]).check_loss = check_loss
        try:
            with pytest.raises(FLError) as info:
                server.engine.train(server.clients, server.make_package(0, list(range(6))))
        finally:
            type(server.clients[0]).check_loss = original
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "client 2 " in messages[0]


class _DropoutNet(nn.Module):
    def __init__(self, dim, classes):
        super().__init__()
        self.head = nn.Linear(dim, classes)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.head(self.drop(x))


def test_dropout_model_is_trained_sequentially_with_one_notice(notices):
    dataset = random_dataset(num_clients=3, dim=6, num_classes=3, sizes=[9, 14, 6], seed=4)
    fn = lambda d: _DropoutNet(d.input_shape[0], d.num_classes)  # noqa: E731
    ref = engine_run("FedAvg", "sequential", dataset, fn, global_rounds=2, join_ratio=1.0)
    out = engine_run("FedAvg", "threaded", dataset, fn, global_rounds=2, join_ratio=1.0, workers=3)
    assert out.engine.stats["threaded_clients"] == 0
    assert_same_training(ref, out, exact=True)
    mine = [r for r in notices if "training sequentially" in r.getMessage()]
    assert len(mine) == 1 and mine[0].levelno == logging.WARNING


def test_nan_loss_in_a_worker_is_the_sequential_error():
    dataset = random_dataset(num_clients=3, dim=6, num_classes=3, sizes=[9, 14, 30], seed=6)
    messages = []
    for engine in ("sequential", "threaded"):
        server = build_server(make_args("FedAvg", engine=engine, batch_size=5), dataset)
        server.global_params[4] = float("nan")
        with pytest.raises(FLError) as info:
            server.engine.train(server.clients, server.make_package(0, [0, 1, 2]))
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "lower the learning rate" in messages[0]


def test_an_empty_or_single_client_cohort():
    dataset = random_dataset(num_clients=3, dim=6, num_classes=3, sizes=[9, 14, 6], seed=4)
    server = build_server(make_args("SCAFFOLD", engine="threaded", workers=2, batch_size=5), dataset)
    assert server.engine.train([], server.make_package(0, [])) == []
    (update,) = server.engine.train([server.clients[1]], server.make_package(0, [1]))
    assert update.index == 1 and server.engine.stats == {"threaded_clients": 0, "sequential_clients": 1}


def test_workers_flag():
    dataset = random_dataset(num_clients=2, sizes=[8, 9])
    assert build_server(make_args("FedAvg", engine="threaded", workers=3), dataset).engine.num_workers == 3
    with pytest.raises(FLError, match="--workers"):
        build_server(make_args("FedAvg", engine="threaded", workers=-1), dataset)


def test_auto_is_the_default_and_picks_by_device():
    assert make_args("FedAvg").engine == "auto"

    def fake(device, workers):
        return SimpleNamespace(model=SimpleNamespace(device=torch.device(device)), args=SimpleNamespace(workers=workers))

    assert choose_engine(fake("cpu", 4)) is ThreadedEngine
    assert choose_engine(fake("cpu", 1)) is SequentialEngine
    assert choose_engine(fake("cuda", 0)) is BatchedEngine
    dataset = random_dataset(num_clients=3, sizes=[8, 9, 12])
    server = build_server(make_args("FedAvg", engine="auto", workers=2), dataset)
    assert isinstance(server.engine, ThreadedEngine)  # auto builds the engine it picks
    server.engine.train(server.clients, server.make_package(0, [0, 1, 2]))
    assert server.engine.stats["threaded_clients"] == 3
    single = build_server(make_args("FedAvg", engine="auto", workers=1), dataset)
    assert isinstance(single.engine, SequentialEngine)


def test_num_threads_bounds_the_default_workers(monkeypatch):
    """``--num_threads N`` alone must keep the run on N CPU threads: the workers default to
    min(cores, N); an explicit ``--workers`` still wins."""
    import flcore.engines.threaded as threaded

    monkeypatch.setattr(threaded, "available_cores", lambda: 4)
    dataset = random_dataset(num_clients=2, sizes=[8, 9])
    engine_of = lambda **flags: build_server(make_args("FedAvg", **flags), dataset).engine  # noqa: E731
    assert engine_of(engine="threaded").num_workers == 4
    assert engine_of(engine="threaded", num_threads=3).num_workers == 3
    assert engine_of(engine="threaded", num_threads=8).num_workers == 4
    assert engine_of(engine="threaded", num_threads=1, workers=2).num_workers == 2
    assert isinstance(engine_of(engine="auto", num_threads=1), SequentialEngine)
    assert isinstance(engine_of(engine="auto", num_threads=2), ThreadedEngine)
    assert isinstance(engine_of(engine="auto", num_threads=1, workers=2), ThreadedEngine)


def test_auto_informs_rather_than_warns_about_sequential_clients(notices):
    dataset = random_dataset(num_clients=3, dim=6, num_classes=3, sizes=[9, 14, 6], seed=5)
    torch.manual_seed(0)
    own = OwnLoopServer(make_args("FedAvg", engine="auto", workers=2, batch_size=5), dataset, TinyLinear(6, 3),
                        torch.device("cpu"))
    own.engine.train(own.clients, own.make_package(0, [0, 1, 2]))
    assert own.engine.stats == {"threaded_clients": 0, "sequential_clients": 3}
    mine = [r for r in notices if "not vectorisable" in r.getMessage()]
    assert len(mine) == 1 and mine[0].levelno == logging.INFO
