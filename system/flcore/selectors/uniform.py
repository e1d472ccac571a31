"""PFLlib's client selection: a uniform sample without replacement each round.

``-jr`` gives the cohort size ``floor(nc * jr)`` (at least one client; PFLlib may truncate to 0
and crash); ``-rjr`` draws the size uniformly from [floor(nc * jr), nc] each round. The draw for
round t depends only on (seed, t), and the cohort is returned sorted so aggregation runs in
client-id order.

Restrictions (the virtual clock's availability and ``-ts``, ``flcore/plugins/clock.py``) reach every policy
through :meth:`UniformSelector.allowed`: the draw is then made among the allowed clients only, with
the same (seed, t) stream, and a cohort larger than them is all of them. Without restrictions the
draw is exactly the unrestricted one.
"""
from __future__ import annotations

from argparse import ArgumentParser, Namespace
from typing import TYPE_CHECKING

import numpy as np

from flcore.protocol import cohort_size
from flcore.registry import register_selector
from utils.cli import hyperparameters
from utils.seeding import numpy_rng

if TYPE_CHECKING:
    from flcore.protocol import ClientUpdate, RoundPackage
    from flcore.servers.serverbase import Server


@register_selector("uniform")
class UniformSelector:
    """Uniform sampling without replacement."""

    def __init__(self, server: "Server", args: Namespace):
        self.server = server
        self.args = args
        self.hp = hyperparameters(args, type(self))  # typed, frozen: the flags this policy declares
        self.num_clients = len(server.clients)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        """Selection policies may declare flags; the uniform policy uses -jr/-rjr."""

    def num_to_select(self, rnd: int) -> int:
        base = cohort_size(self.num_clients, self.args.join_ratio)
        if self.args.random_join_ratio:
            return int(numpy_rng(self.args.seed, "join-count", rnd).integers(base, self.num_clients + 1))
        return base

    def allowed(self, rnd: int) -> np.ndarray | None:
        """Positions of the clients this round may select (sorted); None when any may be."""
        mask = self.server.selectable(rnd)
        return None if mask is None else np.flatnonzero(mask)

    def select(self, rnd: int) -> list[int]:
        count = self.num_to_select(rnd)
        pool = self.allowed(rnd)
        if pool is None:
            if count >= self.num_clients:
                return list(range(self.num_clients))
            rng = numpy_rng(self.args.seed, "select", rnd)
            return sorted(int(i) for i in rng.choice(self.num_clients, size=count, replace=False))
        if count >= len(pool):
            return [int(i) for i in pool]
        rng = numpy_rng(self.args.seed, "select", rnd)
        return sorted(int(i) for i in rng.choice(pool, size=count, replace=False))

    def probabilities(self) -> np.ndarray:
        return np.full(self.num_clients, 1.0 / self.num_clients)

    def observe(self, rnd: int, package: "RoundPackage", updates: list["ClientUpdate"]) -> None:
        """Called after aggregation; adaptive policies update their scores here."""
