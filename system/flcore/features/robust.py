"""Robust aggregation: pre-aggregation steps, then one aggregator, on the round's update vectors.

``--robust NAME[,NAME]`` names the pre-steps then the aggregator (``--robust clip,multi_krum``;
``--robust clip`` alone averages after clipping; ``+`` separates names too, ``clip+multi_krum``, so
that a ``sweep.py`` axis, which splits values at commas, can hold a composition). The plug-in takes over aggregation: every upload
becomes its update ``x_i = params_i − global`` (the private part of a partly shared model is zero
there), the steps and the aggregator combine them, and the new global model is ``global + x``.
Sample weights ``w_i = n_i / Σ n`` are FedAvg's. ``f`` is the number of attackers a defence assumes
among n uploads: ``--robust_f``, or by default ``round(--attack_fraction × cohort size)``.

Pre-step:

* ``clip`` (norm bounding, Sun et al. 2019): ``x_i ← x_i · min(1, τ/‖x_i‖)``, τ = ``--robust_clip``;
  0 (the default) takes the median of the round's update norms.

Aggregators:

* ``mean``: Σ w_i x_i; without a pre-step it is FedAvg's weighted mean of the uploaded models,
  computed as FedAvg computes it (bit for bit).
* ``krum`` (Blanchard et al., NeurIPS 2017): the update with the least score, the sum of squared
  distances to its n − f − 2 nearest others (ties: the earliest upload). Needs n > 2f + 2.
* ``multi_krum``: the m = ``--robust_keep`` (0: n − f) updates of least score, averaged with their
  sample weights renormalised (with m = n, FedAvg's mean). Needs n > 2f + 2.
* ``median``: the coordinate-wise median (the mean of the two middle values for even n).
* ``trimmed_mean`` (Yin et al., ICML 2018): per coordinate, the f largest and f smallest values are
  dropped and the rest averaged. Needs n > 2f.
* ``rfa`` (Pillutla et al., 2022): the weighted geometric median argmin_z Σ w_i ‖z − x_i‖ by smoothed
  Weiszfeld, ``z ← Σ β_i x_i / Σ β_i`` with ``β_i = w_i / max(ν, ‖z − x_i‖)``, ν = 1e-6, from the
  weighted mean, at most ``--robust_iters`` iterations (10, the Sageflow paper's baseline), stopping
  early once the objective improves by less than a relative 1e-6.
* ``bulyan`` (El Mhamdi et al., ICML 2018): θ = n − 2f updates chosen one by one by Krum (with f)
  among those not yet chosen; then per coordinate the β = θ − 2f chosen values closest to their
  median are averaged. Needs n ≥ 4f + 3.
* ``centered_clip`` (Karimireddy et al., ICML 2021): from the previous round's aggregate v (zero at
  first; kept in the checkpoint), ``--robust_iters`` times ``v ← v + Σ w_i (x_i − v) min(1, τ/‖x_i − v‖)``;
  τ = ``--robust_clip``, or the median distance to the starting v (the paper weighs uniformly, we
  use the sample weights so that a large τ gives FedAvg's mean).
* ``fltrust`` (Cao et al., NDSS 2021): the server trains the round's global model on its root data
  (``--public_data``, fldata/public.py) as a client would (``-ls`` epochs of minibatch SGD with
  ``-lbs`` and ``-lr``, batches shuffled from (seed, "fltrust", round), a trailing partial batch
  dropped under ``--drop_last`` unless it is the only one), which gives the root update g₀
  (restricted to the shared part). Each upload gets the trust score ``TS_i = ReLU(cos(x_i, g₀))``
  and is rescaled to g₀'s norm, ``x̂_i = x_i · ‖g₀‖/‖x_i‖``; the aggregate is
  ``Σ TS_i x̂_i / Σ TS_i`` (zero when every score is 0). The paper's global learning rate is 1 (the
  aggregate is an update of the model, not a gradient). Sample weights play no part, as in the paper.

The requirement on n is checked at start-up against the cohort size ``floor(nc × jr)``; a round
with fewer uploads (drop-outs, ``-tth``) uses the largest f its uploads admit, with a warning.

Filtering defences (krum, multi_krum, bulyan; fltrust, which leaves out the uploads of trust 0)
record, when ``--attack`` is on, the precision and recall of the attackers among the uploads they
leave out (``rs_robust_precision``, ``rs_robust_recall``; NaN when nothing was left out, or no
attacker uploaded), against the ground truth the attack plug-in stamps on the uploads
(``ClientUpdate.attacker``; :func:`flcore.protocol.filter_precision_recall`).

Aggregators register by name (:func:`aggregator`, into :data:`AGGREGATORS`), each with what it needs
of n and whether it filters.

The plug-in refuses algorithms that aggregate their own way (their server overrides ``aggregate``),
and, taking over aggregation, DP-FedAvg (``--dp_update_clip``): one line each.
"""
from __future__ import annotations

