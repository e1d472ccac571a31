"""The batched cohort engine (``--engine batched`` / ``auto``) against the sequential reference.

Every registered algorithm is checked automatically: one whose client declares itself
vectorisable must give the sequential engine's models (global, personalised and per-client
state) up to float rounding; one that does not must be trained sequentially and give them
bit for bit.
"""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flcore.clients.clientbase import Client
from flcore.engines.base import keeps_base_training as client_is_vectorisable
from flcore.engines.batched import BatchedEngine
from flcore.registry import ALGORITHMS, MODELS, list_algorithms
from fltest import (OwnLoopServer, assert_same_training, build_server, engine_run, image_dataset, make_args, random_dataset,
                    sequential_reference)
from fltest import notices, one_thread  # noqa: F401  (fixtures: importing them switches them on here)
from utils.errors import FLError

ATOL, RTOL = 2e-5, 1e-4


def _vectorisable(name: str) -> bool:
    """Whether the batched engine trains this algorithm's clients itself (on the toy set-up's
    full batches): the base training procedure with the base loss or a vmappable loss hook."""
    client_cls = ALGORITHMS.get(name).client_cls
    own_loss = client_cls.local_loss is not Client.local_loss
    return (bool(client_cls.vectorisable) and client_cls.train_job is Client.train_job
            and (not own_loss or client_cls.vmappable_loss))


ALGOS = list_algorithms()
VECTORISABLE = [a for a in ALGOS if _vectorisable(a)]
SEQUENTIAL_ONLY = [a for a in ALGOS if not _vectorisable(a)]


#: Algorithms whose server amplifies float rounding between rounds, so that a whole run's models
#: compare the torch build's kernels more than the engines. FedGen's server trains its generator
#: (Linear-BatchNorm-ReLU-Linear) with 20 Adam steps on the uploaded heads each round: the
#: sequential engine alone, on 1 vs 2 intra-op threads, ends the toy run 2.2e-4 apart (torch 2.13
#: CPU), which is what the batched engine differed by on torch 2.11 + CUDA 13's CPU kernels,
#: while two runs of either engine agree to the bit. For these the engines are compared on a
#: round trained from one state (with the generator trained), which means the same on any torch.
AMPLIFIES_ROUNDING = {"FedGen"}


@pytest.mark.parametrize("algo", VECTORISABLE)
def test_vectorisable_algorithm_matches_sequential(algo):
    if algo in AMPLIFIES_ROUNDING:
        _matches_sequential_from_one_state(algo)
        return
    ref = sequential_reference(algo)
    batched = engine_run(algo, "batched")
    assert batched.engine.stats["batched_clients"] > 0
    assert batched.engine.stats["sequential_clients"] == 0
    assert_same_training(ref, batched, atol=ATOL, rtol=RTOL)


def _matches_sequential_from_one_state(algo):
    """Two runs to the same state (bit for bit: the runs are deterministic), then one more round
    of every client, by the sequential engine on one and the batched engine on the other."""
    ref = sequential_reference(algo)
    twin = engine_run(algo, "sequential")
    assert_same_training(ref, twin, exact=True)
    twin.engine = BatchedEngine(twin.runtime)
    cohort = list(range(len(ref.clients)))
    rnd = ref.args.global_rounds
    seq = ref.engine.train([ref.clients[i] for i in cohort], ref.make_package(rnd, cohort))
    out = twin.engine.train([twin.clients[i] for i in cohort], twin.make_package(rnd, cohort))
    assert twin.engine.stats["batched_clients"] == len(cohort) and twin.engine.stats["sequential_clients"] == 0
    for s, o in zip(seq, out):
        assert (s.index, s.num_steps) == (o.index, o.num_steps)
        torch.testing.assert_close(o.params, s.params, atol=ATOL, rtol=RTOL)
        assert o.loss == pytest.approx(s.loss, rel=1e-4, abs=1e-5)


