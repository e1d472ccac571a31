"""PFLlib's client selection: a uniform sample without replacement each round.

``-jr`` gives the cohort size ``floor(nc * jr)`` (at least one client; PFLlib may truncate to 0
and crash); ``-rjr`` draws the size uniformly from [floor(nc * jr), nc] each round. The draw for
round t depends only on (seed, t), and the cohort is returned sorted so aggregation runs in
client-id order.

A policy sees the run's :class:`~flcore.protocol.Runtime` (settings, clients, history, model), not
the server. Each round the server hands it the clients the round plug-ins allow
(``select(t, selectable)``: the virtual clock's availability and ``-ts``, ``flcore/features/clock.py``;
None when nothing restricts them), and after aggregation what the round sent and received with the
new global model (``observe(t, package, updates, global_params)``: the sent model is
``package.global_params``). Under restrictions the draw is made among the allowed clients only
(:func:`allowed_pool`), with the same (seed, t) stream, and a cohort larger than them is all of
them. Without restrictions the draw is exactly the unrestricted one.

What a policy keeps across rounds it names in ``carried`` (the persistence contract,
``flcore.extension.Carries``): checkpoints save those attributes (AdaFL's scores) and nothing else.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import TYPE_CHECKING

import numpy as np

from flcore.extension import Carries
from flcore.protocol import cohort_size
from flcore.registry import register_selector
from cli.flags import hyperparameters
from utils.seeding import numpy_rng

if TYPE_CHECKING:
    import torch

    from flcore.protocol import ClientUpdate, RoundPackage, Runtime


def allowed_pool(selectable: np.ndarray | None) -> np.ndarray | None:
    """Positions of the clients a round may select (sorted), of the plug-ins' mask; None when any may be."""
    return None if selectable is None else np.flatnonzero(selectable)


@register_selector("uniform")
class UniformSelector(Carries):
    """Uniform sampling without replacement (it keeps nothing across rounds: each round's draw
    depends on (seed, round) alone; a policy that learns names its state in ``carried``)."""

    def __init__(self, runtime: "Runtime"):
        self.runtime = runtime
        self.args = runtime.args
        self.hp = hyperparameters(self.args, type(self))  # typed, frozen: the flags this policy declares
        self.num_clients = len(runtime.clients)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        """Selection policies may declare flags; the uniform policy uses -jr/-rjr."""

    def num_to_select(self, rnd: int) -> int:
        base = cohort_size(self.num_clients, self.args.join_ratio)
        if self.args.random_join_ratio:
            return int(numpy_rng(self.args.seed, "join-count", rnd).integers(base, self.num_clients + 1))
        return base

    def select(self, rnd: int, selectable: np.ndarray | None) -> list[int]:
        """The cohort of round ``rnd`` (sorted), among the clients ``selectable`` allows (None: any)."""
        count = self.num_to_select(rnd)
        pool = allowed_pool(selectable)
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

    def observe(self, rnd: int, package: "RoundPackage", updates: list["ClientUpdate"],
                global_params: "torch.Tensor") -> None:
        """Called after aggregation with the round's package (the model sent: ``package.global_params``),
        the uploads that were aggregated and the new global model; adaptive policies update their
        scores here."""
