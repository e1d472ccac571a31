"""``--engine auto`` (the default): the fastest engine that gives the sequential engine's results.

* On a GPU: the batched engine (``torch.func.vmap`` over the cohort), which turns K launch-bound
  batch-10 steps into one step of K times the work, replayed from a CUDA graph (``capture.py``).
* On a CPU with more than one core: the threaded engine (one client per core, one working model
  per worker, one intra-op thread each). vmap is not used there: on a CPU the per-client
  convolutions are compute-bound already at batch 10, so functorch's grouped convolution does
  not beat K plain ones (see ``batched.py``), while the cores train different clients in parallel.
* On a single core, or with ``--num_threads 1`` (and no ``--workers``): the sequential engine.

Why not the sequential engine on PyTorch's intra-op threads: OpenMP's team waits at every
operation for whichever of its threads was descheduled, so one other process on the machine
stalls every step, while workers on one thread each cannot lose a core to a barrier and a busy
machine only slows them in proportion. No rule by model size is applied: with no idle core two
workers cannot beat one thread, and nothing in the engine serialises them. The measurements
behind both choices, and the faster CPU steps tried and not taken, are in
``docs/results/performance.md`` ("Why auto takes the threaded engine on a CPU", "Tried, not kept,
and why").

Each of them trains sequentially whatever it cannot handle (a client class that is not
vectorisable, a model with dropout, ...), so ``auto`` changes speed and memory, not results beyond
float rounding (checked by ``tests/engines``). Its choice and any fallback are logged at info level.
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser
from typing import TYPE_CHECKING

from flcore.engines.batched import BatchedEngine
from flcore.engines.sequential import SequentialEngine
from flcore.engines.threaded import ThreadedEngine, worker_count
from flcore.registry import register_engine

if TYPE_CHECKING:
    from flcore.protocol import Runtime

log = logging.getLogger("fl")


def choose_engine(runtime: "Runtime") -> type:
    """The engine class ``auto`` delegates to for this server's device and this machine."""
    if runtime.model.device.type == "cuda":
        return BatchedEngine
    return ThreadedEngine if worker_count(runtime.args) > 1 else SequentialEngine


@register_engine("auto")
class AutoEngine:
    """Not an engine of its own: building it builds the engine ``choose_engine`` picks, which then
    only informs (rather than warns) about what it trains sequentially."""

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        BatchedEngine.add_args(parser)
        ThreadedEngine.add_args(parser)

    def __new__(cls, runtime: "Runtime"):
        chosen = choose_engine(runtime)
        engine = chosen(runtime)
        engine.notice_level = logging.INFO
        log.info("engine auto: %s on %s", chosen.registered_name, runtime.model.device)
        return engine