def test_fedgen_round_from_one_state_uses_the_generator():
    """The one-state comparison above is not vacuous for FedGen: the round it compares has a
    trained generator, whose term changes the clients' updates."""
    server = sequential_reference("FedGen")
    cohort = list(range(len(server.clients)))
    package = server.make_package(server.args.global_rounds, cohort)
    assert package.extras.get("generator") is not None
    job = server.clients[1].plan_job(package)
    server.clients[1].open_job(job)
    assert float(job.ctx["gen_weight"]) > 0 and job.ctx["gen_features"].abs().sum() > 0


@pytest.mark.parametrize("algo", SEQUENTIAL_ONLY)
def test_non_vectorisable_algorithm_falls_back_exactly(algo):
    ref = sequential_reference(algo)
    batched = engine_run(algo, "batched")
    assert batched.engine.stats["batched_clients"] == 0
    assert_same_training(ref, batched, exact=True)


def test_some_algorithms_are_vectorisable():
    assert {"FedAvg", "Local"} <= set(VECTORISABLE)


# ------------------------------------------------------------------ a conv net, chunks, padding


def _cnn(dataset):
    return MODELS.get("CNN")(dataset.input_shape, dataset.num_classes, None)


def _one_round(server, cohort=None):
    cohort = list(range(len(server.clients))) if cohort is None else cohort
    package = server.make_package(0, cohort)
    return server.engine.train([server.clients[i] for i in cohort], package)


def _cnn_server(engine, dataset, **flags):
    args = make_args("FedAvg", engine=engine, batch_size=4, local_learning_rate=0.05, eval_auc=False, **flags)
    torch.manual_seed(0)
    return build_server(args, dataset, _cnn(dataset))


