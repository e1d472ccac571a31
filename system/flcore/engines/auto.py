"""``--engine auto`` (the default): the fastest engine that gives the sequential engine's results.

* On a GPU: the batched engine (``torch.func.vmap`` over the cohort), which turns K launch-bound
  batch-10 steps into one step of K times the work, replayed from a CUDA graph (``capture.py``).
* On a CPU with more than one core: the threaded engine (one client per core, one working model
  per worker). vmap is not used there: on a CPU the per-client convolutions are compute-bound
  already at batch 10 and functorch's grouped convolution was slower than K plain ones (see
  ``batched.py``), while using the cores for different clients was measured 1.2-1.35x faster than
  intra-op threads on one client.
* On a single core: the sequential engine.

The choice does not depend on the model: a report that the threaded engine is slower than the
sequential one for ``MobileNet-GN`` / ``ResNet10-GN`` on tiny data was checked (2-core machine at a
load of 12-17, FedAvg, 4-6 clients of 30 samples, batch 10, seq/thr interleaved in one process).
Against the sequential engine on one intra-op thread the threaded engine took 0.98-1.22x the time
at 16x16 and 1.01-1.02x at 32x32 (the same setting repeated varied by +-15%; CNN 0.59-1.12x):
with no idle core, two workers cannot beat one thread, and nothing in the engine serialises them
(each worker runs on one intra-op thread; GroupNorm is 5-9% of a step; MobileNet's depthwise
convolutions take half of it in PyTorch's im2col kernel, on any engine). Against the sequential
engine on PyTorch's default two intra-op threads (``--num_threads 0``) it took 0.03-0.15x the
time: OpenMP's team waits for a busy core at every operation. So no size rule is applied.

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
from flcore.engines.threaded import ThreadedEngine, available_cores
from flcore.registry import register_engine

if TYPE_CHECKING:
    from flcore.protocol import Runtime

log = logging.getLogger("fl")


def choose_engine(server: "Runtime") -> type:
    """The engine class ``auto`` delegates to for this server's device and this machine."""
    if server.model.device.type == "cuda":
        return BatchedEngine
    workers = int(getattr(server.args, "workers", 0) or 0) or available_cores()
    return ThreadedEngine if workers > 1 else SequentialEngine


@register_engine("auto")
class AutoEngine:
    """Not an engine of its own: building it builds the engine ``choose_engine`` picks, which then
    only informs (rather than warns) about what it trains sequentially."""

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        BatchedEngine.add_args(parser)
        ThreadedEngine.add_args(parser)

    def __new__(cls, server: "Runtime"):
        chosen = choose_engine(server)
        engine = chosen(server)
        engine.notice_level = logging.INFO
        log.info("engine auto: %s on %s", chosen.registered_name, server.model.device)
        return engine