from argparse import ArgumentParser

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from flcore.extension import RoundPlugin, refused_by_changing_widths
from flcore.features.attacks import AttackPlugin
from flcore.protocol import (ClientUpdate, RoundPackage, RoundResult, Runtime, cohort_size, filter_precision_recall,
                             sample_weights)
from flcore.registry import register_plugin
from cli.flags import add_flag
from utils.errors import FLError
from fldata.public import PublicData, require_public_data
from utils.seeding import torch_generator

log = logging.getLogger("fl")

#: Weiszfeld's smoothing: distances below it count as ν (no division by zero at a data point)
WEISZFELD_NU = 1e-6
WEISZFELD_TOL = 1e-6


# ----------------------------------------------------------------------------- the vector rules
def clip_norms(points: torch.Tensor, tau: float) -> torch.Tensor:
    norms = points.norm(dim=1, keepdim=True)
    return points * torch.clamp(tau / torch.clamp(norms, min=1e-12), max=1.0)


def squared_distances(points: torch.Tensor) -> torch.Tensor:
    """‖x_i − x_j‖² for every pair, in float64 (a Gram matrix: no n × n × d tensor)."""
    x = points.double()
    norms = (x * x).sum(1)
    gram = x @ x.T
    return torch.clamp(norms[:, None] + norms[None, :] - 2 * gram, min=0.0).fill_diagonal_(0.0)


def krum_scores(points: torch.Tensor, f: int) -> torch.Tensor:
    """Each point's sum of squared distances to its n − f − 2 nearest other points."""
    n = points.shape[0]
    neighbours = max(0, n - f - 2)
    dist = squared_distances(points)
    others = dist.masked_fill(torch.eye(n, dtype=torch.bool, device=dist.device), float("inf"))
    return others.sort(dim=1).values[:, :neighbours].sum(1)


def krum_order(points: torch.Tensor, f: int) -> list[int]:
    """Indices by increasing Krum score (a stable sort: ties keep upload order)."""
    return torch.sort(krum_scores(points, f), stable=True).indices.tolist()


