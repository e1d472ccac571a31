"""Stragglers: uploads that reach the server after the round that sent their model, and how long
the server waits for them.

Where lateness comes from (one of the two):

* ``--straggler_delay S`` > 0 (Sageflow's model, in rounds): the upload of client c trained in round
  t is ``d`` rounds late, d drawn uniformly from {0, ..., S} with (seed, "straggler-delay", t, c).
* ``--straggler_clock`` (the virtual clock's device profiles, ``plugins/clock.py``): the upload
  takes its client's virtual seconds ``t_i`` (download, training, upload at the client's speeds) from
  the round's start.

How long the server waits: ``--straggler_wait q`` in [0, 1], the share of the round's uploads it
waits for, ``k = ⌈q · n⌉`` of the n that arrive (the fastest: smallest delay, or smallest ``t_i``;
ties by client index). With the clock at least one (k ≥ 1).

* Rounds: the server waits ``d_w`` extra periods, the largest delay of the k awaited uploads (0 for
  q = 0: only the uploads with d = 0 are on time, Sageflow's setting). Every upload with d ≤ d_w is
  on time; a later one arrives ``d − d_w`` rounds later. The virtual clock's round lasts
  ``1 + d_w`` times its synchronous duration (a period is the round as the clock times it).
* Clock: the round ends at the deadline ``D``, the k-th smallest ``t_i``: uploads with t_i ≤ D are on
  time; a later one reaches the server at virtual time ``start + t_i``, in the first later round
  that ends at or after that time. With q = 1 the server waits for all: the clock's round is
  unchanged (it already lasts until the last upload).

So ``q = 1`` is "wait for all" (no upload is ever late), ``0 < q < 1`` "wait for a fraction", and
``q = 0`` with ``--straggler_delay`` Sageflow's "do not wait". ``--straggler_policy`` says what
happens to the uploads the server did not wait for:

* ``stale`` (the default): aggregated in the round they arrive, with their staleness ``t_now − t``
  and the global model they started from (what FedAsync and FedBuff weigh them by:
  :func:`origin_of`); a synchronous algorithm then averages them as if fresh.
* ``ignore``: dropped (Sageflow's "FedAvg ignoring stragglers").

A client may be selected again while an upload of it is still in flight (as in Sageflow's
simulation). Everything is a function of the seed (and the trace): the same seed gives the same
arrivals and event order whatever the engine. Uploads of one round are handed over in a fixed order:
oldest start round first, then by client. The uploads still in flight and the global models they
started from are this plug-in's state (checkpointed).

Results: ``rs_staleness`` records, per round, the staleness of every upload aggregated (one row per
round, NaN-padded); main.py writes its histogram as the attribute ``staleness_histogram`` (counts of
staleness 0, 1, 2, ... rounds; utils/result_utils.py). Rounds are the server's aggregation steps.
"""
from __future__ import annotations

import math
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


