"""The batched engine's step runners (``--step_runner``, ``flcore/engines/capture.py``).

On a CPU the static runner replays the step eagerly on its static buffers: the code path of the
CUDA graph (buckets of rows, retired rows kept by the ``active`` mask, inputs copied in per step,
state copied in and out per segment) without the capture, which the CUDA cases add.
"""
from __future__ import annotations

import logging

import pytest
import torch

from flcore.engines import capture
from flcore.engines.capture import EagerStepRunner, StaticStepRunner, bucket
from fltest import assert_same_training, build_server, engine_run, image_dataset, make_args, random_dataset
from fltest import notices, one_thread  # noqa: F401  (fixtures)
from flcore.registry import MODELS

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
ATOL, RTOL = 2e-5, 1e-4


def test_bucket_rounds_the_active_rows_up_to_a_power_of_two():
    assert [bucket(a, 20) for a in (20, 17, 16, 9, 8, 5, 3, 2, 1)] == [20, 20, 16, 16, 8, 8, 4, 2, 1]
    assert bucket(3, 3) == 3 and bucket(2, 3) == 2


def _round(server, cohort=None):
    cohort = list(range(len(server.clients))) if cohort is None else cohort
    return server.engine.train([server.clients[i] for i in cohort], server.make_package(0, cohort))


def _cnn_server(dataset, device="cpu", **flags):
    args = make_args("FedAvg", engine="batched", batch_size=4, local_learning_rate=0.05, eval_auc=False, **flags)
    torch.manual_seed(0)
    module = MODELS.get("CNN")(dataset.input_shape, dataset.num_classes, None)
    return build_server(args, dataset, module)


@pytest.mark.parametrize("drop_last", [True, False])
def test_static_runner_matches_eager_on_ragged_cohorts(drop_last):
    # 0..5 steps: the active rows shrink 5 -> 4 -> 2 -> 1 (buckets 5, 4, 2, 1); partial batches
    # without --drop_last give masked steps in the middle of a segment
    dataset = image_dataset([2, 9, 14, 5, 21])
    eager = _round(_cnn_server(dataset, step_runner="eager", drop_last=drop_last))
    server = _cnn_server(dataset, step_runner="graph", drop_last=drop_last)
    assert isinstance(server.engine.runner, StaticStepRunner)
    static = _round(server)
    again = _round(server)  # the buffers are reused next round
    for e, s, a in zip(eager, static, again):
        assert (e.index, e.num_steps) == (s.index, s.num_steps)
        torch.testing.assert_close(s.params, e.params, atol=ATOL, rtol=RTOL)
        assert s.loss == pytest.approx(e.loss, rel=1e-4, abs=1e-5)
        assert torch.equal(a.params, s.params)
    (slot,) = server.engine.runner.slots.values()  # one set of buffers for the chunk, reused next round
    assert len(slot.replays) >= 3  # a replay per bucket of rows (5, 4, 2, 1 clients)


def test_retired_rows_are_untouched_exactly():
    # a client without a step is the start point to the bit, though its row is in every bucket
    dataset = random_dataset(num_clients=4, dim=6, num_classes=3, sizes=[3, 5, 11, 40], seed=2)
    server = build_server(make_args("FedAvg", engine="batched", batch_size=5, local_learning_rate=0.1,
                                    step_runner="graph"), dataset)
    start = server.global_params.clone()
    out = _round(server)
    assert [u.num_steps for u in out] == [0, 1, 2, 8]
    assert torch.equal(out[0].params, start) and out[0].loss == 0.0
    alone = build_server(make_args("FedAvg", engine="batched", batch_size=5, local_learning_rate=0.1,
                                   step_runner="eager"), dataset)
    for a, o in zip(_round(alone, [1, 2]), out[1:3]):
        torch.testing.assert_close(o.params, a.params, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("algo", ["FedProx", "SCAFFOLD", "FedGen", "FedRep", "MOON"])
def test_static_runner_matches_eager_for_context_gradient_terms_and_loss_hooks(algo):
    ref = engine_run(algo, "batched", step_runner="eager")
    out = engine_run(algo, "batched", step_runner="graph")
    assert out.engine.stats["batched_clients"] > 0 and out.engine.stats["sequential_clients"] == 0
    assert_same_training(ref, out, atol=ATOL, rtol=RTOL)


def test_graph_on_a_cpu_says_once_that_it_replays_eagerly(notices):
    engine_run("FedAvg", "batched", step_runner="graph", global_rounds=2)
    mine = [r for r in notices if "CUDA graphs need a GPU" in r.getMessage()]
    assert len(mine) == 1 and mine[0].levelno == logging.WARNING


def test_a_step_that_cannot_be_captured_runs_eagerly_with_one_notice(monkeypatch, notices):
    dataset = image_dataset([2, 9, 14, 5, 21])
    eager = _round(_cnn_server(dataset, step_runner="eager"))
    server = _cnn_server(dataset, step_runner="graph")
    runner = server.engine.runner
    runner._capture_ok = True  # pretend to be on a GPU, whose capture then fails

    def refuse(*_args):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(runner, "_capture", refuse)
    out = _round(server)
    out2 = _round(server)
    mine = [r for r in notices if "cannot be captured" in r.getMessage()]
    assert len(mine) == 1 and not runner._capture_ok and runner.captured == 0
    for e, o, o2 in zip(eager, out, out2):
        torch.testing.assert_close(o.params, e.params, atol=ATOL, rtol=RTOL)
        assert torch.equal(o.params, o2.params)


def test_a_failed_compile_runs_eagerly_with_one_notice(monkeypatch, notices):
    def broken(fn, **_kwargs):
        def call(*_args):
            raise RuntimeError("no compiler here")
        return call

    monkeypatch.setattr(capture.torch, "compile", broken)
    dataset = image_dataset([2, 9, 14, 5, 21])
    eager = _round(_cnn_server(dataset, step_runner="eager"))
    out = _round(_cnn_server(dataset, step_runner="compiled"))
    mine = [r for r in notices if "torch.compile failed" in r.getMessage()]
    assert len(mine) == 1
    for e, o in zip(eager, out):
        torch.testing.assert_close(o.params, e.params, atol=ATOL, rtol=RTOL)


def test_auto_is_eager_on_a_cpu():
    dataset = random_dataset(num_clients=2, sizes=[8, 9])
    server = build_server(make_args("FedAvg", engine="batched"), dataset)
    assert isinstance(server.engine.runner, EagerStepRunner)


@CUDA
@pytest.mark.parametrize("algo", ["FedAvg", "SCAFFOLD", "FedGen"])
def test_captured_graph_matches_eager_on_the_gpu(algo, monkeypatch):
    from test_devices import cnn_run

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    device = torch.device("cuda")
    ref = cnn_run(algo, "batched", device, step_runner="eager")
    out = cnn_run(algo, "batched", device, step_runner="graph")
    assert out.engine.runner.captured > 0, "no graph was captured"
    assert_same_training(ref, out, atol=1e-4, rtol=1e-4)