def weighted_mean(points: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    w = weights.to(points.dtype)
    return (w[:, None] * points).sum(0) / w.sum()


def coordinate_median(points: torch.Tensor) -> torch.Tensor:
    ordered = points.sort(dim=0).values
    n = points.shape[0]
    return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


def trimmed_mean(points: torch.Tensor, trim: int) -> torch.Tensor:
    ordered = points.sort(dim=0).values
    return ordered[trim: points.shape[0] - trim].mean(0)


def geometric_median(points: torch.Tensor, weights: torch.Tensor, iters: int) -> torch.Tensor:
    """Smoothed Weiszfeld (module docstring), in float64."""
    x = points.double()
    w = weights.double()
    z = (w[:, None] * x).sum(0) / w.sum()

    def objective(z: torch.Tensor) -> float:
        return float((w * (x - z).norm(dim=1)).sum())
    value = objective(z)
    for _ in range(iters):
        beta = w / torch.clamp((x - z).norm(dim=1), min=WEISZFELD_NU)
        z = (beta[:, None] * x).sum(0) / beta.sum()
        previous, value = value, objective(z)
        if previous - value <= WEISZFELD_TOL * max(value, 1e-30):
            break
    return z.to(points.dtype)


def bulyan_selection(points: torch.Tensor, f: int) -> list[int]:
    """θ = n − 2f indices, each the Krum choice among those not yet chosen."""
    remaining = list(range(points.shape[0]))
    chosen = []
    for _ in range(points.shape[0] - 2 * f):
        best = remaining[krum_order(points[remaining], f)[0]]
        chosen.append(best)
        remaining.remove(best)
    return chosen


def bulyan(points: torch.Tensor, f: int) -> tuple[torch.Tensor, list[int]]:
    chosen = bulyan_selection(points, f)
    selected = points[chosen]
    beta = len(chosen) - 2 * f
    closest = (selected - coordinate_median(selected)).abs().sort(dim=0, stable=True).indices[:beta]
    return selected.gather(0, closest).mean(0), chosen


def centered_clip(points: torch.Tensor, weights: torch.Tensor, center: torch.Tensor, tau: float,
                  iters: int) -> torch.Tensor:
    w = (weights / weights.sum()).to(points.dtype)
    v = center.to(points.dtype)
    for _ in range(iters):
        offsets = points - v
        scale = torch.clamp(tau / torch.clamp(offsets.norm(dim=1), min=1e-12), max=1.0)
        v = v + ((w * scale)[:, None] * offsets).sum(0)
    return v


def fltrust(points: torch.Tensor, root: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FLTrust's aggregate of the update rows ``points`` given the root update, and the trust scores."""
    x, g0 = points.double(), root.double()
    norms = x.norm(dim=1)
    root_norm = g0.norm()
    trust = torch.relu((x @ g0) / torch.clamp(norms * root_norm, min=1e-30))
    total = trust.sum()
    if float(total) <= 0:
        return torch.zeros_like(points[0]), trust
    rescaled = x * (root_norm / torch.clamp(norms, min=1e-30))[:, None]
    return ((trust[:, None] * rescaled).sum(0) / total).to(points.dtype), trust


def root_update(runtime: Runtime, public: PublicData, start: torch.Tensor, rnd: int) -> torch.Tensor:
    """The server's update g₀ on its root data from ``start`` (module docstring), on the working model."""
    args, model = runtime.args, runtime.model
    x_all, y_all = public.inputs().to(model.device), public.y.to(model.device)
    size, batch, lr = len(y_all), int(args.batch_size), float(args.local_learning_rate)
    generator = torch_generator(args.seed, "fltrust", rnd)
    model.load(start)
    model.module.train()
    for _ in range(int(args.local_epochs)):
        order = torch.randperm(size, generator=generator).to(model.device)
        stops = range(batch, size + 1, batch) if args.drop_last and size >= batch else range(batch, size + batch, batch)
        for stop in stops:
            idx = order[stop - batch: min(stop, size)]
            model.zero_grad()
            runtime.objective.loss(model.module(x_all[idx]), y_all[idx]).backward()  # the clients' loss
            with torch.no_grad():
                model.params.sub_(model.grad, alpha=lr)
    update = model.snapshot() - start
    return update if runtime.shared is None else torch.where(runtime.shared, update, torch.zeros_like(update))


# ----------------------------------------------------------------------------- the registry of rules
#: an aggregator's combination of the round's update rows: (the defence, the rows, their sample
#: weights, f, the round's package) -> (the aggregate update, the rows it kept: None unless it filters)
Combine = Callable[["RobustAggregation", torch.Tensor, torch.Tensor, int, RoundPackage],
                   tuple[torch.Tensor, "list[int] | None"]]


@dataclass(frozen=True)
class Rule:
    """An aggregator: how it combines, the least number of uploads it needs for f attackers, and
    whether it filters."""

    combine: Combine
    least_uploads: Callable[[int], int]
    requirement: str
    filters: bool = False


#: the aggregators by ``--robust`` name, in the order they are listed to the user
AGGREGATORS: dict[str, Rule] = {}


def aggregator(name: str, least_uploads: Callable[[int], int] = lambda f: 1, requirement: str = "",
               filters: bool = False) -> Callable[[Combine], Combine]:
    """Register an aggregator as ``--robust name``."""

    def register(combine: Combine) -> Combine:
        if name in AGGREGATORS:
            raise RuntimeError(f"robust aggregator {name!r} is registered twice")
        AGGREGATORS[name] = Rule(combine, least_uploads, requirement, filters)
        return combine

    return register


@aggregator("mean")
def _mean(defence, points, weights, f, package):
    return weighted_mean(points, weights), None


@aggregator("median")
def _median(defence, points, weights, f, package):
    return coordinate_median(points), None


@aggregator("rfa")
def _rfa(defence, points, weights, f, package):
    return geometric_median(points, weights, int(defence.args.robust_iters)), None


@aggregator("centered_clip")
def _centered_clip(defence, points, weights, f, package):
    center = torch.zeros_like(points[0]) if defence.center is None else defence.center.to(points.device)
    tau = float(defence.args.robust_clip) or float((points - center).norm(dim=1).median())
    defence.center = centered_clip(points, weights, center, tau, int(defence.args.robust_iters))
    return defence.center, None


@aggregator("trimmed_mean", lambda f: 2 * f + 1, "n > 2f")
def _trimmed_mean(defence, points, weights, f, package):
    return trimmed_mean(points, f), None


def krum_kept(points: torch.Tensor, weights: torch.Tensor, f: int, keep: int) -> tuple[torch.Tensor, list[int]]:
    """The ``keep`` rows of least Krum score, averaged with their weights (Krum: exactly the chosen row)."""
    kept = sorted(krum_order(points, f)[: min(keep, points.shape[0])])
    if len(kept) == 1:
        return points[kept[0]], kept
    return weighted_mean(points[kept], weights[kept]), kept


@aggregator("krum", lambda f: 2 * f + 3, "n > 2f + 2", filters=True)
def _krum(defence, points, weights, f, package):
    return krum_kept(points, weights, f, 1)


@aggregator("multi_krum", lambda f: 2 * f + 3, "n > 2f + 2", filters=True)
def _multi_krum(defence, points, weights, f, package):
    return krum_kept(points, weights, f, int(defence.args.robust_keep) or points.shape[0] - f)


@aggregator("bulyan", lambda f: 4 * f + 3, "n >= 4f + 3", filters=True)
def _bulyan(defence, points, weights, f, package):
    return bulyan(points, f)


@aggregator("fltrust", filters=True)
def _fltrust(defence, points, weights, f, package):
    root = root_update(defence.runtime, defence.root, package.global_params, package.round)
    delta, trust = fltrust(points, root.to(points.dtype))
    return delta, torch.nonzero(trust > 0).flatten().tolist()


PRE_STEPS = ("clip",)


def parse_robust(text: str) -> tuple[list[str], str]:
    """``"clip,multi_krum"`` as (pre-steps, aggregator); one line on a bad list."""
    names = [name.strip() for name in str(text).replace("+", ",").split(",") if name.strip()]
    known = f"pre-steps: {', '.join(PRE_STEPS)}; aggregators: {', '.join(AGGREGATORS)}"
    for name in names:
        if name not in PRE_STEPS and name not in AGGREGATORS:
            raise FLError(f"--robust {text}: unknown defence {name!r} ({known})")
    if not names:
        raise FLError(f"--robust {text!r} names no defence ({known})")
    aggregator = names[-1] if names[-1] in AGGREGATORS else "mean"
    pre = names[:-1] if names[-1] in AGGREGATORS else names
    misplaced = [name for name in pre if name not in PRE_STEPS]
    if misplaced:
        raise FLError(f"--robust {text}: {misplaced[0]} is an aggregator; name the pre-steps first and one aggregator last")
    return pre, aggregator


def fedavg_mean(updates: list[ClientUpdate], weights: np.ndarray) -> torch.Tensor:
    """Σ w_k · params_k accumulated in update order, as the base server's FedAvg mean."""
    total = torch.zeros_like(updates[0].params)
    for update, weight in zip(updates, weights):
        total.add_(update.params, alpha=float(weight))
    return total


@register_plugin("robust")
class RobustAggregation(RoundPlugin):
    """The run's pre-aggregation steps and aggregator (module docstring)."""
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    flag_group = "robust aggregation (flcore/features/robust.py)"
    flag_order = 40
    #: what persists (checkpoints): centered clipping's last center
    carried = ("center",)

    @classmethod
    def compatible(cls, server_cls: type) -> str | None:
        return refused_by_changing_widths(server_cls, "--robust")

    @classmethod
    def check(cls, args) -> None:
        """Defences named in any case; their flags without ``--robust``, or an empty list: one line."""
        if isinstance(args.robust, str):
            args.robust = args.robust.strip().lower()
            if not args.robust:
                raise FLError("--robust '' names no defence; drop --robust for FedAvg's aggregation")
            parse_robust(args.robust)  # an unknown or misplaced name: one line before any data is read
        else:
            cls.refuse_flags_without(args, "--robust", "robust")

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--robust", type=str, default=None,
                 help="pre-steps then an aggregator, comma-separated: clip; mean, krum, multi_krum, median, "
                      "trimmed_mean, rfa, bulyan, centered_clip, fltrust (needs --public_data) (e.g. clip,multi_krum "
                      "or clip+multi_krum)")
        add_flag(parser, "--robust_f", type=int, default=-1, low=-1,
                 help="attackers a defence assumes per round (-1: round(--attack_fraction x cohort size))")
        add_flag(parser, "--robust_clip", type=float, default=0.0, low=0,
                 help="clip / centered_clip radius tau (0: the median update norm of the round)")
        add_flag(parser, "--robust_keep", type=int, default=0, low=0, help="multi_krum: updates averaged (0: n - f)")
        add_flag(parser, "--robust_iters", type=int, default=10, low=1,
                 help="rfa: most Weiszfeld iterations; centered_clip: clipping iterations")

    order = 70

    @classmethod
    def wanted(cls, args) -> bool:
        return bool(cls.flags(args).robust)

    @classmethod
    def public_data_user(cls, args) -> str | None:
        return "--robust fltrust" if parse_robust(args.robust)[1] == "fltrust" else None

    def __init__(self, runtime: Runtime, server_cls: type):
        super().__init__(runtime, server_cls)
        args = runtime.args
        self.pre, self.aggregator = parse_robust(args.robust)
        if "aggregate" in server_cls.capabilities.overrides:
            raise FLError(f"--robust replaces FedAvg's aggregation, but {args.algorithm} aggregates its own way; "
                          f"use it with an algorithm that averages the uploads (FedAvg, FedProx, FedPer, ...)")
        self.takes_aggregation = True
        num_clients = len(runtime.clients)
        cohort = cohort_size(num_clients, float(args.join_ratio))
        self.f = int(args.robust_f) if int(args.robust_f) >= 0 else AttackPlugin.attackers_among(args, cohort)
        rule = AGGREGATORS[self.aggregator]
        if cohort < rule.least_uploads(self.f):
            raise FLError(f"--robust {self.aggregator} needs {rule.requirement} uploads for f = {self.f} attackers, "
                          f"but a round has n = {cohort} (-jr {args.join_ratio} of {num_clients} clients); "
                          f"select more clients or lower --robust_f")
        #: FLTrust's root data: the server's public set
        needs_public = self.public_data_user(args)
        self.root = require_public_data(runtime.dataset, needs_public) if needs_public else None
        #: centered clipping's starting point: the previous round's aggregate update (checkpointed)
        self.center: torch.Tensor | None = None
        #: the uploads the last filtering round kept and left out, as (client, round it trained in)
        self._filtered: tuple[list[tuple[int, int]], list[tuple[int, int]]] | None = None
        #: (precision, recall) of this round's filter against the uploads' attacker stamps
        self._filter_scores: tuple[float, float] | None = None
        self._warned = False

    # ------------------------------------------------------------------ aggregation
    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> torch.Tensor:
        weights = sample_weights([u.num_samples for u in updates])
        self._filtered = self._filter_scores = None
        if not self.pre and self.aggregator == "mean":
            return fedavg_mean(updates, weights)
        start = package.global_params
        points = torch.stack([u.params - start for u in updates])
        w = torch.as_tensor(weights, device=points.device)
        if "clip" in self.pre:
            tau = float(self.args.robust_clip) or float(points.norm(dim=1).median())
            points = clip_norms(points, tau)
        f = self.admissible_f(len(updates), package.round)
        delta, kept = AGGREGATORS[self.aggregator].combine(self, points, w, f, package)
        if kept is not None:
            kept_set = set(kept)
            left_out = [u for i, u in enumerate(updates) if i not in kept_set]
            kept_updates = [updates[i] for i in kept]
            self._filtered = ([(u.index, u.origin(package)[0]) for u in kept_updates],
                              [(u.index, u.origin(package)[0]) for u in left_out])
            if "attack" in self.peers:  # each upload's stamp is of the round it trained in
                self._filter_scores = filter_precision_recall(kept_updates, left_out)
        return start + delta.to(start.dtype)

    def admissible_f(self, n: int, rnd: int) -> int:
        """``f``, or the largest f that ``n`` uploads admit (with a warning, once per run)."""
        rule = AGGREGATORS[self.aggregator]
        f = self.f
        while f > 0 and n < rule.least_uploads(f):
            f -= 1
        if n < rule.least_uploads(f):
            raise FLError(f"round {rnd}: --robust {self.aggregator} needs {rule.requirement} uploads, and only "
                          f"{n} arrived; lower -cdr or -tth's drops, or select more clients")
        if f != self.f and not self._warned:
            log.warning("warning: round %d has %d uploads, too few for --robust %s with f = %d (%s): f = %d for such "
                        "rounds", rnd, n, self.aggregator, self.f, rule.requirement, f)
            self._warned = True
        return f

    # ------------------------------------------------------------------ reports
    def after_round(self, rnd: int, package: RoundPackage, updates: list[ClientUpdate], result: RoundResult) -> None:
        if not AGGREGATORS[self.aggregator].filters or "attack" not in self.peers:
            return
        precision, recall = self._filter_scores or (float("nan"), float("nan"))
        self._filter_scores = None  # a round without uploads filters nothing
        self.runtime.history.add_series("robust_precision", precision)
        self.runtime.history.add_series("robust_recall", recall)

    def summary(self) -> dict[str, object]:
        return {"robust": [*self.pre, self.aggregator], "robust_f": self.f}