def awaited(lateness: list[float], indices: list[int], share: float, at_least: int) -> float | None:
    """The lateness up to which the server waits: that of the ⌈share · n⌉-th fastest upload (at least
    ``at_least`` of them; ties by client index), or None when it awaits none."""
    count = min(len(lateness), max(at_least, math.ceil(share * len(lateness) - 1e-9)))
    if count == 0:
        return None
    order = sorted(zip(lateness, indices))
    return order[count - 1][0]


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
        return (int(getattr(args, "straggler_delay", 0) or 0) != 0 or bool(getattr(args, "straggler_clock", False))
                or float(getattr(args, "straggler_wait", 0) or 0) != 0
                or getattr(args, "straggler_policy", "stale") != "stale")  # to refuse them alone

    def __init__(self, runtime: Runtime, server_cls: type):
        super().__init__(runtime, server_cls)
        args = runtime.args
        self.most = int(args.straggler_delay)
        if self.most < 0:
            raise FLError(f"--straggler_delay must be >= 0 rounds, got {self.most}")
        self.by_clock = bool(args.straggler_clock)
        if self.by_clock and self.most:
            raise FLError("--straggler_delay (Sageflow's delays in rounds) and --straggler_clock (the clock's device "
                          "times) are two models of lateness; give one of them")
        if not self.by_clock and not self.most:
            raise FLError("--straggler_wait and --straggler_policy act on late uploads: give --straggler_delay S "
                          "(Sageflow's delays in rounds) or --straggler_clock True (the clock's device times)")
        self.policy = str(args.straggler_policy)
        if self.policy not in POLICIES:
            raise FLError(f"--straggler_policy {self.policy}: choose one of {', '.join(POLICIES)}")
        self.share = float(args.straggler_wait)
        if not 0 <= self.share <= 1:
            raise FLError(f"--straggler_wait must be in [0, 1] (the share of uploads the server waits for), "
                          f"got {self.share:g}")
        #: uploads in flight: KEPT fields plus "start" and "due" (a round, or a virtual time with the clock)
        self.pending: list[dict[str, Any]] = []
        #: the global model of every start round an upload in flight began from
        self.origins: dict[int, torch.Tensor] = {}
        self._released: dict[int, int] = {}  # id(update) -> start round, for this round's uploads
        self._kept_origins: dict[int, torch.Tensor] = {}  # start round -> its model, for this round's

    def after_training(self, package: RoundPackage, trained: list[ClientUpdate], arrived: list[ClientUpdate],
                       result: RoundResult) -> list[ClientUpdate]:
        now = package.round
        clock = self.peers.get("clock")
        fresh, late = self.split(now, arrived, clock, result)
        if self.policy == "ignore":  # they were sent all the same: the traffic counts them
            result.discarded_nbytes += sum(update.nbytes() for update, _ in late)
        if self.policy == "stale":
            for update, due in late:
                self.pending.append({**{name: getattr(update, name) for name in KEPT}, "start": now, "due": due})
                self.origins[now] = package.global_params
        arrived_by = clock.now if self.by_clock else now  # the end of this round, in the lateness' unit
        due = sorted((p for p in self.pending if p["due"] <= arrived_by), key=lambda p: (p["start"], p["index"]))
        self.pending = [p for p in self.pending if p["due"] > arrived_by]
        late_uploads = [ClientUpdate(**{name: p[name] for name in KEPT}) for p in due]
        self._released = {id(u): p["start"] for u, p in zip(late_uploads, due)}
        self._released.update({id(u): now for u in fresh})
        self._kept_origins = {p["start"]: self.origins[p["start"]] for p in due}
        in_flight = {p["start"] for p in self.pending}
        self.origins = {start: params for start, params in self.origins.items() if start in in_flight}
        released = late_uploads + fresh
        self.runtime.history.add_series("staleness", [now - self._released[id(u)] for u in released])
        return released

    def split(self, now: int, arrived: list[ClientUpdate], clock: Any,
              result: RoundResult) -> tuple[list[ClientUpdate], list[tuple[ClientUpdate, float]]]:
        """The uploads on time, and the late ones with when they are due; retimes the clock's round."""
        indices = [u.index for u in arrived]
        if self.by_clock:
            seconds = [clock.upload_seconds[i] for i in indices]
            deadline = awaited(seconds, indices, self.share, at_least=1)
            if deadline is None:
                return [], []
            if self.share < 1:
                clock.retime_round(deadline, result)
            late = [(u, clock.round_start + s) for u, s in zip(arrived, seconds) if s > deadline]
            return [u for u, s in zip(arrived, seconds) if s <= deadline], late
        delays = [delay_of(self.args.seed, self.most, now, i) for i in indices]
        waited = awaited(delays, indices, self.share, at_least=0) or 0
        if waited and clock is not None:
            clock.retime_round((clock.now - clock.round_start) * (1 + waited), result)
        late = [(u, now + d - waited) for u, d in zip(arrived, delays) if d > waited]
        return [u for u, d in zip(arrived, delays) if d <= waited], late

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
        return {"straggler_delay": self.most, "straggler_clock": self.by_clock, "straggler_policy": self.policy,
                "straggler_wait": self.share}
