"""Stragglers in rounds (Sageflow's model): an upload reaches the server d rounds late.

With ``--straggler_delay S`` > 0, the upload of client c trained in round t arrives at the end of
round ``t + d``, d drawn uniformly from {0, ..., S} with (seed, "straggler-delay", t, c): the same
seed gives the same arrivals whatever the engine. ``--straggler_policy``:

* ``stale`` (the default): a late upload is aggregated in the round it arrives, with its staleness
  ``t_now − t`` and the global model it started from (what FedAsync and FedBuff weigh it by:
  :func:`origin_of`); a synchronous algorithm then averages it as if fresh.
* ``ignore``: late uploads are dropped (Sageflow's "FedAvg ignoring stragglers").

Uploads of one round are handed over in a fixed order: oldest start round first, then by client.
The uploads still in flight and the global models they started from are this plug-in's state
(checkpointed). ``rs_staleness`` records, per round, the staleness of every upload aggregated
(one row per round, NaN-padded): its histogram is the run's staleness histogram.

Rounds here are the server's aggregation steps; the virtual clock (``plugins/clock.py``) still
times each round as a synchronous one (the delays are counted in rounds, not seconds).
"""
from __future__ import annotations

from typing import Any

import torch

from flcore.plugins import RoundPlugin
from flcore.protocol import ClientUpdate, RoundPackage, RoundResult, Runtime
from flcore.registry import register_plugin
from utils.errors import FLError
from utils.seeding import numpy_rng

POLICIES = ("stale", "ignore")
#: what a delayed upload keeps of itself while in flight (the rest is rebuilt)
KEPT = ("index", "num_samples", "num_steps", "params", "loss", "samples_processed")


def delay_of(seed: int, most: int, rnd: int, client: int) -> int:
    """Rounds the upload of ``client`` trained in ``rnd`` is late: uniform in {0..most}."""
    return int(numpy_rng(seed, "straggler-delay", rnd, client).integers(0, most + 1))


def origin_of(plugins: dict[str, RoundPlugin], update: ClientUpdate, package: RoundPackage) -> tuple[int, torch.Tensor]:
    """(the round ``update`` started from, the global model of that round): the package's without
    stragglers."""
    stragglers = plugins.get("stragglers")
    if stragglers is None:
        return package.round, package.global_params
    return stragglers.origin(update, package)


@register_plugin("stragglers")
class Stragglers(RoundPlugin):
    """Holds late uploads back until the round they arrive in (module docstring)."""

    order = 65  # after the attack (60) poisoned the round's uploads, before aggregation

    @classmethod
    def wanted(cls, args) -> bool:
        return int(getattr(args, "straggler_delay", 0) or 0) != 0

    def __init__(self, runtime: Runtime, server_cls: type):
        super().__init__(runtime, server_cls)
        self.most = int(runtime.args.straggler_delay)
        if self.most < 0:
            raise FLError(f"--straggler_delay must be >= 0 rounds, got {self.most}")
        self.policy = str(runtime.args.straggler_policy)
        if self.policy not in POLICIES:
            raise FLError(f"--straggler_policy {self.policy}: choose one of {', '.join(POLICIES)}")
        #: uploads in flight: KEPT fields plus "start" and "due" rounds
        self.pending: list[dict[str, Any]] = []
        #: the global model of every start round an upload in flight began from
        self.origins: dict[int, torch.Tensor] = {}
        self._released: dict[int, int] = {}  # id(update) -> start round, for this round's uploads
        self._kept_origins: dict[int, torch.Tensor] = {}  # start round -> its model, for this round's

    def after_training(self, package: RoundPackage, trained: list[ClientUpdate], arrived: list[ClientUpdate],
                       result: RoundResult) -> list[ClientUpdate]:
        now = package.round
        fresh = []
        for update in arrived:
            late = delay_of(self.args.seed, self.most, now, update.index)
            if late == 0:
                fresh.append(update)
            elif self.policy == "stale":
                self.pending.append({**{name: getattr(update, name) for name in KEPT}, "start": now, "due": now + late})
                self.origins[now] = package.global_params
        due = sorted((p for p in self.pending if p["due"] <= now), key=lambda p: (p["start"], p["index"]))
        self.pending = [p for p in self.pending if p["due"] > now]
        late_uploads = [ClientUpdate(**{name: p[name] for name in KEPT}) for p in due]
        self._released = {id(u): p["start"] for u, p in zip(late_uploads, due)}
        self._released.update({id(u): now for u in fresh})
        self._kept_origins = {p["start"]: self.origins[p["start"]] for p in due}
        in_flight = {p["start"] for p in self.pending}
        self.origins = {start: params for start, params in self.origins.items() if start in in_flight}
        released = late_uploads + fresh
        self.runtime.history.add_series("staleness", [now - self._released[id(u)] for u in released])
        return released

    def origin(self, update: ClientUpdate, package: RoundPackage) -> tuple[int, torch.Tensor]:
        start = self._released.get(id(update), package.round)
        if start == package.round:
            return start, package.global_params
        return start, self._kept_origins[start]

    def state_dict(self) -> dict[str, Any]:
        return {"pending": [dict(p) for p in self.pending], "origins": dict(self.origins)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = [dict(p) for p in state["pending"]]
        self.origins = {int(k): v for k, v in state["origins"].items()}

    def summary(self) -> dict[str, object]:
        return {"straggler_delay": self.most, "straggler_policy": self.policy}
