"""Stragglers: uploads that reach the server after the round that sent their model, and how long
the server waits for them.

Where lateness comes from (one of the two):

* ``--straggler_delay S`` > 0 (Sageflow's model, in rounds): the upload of client c trained in round
  t is ``d`` rounds late, d drawn uniformly from {0, ..., S} with (seed, "straggler-delay", t, c).
* ``--straggler_clock`` (the virtual clock's device profiles, ``features/clock.py``): the upload
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
  and the global model they started from, stamped on each upload this plug-in releases
  (``ClientUpdate.origin_round`` and ``origin_params``: what FedAsync, FedBuff and Sageflow weigh
  them by); a synchronous algorithm then averages them as if fresh.
* ``ignore``: dropped (Sageflow's "FedAvg ignoring stragglers").

Traffic: every upload counts in ``rs_bytes_up`` in the round it was sent; ``rs_bytes_up_arrived``
counts a late one in the round it arrives, and an ignored one (or one still in flight when the run
ends) never.

How delays are drawn, ``--straggler_delays`` (rounds only):

* ``uniform`` (the default): every upload's delay U{0..S} as above, independent per (seed, round,
  client) (:func:`delay_of`).
* ``each``: the official Sageflow code's draw ("each staleness group has at least one element"):
  the round's training clients in a random order from (seed, "straggler-order", round) (a
  permutation of the sorted cohort); the first gets delay 0, the second 1, ..., the (S+1)-th S; the
  others U{0..S} as :func:`delay_of`. With fewer than S + 1 trainers the first ones get 0, 1, ...
  (:func:`round_delays`).

Clients whose upload is in flight, ``--straggler_busy`` (rounds only):

* a client is *busy* in round r when an upload it trained in an earlier round t reaches the server
  in round r or later: with delay d and the server waiting ``d_w`` periods it arrives in round
  ``t + d − d_w``, so the client is busy in rounds t+1 .. t+d−d_w and free again from t+d−d_w+1
  (the official code's ``scheduler[c] = d + 1``, decremented at each round's end). An upload the
  ``ignore`` policy throws away is still travelling, so both policies count it.
* ``train`` (the default): busy clients are selected and train as any other; a client may then have
  several uploads in flight.
* ``skip``: the cohort is drawn as usual, then its busy members sit the round out: they neither
  train nor upload (the round's cohort, package and traffic are those of the others); if all are
  busy the round trains nobody (evaluation and late arrivals go on). ``rs_busy_skipped`` records
  how many drawn clients sat out, per training round. **``--straggler_busy skip`` with
  ``--straggler_delays each`` is the official Sageflow simulation** (savertm/Sageflow).
* ``unselectable``: busy clients cannot be drawn (:meth:`Stragglers.selectable`, which every
  selection policy honours), so the cohort is filled from the free clients (FLGo-style
  availability).

With ``--straggler_clock`` both are refused (one line): lateness there is in virtual seconds, and a
round in which everyone drawn is busy would take no virtual time, so busy clients would stay busy
for ever; use ``--straggler_busy train`` and ``--straggler_delays uniform`` (the defaults) there.

Everything is a function of the seed (and the trace): the same seed gives the same
arrivals and event order whatever the engine. Uploads of one round are handed over in a fixed order:
oldest start round first, then by client. The uploads still in flight, the global models they
started from and the rounds until which clients are busy are this plug-in's state (checkpointed).

Results: ``rs_staleness`` records, per round, the staleness of every upload aggregated (one row per
round, NaN-padded); its histogram is the summary's and the h5's attribute ``staleness_histogram``
(counts of staleness 0, 1, 2, ... rounds; ``summarize_series``). Rounds are the server's aggregation steps.
"""
from __future__ import annotations

from argparse import ArgumentParser

import math
from typing import Any

import numpy as np
import torch

from flcore.extension import RoundPlugin, refused_by_changing_widths
from flcore.protocol import ClientUpdate, RoundPackage, RoundResult, Runtime
from flcore.registry import register_plugin
from cli.flags import add_flag
from reporting.results import RunHistory
from utils.errors import FLError
from utils.seeding import numpy_rng

POLICIES = ("stale", "ignore")
#: what a client whose upload is in flight does when drawn (module docstring)
BUSY = ("train", "skip", "unselectable")
#: how a round's delays are drawn (module docstring)
DELAY_DRAWS = ("uniform", "each")
#: what a delayed upload keeps of itself while in flight (the rest is rebuilt)
KEPT = ("index", "num_samples", "num_steps", "params", "loss", "extras", "uploads_params", "samples_processed",
        "attacker", "shared_numel")


def delay_of(seed: int, most: int, rnd: int, client: int) -> int:
    """Rounds the upload of ``client`` trained in ``rnd`` is late: uniform in {0..most}."""
    return int(numpy_rng(seed, "straggler-delay", rnd, client).integers(0, most + 1))


