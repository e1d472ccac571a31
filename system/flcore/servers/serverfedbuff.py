"""FedBuff (Nguyen et al., AISTATS 2022, "Federated Learning with Buffered Asynchronous
Aggregation"), in rounds.

The server adds every upload it receives to a buffer as its update from the model it started
from, weighted by staleness, and once the buffer holds K = ``--buffer_size`` updates it takes a
server step and empties it::

    Δ_i = (x_i − x_{τ_i}) / √(1 + t − τ_i),      x ← x + η_g · (1/K) Σ_{i in buffer} Δ_i

η_g = ``-slr``. Uploads are received in the stragglers plug-in's order (``features/stragglers.py``;
``--straggler_delay S`` makes them late); the buffer lives across rounds (it is server state, so
checkpoints keep it). With K = the cohort size, no delay and equal client sizes, FedBuff is FedAvg.
"""
from __future__ import annotations

import logging
import math
from argparse import ArgumentParser

import torch

from flcore.protocol import ClientUpdate, RoundPackage, cohort_size
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from cli.flags import add_flag
from utils.errors import FLError

log = logging.getLogger("fl")


@register_algorithm("FedBuff")
class FedBuff(Server):
    """Buffered asynchronous aggregation (module docstring)."""

    #: what persists across rounds (checkpoints): the buffer of staleness-weighted updates not yet applied
    carried = ("buffer_sum", "buffer_count")

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--buffer_size", type=int, default=10, low=1, help="FedBuff: updates per server step K")
        add_flag(parser, "-slr", "--server_learning_rate", type=float, default=1.0, above=0, help="FedBuff: server learning rate")

    def setup(self) -> None:
        if self.hp.buffer_size < 1:
            raise FLError(f"--buffer_size must be >= 1, got {self.hp.buffer_size}")
        self.buffer_sum = torch.zeros_like(self.global_params)
        self.buffer_count = 0
        per_round = len(self.clients) if self.args.random_join_ratio else cohort_size(len(self.clients), self.args.join_ratio)
        deliverable = per_round * int(self.args.global_rounds)
        if self.hp.buffer_size > deliverable:
            log.warning("warning: --buffer_size %d exceeds the %d uploads this run can deliver (%d a round over -gr %d): "
                        "the server never takes a step and the model stays the initial one; lower --buffer_size",
                        self.hp.buffer_size, deliverable, per_round, int(self.args.global_rounds))

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> int:
        """The uploads enter the buffer; returns how many went into the model (those of the server
        steps taken in this call)."""
        model, applied = self.global_params, 0
        for update in updates:
            start, origin = update.origin(package)
            self.buffer_sum += (update.params - origin) / math.sqrt(1 + package.round - start)
            self.buffer_count += 1
            if self.buffer_count == self.hp.buffer_size:
                model = model + self.buffer_sum * (self.hp.server_learning_rate / self.buffer_count)
                applied += self.buffer_count
                self.buffer_sum = torch.zeros_like(self.buffer_sum)
                self.buffer_count = 0
        self.global_params = model
        return applied

    def summary(self) -> dict[str, object]:
        return {"buffer_size": self.hp.buffer_size, "server_learning_rate": self.hp.server_learning_rate}
