"""``--engine auto`` (the default): the fastest engine that gives the sequential engine's results.

* On a GPU: the batched engine (``torch.func.vmap`` over the cohort), which turns K launch-bound
  batch-10 steps into one step of K times the work.
* On a CPU with more than one core: the threaded engine (one client per core, one working model
  per worker). vmap is not used there: on a CPU the per-client convolutions are compute-bound
  already at batch 10 and functorch's grouped convolution was slower than K plain ones (see
  ``batched.py``), while using the cores for different clients was measured 1.2-1.35x faster than
  intra-op threads on one client.
* On a single core: the sequential engine.

Each of them trains sequentially whatever it cannot handle (a client class that is not
vectorisable, a model with dropout, ...), so ``auto`` changes speed and memory, not results beyond
float rounding (checked by ``tests/engines``). Its choice and any fallback are logged at info level.
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser
from typing import TYPE_CHECKING

from flcore.clients.clientbase import Client, ClientUpdate, RoundPackage
from flcore.engines.batched import BatchedEngine
from flcore.engines.sequential import SequentialEngine
from flcore.engines.threaded import ThreadedEngine, available_cores
from flcore.registry import register_engine

if TYPE_CHECKING:
    from flcore.servers.serverbase import Server

log = logging.getLogger("fl")


def choose_engine(server: "Server") -> type:
    """The engine class ``auto`` delegates to for this server's device and this machine."""
    if server.model.device.type == "cuda":
        return BatchedEngine
    workers = int(getattr(server.args, "workers", 0) or 0) or available_cores()
    return ThreadedEngine if workers > 1 else SequentialEngine


@register_engine("auto")
class AutoEngine:
    """Delegates to the batched (GPU), threaded (multi-core CPU) or sequential engine."""

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        BatchedEngine.add_args(parser)
        ThreadedEngine.add_args(parser)

    def __init__(self, server: "Server"):
        chosen = choose_engine(server)
        self.delegate = chosen(server)
        if hasattr(self.delegate, "notice_level"):
            self.delegate.notice_level = logging.INFO  # auto only informs about what it trains sequentially
        self.chosen_name = chosen.registered_name
        log.info("engine auto: %s on %s", self.chosen_name, server.model.device)

    @property
    def stats(self) -> dict:
        return getattr(self.delegate, "stats", {})

    def model_fallback_reason(self) -> str | None:
        reason = getattr(self.delegate, "model_fallback_reason", None)
        return reason() if reason else None

    def train(self, clients: list[Client], package: RoundPackage) -> list[ClientUpdate]:
        return self.delegate.train(clients, package)

    def close(self) -> None:
        close = getattr(self.delegate, "close", None)
        if close is not None:
            close()