def round_delays(seed: int, most: int, rnd: int, trainers: list[int], draw: str = "uniform") -> dict[int, int]:
    """Each trainer's delay in round ``rnd``: :func:`delay_of`, except that with ``draw == "each"``
    the first S + 1 trainers in the seeded order (seed, "straggler-order", rnd) get 0, 1, ..., S."""
    delays = {c: delay_of(seed, most, rnd, c) for c in trainers}
    if draw == "each":
        cohort = sorted(delays)  # the order does not depend on how a caller listed the cohort
        order = numpy_rng(seed, "straggler-order", rnd).permutation(len(cohort))
        for delay, position in enumerate(order[:most + 1]):
            delays[cohort[int(position)]] = delay
    return delays


def awaited(lateness: list[float], indices: list[int], share: float, at_least: int) -> float | None:
    """The lateness up to which the server waits: that of the ⌈share · n⌉-th fastest upload (at least
    ``at_least`` of them; ties by client index), or None when it awaits none."""
    count = min(len(lateness), max(at_least, math.ceil(share * len(lateness) - 1e-9)))
    if count == 0:
        return None
    order = sorted(zip(lateness, indices))
    return order[count - 1][0]


@register_plugin("stragglers")
class Stragglers(RoundPlugin):
    """Holds late uploads back until the round they arrive in (module docstring)."""
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    flag_group = "stragglers (flcore/features/stragglers.py)"
    flag_order = 50
    #: what persists (checkpoints): the uploads in flight, the models they started from, who is busy
    carried = ("pending", "origins", "busy_until")

    @classmethod
    def compatible(cls, server_cls: type) -> str | None:
        return refused_by_changing_widths(server_cls, "the straggler flags")

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--straggler_delay", type=int, default=0, low=0,
                 help="stragglers: each upload arrives U{0..S} rounds late, drawn from the seed (0: none; "
                      "flcore/features/stragglers.py)")
        add_flag(parser, "--straggler_clock", type=bool, default=False,
                 help="stragglers: an upload is late by its client's virtual-clock time (device profiles, "
                      "--client_trace) instead of --straggler_delay's rounds")
        add_flag(parser, "--straggler_wait", type=float, default=0.0, low=0, high=1,
                 help="share of a round's uploads the server waits for, the fastest first (1: wait for all; "
                      "0: rounds: only the on-time ones, clock: the fastest one)")
        add_flag(parser, "--straggler_policy", type=str, default="stale", choices=POLICIES,
                 help="uploads not waited for: aggregated when they arrive (stale) or dropped (ignore)")
        add_flag(parser, "--straggler_busy", type=str, default="train", choices=BUSY,
                 help="a client drawn while its late upload is in flight: trains again (train), sits the round out "
                      "(skip: the official Sageflow code) or cannot be drawn (unselectable); --straggler_delay only")
        add_flag(parser, "--straggler_delays", type=str, default="uniform", choices=DELAY_DRAWS,
                 help="delays: each U{0..S} (uniform) or, as the official Sageflow code, S+1 of the round's trainers "
                      "get 0, 1, ..., S and the others U{0..S} (each)")

    order = 65  # after the attack (60) poisoned the round's uploads, before aggregation

    @classmethod
    def wanted(cls, args) -> bool:
        flags = cls.flags(args)
        return flags.straggler_delay > 0 or flags.straggler_clock

    @classmethod
    def check(cls, args) -> None:
        """Lateness in rounds and by the clock at once, the round-counting flags with the clock's, or
        this feature's flags without lateness (the ranges and choices are declared with the flags)."""
        flags = cls.flags(args)
        if flags.straggler_clock and flags.straggler_delay:
            raise FLError("--straggler_delay (Sageflow's delays in rounds) and --straggler_clock (the clock's device "
                          "times) are two models of lateness; give one of them")
        if not flags.straggler_clock and not flags.straggler_delay:
            cls.refuse_flags_without(args, "--straggler_delay S or --straggler_clock True", "straggler_delay",
                                     "straggler_clock")
        if flags.straggler_clock and (flags.straggler_busy != "train" or flags.straggler_delays != "uniform"):
            raise FLError("--straggler_busy and --straggler_delays count rounds: use them with --straggler_delay S, "
                          "or keep --straggler_busy train and --straggler_delays uniform with --straggler_clock")

    def __init__(self, runtime: Runtime, server_cls: type):
        super().__init__(runtime, server_cls)
        flags = self.flags(runtime.args)
        #: lateness (rounds S, or the clock's) and the share of uploads waited for; what happens to late
        #: uploads, to busy clients drawn again, and how a round's delays are drawn
        self.most, self.by_clock, self.share = flags.straggler_delay, flags.straggler_clock, flags.straggler_wait
        self.policy, self.busy, self.delay_draw = flags.straggler_policy, flags.straggler_busy, flags.straggler_delays
        #: uploads in flight: KEPT fields plus "start" and "due" (a round, or a virtual time with the clock)
        self.pending: list[dict[str, Any]] = []
        #: the global model of every start round an upload in flight began from
        self.origins: dict[int, torch.Tensor] = {}
        #: client -> the last round it is busy in (its latest upload in flight arrives then; rounds only)
        self.busy_until: dict[int, int] = {}

    def is_busy(self, client: int, rnd: int) -> bool:
        """Whether an upload ``client`` trained before round ``rnd`` reaches the server in ``rnd`` or later."""
        return self.busy_until.get(client, -1) >= rnd

    def selectable(self, rnd: int) -> np.ndarray | None:
        if self.busy != "unselectable":
            return None
        return np.asarray([not self.is_busy(c, rnd) for c in range(len(self.runtime.clients))], dtype=bool)

    def after_selection(self, rnd: int, cohort: list[int]) -> list[int]:
        if self.busy != "skip":
            return cohort
        free = [c for c in cohort if not self.is_busy(c, rnd)]
        self.runtime.history.add_series("busy_skipped", len(cohort) - len(free))
        return free

    def after_training(self, package: RoundPackage, trained: list[ClientUpdate], arrived: list[ClientUpdate],
                       result: RoundResult) -> list[ClientUpdate]:
        now = package.round
        clock = self.peers.get("clock")
        fresh, late = self.split(now, package.cohort, arrived, clock, result)
        if not self.by_clock:  # either policy: the late upload travels until its arrival round
            for update, due in late:
                self.busy_until[update.index] = max(int(due), self.busy_until.get(update.index, -1))
            self.busy_until = {c: last for c, last in self.busy_until.items() if last > now}
        if self.policy == "stale":
            for update, due in late:
                self.pending.append({**{name: getattr(update, name) for name in KEPT}, "start": now, "due": due})
                self.origins[now] = package.global_params
        arrived_by = clock.now if self.by_clock else now  # the end of this round, in the lateness' unit
        due = sorted((p for p in self.pending if p["due"] <= arrived_by), key=lambda p: (p["start"], p["index"]))
        self.pending = [p for p in self.pending if p["due"] > arrived_by]
        # (``if name in p``: uploads a checkpoint holds from before a field was kept)
        late_uploads = [ClientUpdate(**{name: p[name] for name in KEPT if name in p}, origin_round=p["start"],
                                     origin_params=self.origins[p["start"]]) for p in due]
        for update in fresh:
            update.origin_round = now
        in_flight = {p["start"] for p in self.pending}
        self.origins = {start: params for start, params in self.origins.items() if start in in_flight}
        released = late_uploads + fresh
        self.runtime.history.add_series("staleness", [now - u.origin_round for u in released])
        return released

    def split(self, now: int, trainers: list[int], arrived: list[ClientUpdate], clock: Any,
              result: RoundResult) -> tuple[list[ClientUpdate], list[tuple[ClientUpdate, float]]]:
        """The uploads on time, and the late ones with when they are due (``trainers``: the round's
        cohort, over which ``--straggler_delays each`` spreads the delays); retimes the clock's round."""
        indices = [u.index for u in arrived]
        if self.by_clock:
            seconds = [clock.upload_time(i) for i in indices]
            deadline = awaited(seconds, indices, self.share, at_least=1)
            if deadline is None:
                return [], []
            if self.share < 1:
                clock.retime_round(deadline, result)
            late = [(u, clock.round_start + s) for u, s in zip(arrived, seconds) if s > deadline]
            return [u for u, s in zip(arrived, seconds) if s <= deadline], late
        drawn = round_delays(self.args.seed, self.most, now, list(trainers), self.delay_draw)
        delays = [drawn[i] for i in indices]
        waited = awaited(delays, indices, self.share, at_least=0) or 0
        if waited and clock is not None:
            clock.retime_round((clock.now - clock.round_start) * (1 + waited), result)
        late = [(u, now + d - waited) for u, d in zip(arrived, delays) if d > waited]
        return [u for u, d in zip(arrived, delays) if d <= waited], late

    @classmethod
    def summarize_series(cls, history: RunHistory, target_acc: float | None) -> dict[str, Any]:
        """``staleness_histogram``: how many aggregated uploads were 0, 1, 2, ... rounds stale."""
        staleness = [int(v) for row in history.extra_series.get("staleness", []) for v in row if v == v]  # NaN: padding
        return {"staleness_histogram": np.bincount(staleness).tolist()} if staleness else {}

    def lines(self, results: dict[str, Any]) -> list[str]:
        if "staleness_histogram" not in results:
            return []
        return [f"  staleness histogram (uploads received 0, 1, ... rounds late): {results['staleness_histogram']}"]

    def summary(self) -> dict[str, object]:
        return {"straggler_delay": self.most, "straggler_clock": self.by_clock, "straggler_policy": self.policy,
                "straggler_wait": self.share, "straggler_busy": self.busy, "straggler_delays": self.delay_draw}