def test_cnn_round_matches_sequential_and_chunks_match_whole_cohort():
    dataset = image_dataset([2, 9, 14, 5, 21])  # 0, 2, 3, 1, 5 steps
    seq = _one_round(_cnn_server("sequential", dataset))
    whole = _one_round(_cnn_server("batched", dataset))
    chunked = _one_round(_cnn_server("batched", dataset, cohort_chunk=2))
    for s, w, c in zip(seq, whole, chunked):
        assert (s.index, s.num_steps, s.num_samples) == (w.index, w.num_steps, w.num_samples) == (c.index, c.num_steps, c.num_samples)
        torch.testing.assert_close(w.params, s.params, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(c.params, w.params, atol=ATOL, rtol=RTOL)
        assert w.loss == pytest.approx(s.loss, rel=1e-4, abs=1e-5)
        assert c.loss == pytest.approx(w.loss, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("runner", ["eager", "graph"])
@pytest.mark.parametrize("kind", ["unfold", "grouped_nhwc"])
def test_client_convolutions_of_each_kind_match_sequential(kind, runner, notices, monkeypatch):
    """``--batched_conv unfold`` (client_conv.py's vmap rule: im2col over all clients, batched
    matrix products) and ``grouped_nhwc`` (one channels-last grouped convolution) train a ragged
    cohort as the sequential engine does, up to float rounding, also through the graph runner
    (replayed eagerly on a CPU); the one-client tail takes F.conv2d."""
    from flcore.engines import client_conv
    dataset = image_dataset([2, 9, 14, 5, 21])  # 0, 2, 3, 1, 5 steps: the last two steps have one client
    seq = _one_round(_cnn_server("sequential", dataset))
    spied = "_unfold" if kind == "unfold" else "_as_groups"
    calls, original = [], getattr(client_conv, spied)
    monkeypatch.setattr(client_conv, spied, lambda *a, **k: calls.append(a[0].shape[0]) or original(*a, **k))
    server = _cnn_server("batched", dataset, batched_conv=kind, step_runner=runner)
    assert server.engine.batched_conv == kind
    out = _one_round(server)
    assert calls and max(calls) == 4  # the vmap rule ran, over the four clients with data
    for s, o in zip(seq, out):
        assert (s.index, s.num_steps) == (o.index, o.num_steps)
        torch.testing.assert_close(o.params, s.params, atol=ATOL, rtol=RTOL)
        assert o.loss == pytest.approx(s.loss, rel=1e-4, abs=1e-5)
    assert _cnn_server("batched", dataset).engine.batched_conv == "grouped"  # the default


def test_padded_clients_take_no_op_steps():
    dataset = random_dataset(num_clients=4, dim=6, num_classes=3, sizes=[3, 5, 11, 40], seed=2)
    flags = dict(engine="batched", batch_size=5, local_learning_rate=0.1)
    seq = build_server(make_args("FedAvg", **{**flags, "engine": "sequential"}), dataset)
    bat = build_server(make_args("FedAvg", **flags), dataset)
    start = seq.global_params.clone()
    ref, out = _one_round(seq), _one_round(bat)
    assert [u.num_steps for u in out] == [0, 1, 2, 8]
    # no step at all: exactly the start point; one or two real steps among 8: where sequential ends
    assert torch.equal(out[0].params, start)
    assert out[0].loss == 0.0
    for r, o in zip(ref[1:], out[1:]):
        torch.testing.assert_close(o.params, r.params, atol=1e-6, rtol=1e-6)
    # the short clients are untouched by the long client's later steps: train them alone
    alone = build_server(make_args("FedAvg", **flags), dataset)
    short = _one_round(alone, cohort=[1, 2])
    for a, o in zip(short, out[1:3]):
        torch.testing.assert_close(a.params, o.params, atol=1e-6, rtol=1e-6)


def test_ragged_plans_are_placed_first_and_padded_with_zeros():
    """The cohort index of full batches built in one go: client j's rows at its first steps."""
    rows = torch.arange(1, 13).view(6, 2)
    index = BatchedEngine._place_steps(rows, [3, 2, 0, 1], 3, torch.device("cpu"))
    expected = torch.zeros(4, 3, 2, dtype=torch.long)
    expected[0], expected[1, :2], expected[3, :1] = rows[:3], rows[3:5], rows[5:]
    assert torch.equal(index, expected)
    assert torch.equal(BatchedEngine._place_steps(rows, [2, 2, 2], 2, torch.device("cpu")), rows.view(3, 2, 2))


def test_partial_batches_are_masked_like_sequential():
    dataset = random_dataset(num_clients=3, dim=6, num_classes=3, sizes=[3, 12, 17], seed=3)
    flags = dict(batch_size=5, local_learning_rate=0.1, drop_last=False)
    ref = _one_round(build_server(make_args("FedAvg", engine="sequential", **flags), dataset))
    out = _one_round(build_server(make_args("FedAvg", engine="batched", **flags), dataset))
    assert [u.num_steps for u in out] == [1, 3, 4]
    for r, o in zip(ref, out):
        torch.testing.assert_close(o.params, r.params, atol=1e-6, rtol=1e-6)
        assert o.loss == pytest.approx(r.loss, rel=1e-5)


def test_per_client_learning_rates_and_context_are_stacked():
    # FedProx's anchor is shared (passed unbatched); -ld gives clients different rates after round 0
    algo = "FedProx" if "FedProx" in ALGOS else "FedAvg"
    ref = engine_run(algo, "sequential", join_ratio=0.6)
    out = engine_run(algo, "batched", join_ratio=0.6)
    lrs = {c.learning_rate() for c in out.clients}
    assert len(lrs) > 1
    assert_same_training(ref, out, atol=ATOL, rtol=RTOL)


# ------------------------------------------------------------------ fallbacks
class _BNNet(nn.Module):
    def __init__(self, dim, classes):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.head = nn.Linear(8, classes)

    def forward(self, x):
        return self.head(self.body(x))


class _FunctionalDropout(nn.Module):
    def __init__(self, dim, classes):
        super().__init__()
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(F.dropout(x, 0.5, self.training))


def _lenet(dataset):
    return MODELS.get("LeNet")(dataset.input_shape, dataset.num_classes, None)


@pytest.mark.parametrize("kind", ["lenet", "batchnorm", "functional-dropout"])
def test_unqualified_models_fall_back_exactly_with_one_notice(kind, notices):
    if kind == "lenet":
        dataset, fn = image_dataset([9, 14, 6], shape=(1, 28, 28)), _lenet
    else:
        dataset = random_dataset(num_clients=3, dim=6, num_classes=3, sizes=[9, 14, 6], seed=4)
        net = _BNNet if kind == "batchnorm" else _FunctionalDropout
        fn = lambda d: net(d.input_shape[0], d.num_classes)  # noqa: E731
    ref = engine_run("FedAvg", "sequential", dataset, fn, global_rounds=2, join_ratio=1.0)
    out = engine_run("FedAvg", "batched", dataset, fn, global_rounds=2, join_ratio=1.0)
    assert out.engine.stats["batched_clients"] == 0
    assert out.engine.model_fallback_reason() is not None
    assert_same_training(ref, out, exact=True)
    mine = [r for r in notices if "training sequentially" in r.getMessage()]
    assert len(mine) == 1 and mine[0].levelno == logging.WARNING
    assert out.engine.flat.vector.shape == ref.engine.runtime.model.vector.shape


def test_own_loop_clients_are_trained_sequentially_with_one_notice(notices):
    dataset = random_dataset(num_clients=3, dim=6, num_classes=3, sizes=[9, 14, 6], seed=5)
    batched = build_server(make_args("FedAvg", engine="batched", batch_size=5), dataset)
    _one_round(batched)
    assert batched.engine.stats == {"batched_clients": 3, "sequential_clients": 0}
    args = make_args("FedAvg", engine="batched", batch_size=5)
    torch.manual_seed(0)
    from fltest import TinyLinear

    own = OwnLoopServer(args, dataset, TinyLinear(6, 3), torch.device("cpu"))
    assert not client_is_vectorisable(own.clients[0])
    _one_round(own)
    _one_round(own)
    assert own.engine.stats == {"batched_clients": 0, "sequential_clients": 6}
    mine = [r for r in notices if "not vectorisable" in r.getMessage()]
    assert len(mine) == 1 and mine[0].levelno == logging.WARNING


def test_nan_loss_raises_like_sequential():
    dataset = random_dataset(num_clients=3, dim=6, num_classes=3, sizes=[9, 14, 30], seed=6)
    messages = []
    for engine in ("sequential", "batched"):
        server = build_server(make_args("FedAvg", engine=engine, batch_size=5), dataset)
        server.global_params[4] = float("nan")
        with pytest.raises(FLError) as info:
            _one_round(server)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "lower the learning rate" in messages[1]


def test_cohort_chunk_flag():
    assert make_args("FedAvg", engine="batched", cohort_chunk=7).cohort_chunk == 7
    assert make_args("FedAvg", engine="auto").cohort_chunk == 0
    dataset = random_dataset(num_clients=2, sizes=[8, 9])
    with pytest.raises(FLError):
        build_server(make_args("FedAvg", engine="batched", cohort_chunk=-1), dataset)
    assert isinstance(build_server(make_args("FedAvg", engine="batched"), dataset).engine, BatchedEngine)


def test_out_of_memory_halves_the_chunk_and_gives_the_same_models(notices, monkeypatch):
    from flcore.engines import batched as batched_module

    dataset = image_dataset([2, 9, 14, 5, 21])
    whole = _one_round(_cnn_server("batched", dataset))
    server = _cnn_server("batched", dataset)
    real = BatchedEngine._run_steps
    sizes = []

    def small_device(self, clients, *rest):
        sizes.append(len(clients))
        if len(clients) > 2:
            raise batched_module.OUT_OF_MEMORY("CUDA out of memory (simulated)")
        return real(self, clients, *rest)

    monkeypatch.setattr(BatchedEngine, "_run_steps", small_device)
    out = _one_round(server)
    assert sizes == [5, 3, 2, 1, 2]  # 5 and 3 fail; halves of 3 then the other half of 5 fit
    assert server.engine.chunk == 2
    for w, o in zip(whole, out):
        assert (w.index, w.num_steps) == (o.index, o.num_steps)
        torch.testing.assert_close(o.params, w.params, atol=ATOL, rtol=RTOL)
        assert o.loss == pytest.approx(w.loss, rel=1e-4, abs=1e-5)
    assert any("out of memory" in r.getMessage() and r.levelno == logging.WARNING for r in notices)
