"""Byzantine clients: model poisoning of the uploads and data poisoning of local training.

``--attack NAME --attack_fraction f`` makes ``round(f · N)`` of the N training clients attackers
(half rounds up), drawn from ``(seed, "attackers")`` once for the run, or from
``(seed, "attackers", round)`` every round with ``--attack_resample`` (:func:`attacker_mask`). With
``--attack_scope cohort`` the attackers are instead ``round(f · n)`` of the n clients that train in
each round, drawn every round from ``(seed, "cohort-attackers", round)`` (:func:`cohort_attacker_mask`):
a fixed share of every cohort, as the official Sageflow code draws them (``int(m × ratio)`` of the
round's m sampled clients; equal for its 20 × 0.2). Among 20 of 100 clients with f = 0.2 the
``clients`` scope puts 0 to 8 attackers in a cohort (4 on average), the ``cohort`` scope always 4.
``--attack_scope drawn`` draws them the same way from the m clients *drawn* for the round, before
``--straggler_busy skip`` lets the busy ones sit out, which is the official code's order: its
attackers are chosen among the sampled clients, then clients still in flight are skipped, so
fewer than round(f · m) may train (and attack) in a round. Without busy clients sitting out the
drawn clients are the training cohort and ``drawn`` equals ``cohort`` bit for bit.
Attackers train as the algorithm says (on poisoned data for a data attack); what they upload is
then replaced. Every attack works on the update ``u = params − global`` of the round's package,
restricted to the shared part of the model (the private part never leaves a client).

Model poisoning (this plug-in's ``after_training``, on the uploads that reach the server):

* ``sign_flip``: ``u ← −s·u`` with ``s = --attack_scale`` (default 10), applied to the update
  relative to the round's global model (``--attack_flip update``, the default: the paper's "sign
  flipping" of what a client sends). The official Sageflow code (savertm/Sageflow) flips the whole
  weights instead, ``w ← −s·w``, s ∈ {0.1, 10}: ``--attack_flip weights`` (a far larger move, since
  it also flips the part every client shares; for a side-by-side with that code).
* ``gaussian``: ``u ← N(0, σ² I)``, σ = ``--attack_noise_std``, drawn from
  ``(seed, "attack-noise", round, client)``.
* ``alie`` (Baruch et al., NeurIPS 2019, "A Little Is Enough"): every attacker sends
  ``μ − z·σ`` with μ, σ the coordinate-wise mean and (population) standard deviation of the
  benign uploads of the round, and ``z = Φ⁻¹((n − s)/n)``, ``s = ⌊n/2 + 1⌋ − m`` for n uploads of
  which m are attackers' (the paper's z_max); ``--attack_z`` > 0 sets z instead.
* ``ipm`` (Xie et al., UAI 2020, inner-product manipulation): every attacker sends ``−ε·μ``,
  ε = ``--attack_epsilon``.
* ``minmax`` (Shejwalkar & Houmansadr, NDSS 2021): every attacker sends ``μ + γ·p`` with the
  largest γ ≥ 0 whose greatest distance to a benign upload stays within the greatest distance
  between two benign uploads; p = ``--attack_direction``: ``std`` (−σ, the paper's best),
  ``unit`` (−μ/‖μ‖) or ``sign`` (−sign μ). Each constraint is a quadratic in γ, so γ is solved
  exactly (the paper searches it by halving steps).

The colluding attacks (alie, ipm, minmax) know the benign uploads of the round (the omniscient
setting of Blades and ByzFL); in a round where every upload is an attacker's they use the
attackers' own honestly trained updates instead.

Data poisoning changes what an attacker trains on, through the clients' local-step strategy
(:class:`PoisonedData`, ``flcore/clients/localstep.py``): every algorithm that trains by the base
sequence computes its steps there, so no client class has a branch for it.

* ``label_flip``: an attacker's labels y become ``C − 1 − y``, or those of
  ``--attack_label_map "a:b,c:d"`` (classes not named keep their label).
* ``backdoor`` (BadNets-style, with Sageflow's settings): in each of an attacker's minibatches the
  first ``int(B × --backdoor_fraction)`` samples (20 of 64 by default) get the trigger and the label
  ``--backdoor_target`` (2); from round ``--backdoor_from_round`` (10) on, the attacker's update is
  also scaled by ``--backdoor_scale`` (10) before upload. The trigger is Sageflow's 12 pixels in the
  top-left corner (:data:`TRIGGER_PIXELS`, every channel), set to ``--backdoor_value`` in the
  model's input space (1.0: white for the [-1, 1] normalisation of PFLlib's image datasets;
  Sageflow sets 1 after its own normalisation). ``rs_backdoor_asr``, one entry per evaluation
  (aligned with ``rs_test_acc``): the share of the test images of the other classes, trigger
  stamped, that the global model puts in the target class.
* ``dba`` (Xie et al., ICLR 2020, distributed backdoor): the global trigger is split into local
  patterns, and each attacker poisons its batches (as ``backdoor`` does: share, target, value, the
  ×``--backdoor_scale`` boost from ``--backdoor_from_round``) with its own local pattern only. The
  patterns are the paper's MNIST setting as we read it (:data:`DBA_PARTS`): four 1×4 bars, rows 0
  and 3, columns 0-3 and 6-9. The k-th attacker of a round (by client index) stamps pattern
  k mod 4. ``rs_backdoor_asr`` is measured with the *global* trigger (all four bars), as the paper's
  attack success rate.
* ``model_replacement`` (Bagdasaryan et al., AISTATS 2020, "How to backdoor federated learning"):
  the attacker trains as ``backdoor`` does (Sageflow's trigger) and, from ``--backdoor_from_round``
  on, uploads ``Γ(X − G) + G`` (X its trained model, G the round's global model) so that its model
  replaces the global one under averaging. Γ = ``--replacement_scale``, or by default
  ``Σ n_k / Σ n_a`` over the uploads that reach the server (all k, attackers a): the paper's n/η
  (η = 1, equal sizes, one attacker), generalised to FedAvg's sample weights and several attackers,
  so that with benign updates near zero the new global model is the attackers' mean model.

Every trigger is written into the model's input space as :func:`stamp_trigger` does it, i.e. the
image the attacker feeds after decoding (for PFLlib's [-1, 1] images, value 1.0 is a white pixel
in raw pixel space): the same for the three backdoors.

Being a local-step strategy that transforms the minibatch (``flcore/clients/localstep.py``), data
poisoning composes with DP-SGD: with ``-dp`` an attacker's poisoned minibatches are clipped and
noised per sample like everyone's. It excludes algorithms whose clients train their own way (they
override ``train_job`` or the gradient).

Results: ``rs_attack_uploads`` (how many of the uploads that reached the server in each round are
attackers'; with ``--straggler_delay`` counted in the round they were trained) and ``rs_attackers``
(their client indices, one row per round, NaN-padded). Every upload that reaches the server is
stamped with the ground truth, ``ClientUpdate.attacker`` (True for an attacker's, False otherwise,
in the round it was trained in; a late upload keeps its stamp): what a filtering defence's
precision and recall are measured against (Sageflow, ``--robust``), never what a defence may read.
"""
from __future__ import annotations

import logging

from argparse import ArgumentParser

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import numpy as np
import torch

from flcore.capabilities import LOCAL_PROCEDURE
from flcore.extension import LocalStep
from flcore.evaluation import Evaluator
from flcore.extension import RoundPlugin, refused_by_changing_widths
from flcore.protocol import ClientUpdate, RoundPackage, RoundResult, Runtime, cohort_size
from flcore.registry import register_local_step, register_plugin
from cli.flags import add_flag
from utils.errors import FLError
from utils.seeding import numpy_rng, torch_generator

log = logging.getLogger("fl")

if TYPE_CHECKING:
    from flcore.clients.clientbase import Client


# ----------------------------------------------------------------------------- who attacks
def attacker_count(fraction: float, num_clients: int) -> int:
    """round(f · N), halves rounding up."""
    return int(math.floor(fraction * num_clients + 0.5))


def check_attacker_count(fraction: float, population: int, scope: str) -> None:
    """round(f · n) attackers among the ``population`` the scope draws from must leave a benign
    client (else one line with the fractions that do); a positive share that rounds to no attacker
    is said in a warning."""
    where = "clients" if scope == "clients" else f"clients of a round's {scope} ({population})"
    count = attacker_count(fraction, population)
    if count >= population:
        largest = (population - 0.5) / population  # round(f · n) = n - 1 for f below it
        raise FLError(f"--attack_fraction {fraction:g} makes all {population} {where} attackers, which leaves no benign "
                      f"client; pass --attack_fraction below {largest:.4g}")
    if count == 0:
        smallest = 0.5 / population  # round(f · n) = 1 from here
        log.warning("warning: --attack_fraction %g makes round(%g x %d) = 0 of the %s attackers: this run is clean; "
                    "pass --attack_fraction %.4g or more for one", fraction, fraction, population, where, smallest)


@functools.lru_cache(maxsize=64)
def attacker_mask(seed: int, fraction: float, resample: bool, num_clients: int, rnd: int) -> np.ndarray:
    """Which client positions attack in round ``rnd`` (a read-only boolean mask): drawn once from
    (seed, "attackers"), or per round from (seed, "attackers", rnd) when ``resample``."""
    keys = (rnd,) if resample else ()
    chosen = numpy_rng(seed, "attackers", *keys).choice(num_clients, size=attacker_count(fraction, num_clients),
                                                         replace=False)
    mask = np.zeros(num_clients, dtype=bool)
    mask[chosen] = True
    mask.setflags(write=False)
    return mask


@functools.lru_cache(maxsize=64)
def cohort_attacker_mask(seed: int, fraction: float, num_clients: int, rnd: int, cohort: tuple[int, ...]) -> np.ndarray:
    """``--attack_scope cohort|drawn``: round(f · n) of the n clients ``cohort`` (in increasing order) of
    round ``rnd`` (those that train, or those drawn), drawn from (seed, "cohort-attackers", rnd); a
    read-only mask over every client position."""
    chosen = numpy_rng(seed, "cohort-attackers", rnd).choice(len(cohort), size=attacker_count(fraction, len(cohort)),
                                                              replace=False)
    mask = np.zeros(num_clients, dtype=bool)
    mask[np.asarray(cohort, dtype=np.int64)[chosen]] = True
    mask.setflags(write=False)
    return mask


#: --attack_scope values that draw the attackers of each round from its clients (which ones: :func:`scope_cohort`)
PER_COHORT = ("cohort", "drawn")


def attackers_of(args: Any, rnd: int, cohort: list[int] | None = None) -> np.ndarray:
    """The attacker mask of round ``rnd`` over every client position (``args.num_clients`` of them):
    the run's, or with ``--attack_scope cohort|drawn`` drawn from ``cohort``, that round's clients of
    the scope (:func:`scope_cohort` of its package). Of a past round, ask the plug-in
    (:meth:`AttackPlugin.attackers`)."""
    if args.attack_scope in PER_COHORT:
        if cohort is None:
            raise ValueError(f"--attack_scope {args.attack_scope} draws the attackers from the round's clients: pass them")
        return cohort_attacker_mask(int(args.seed), float(args.attack_fraction), int(args.num_clients), int(rnd),
                                    tuple(sorted(cohort)))
    return attacker_mask(int(args.seed), float(args.attack_fraction), bool(args.attack_resample),
                         int(args.num_clients), 0 if not args.attack_resample else int(rnd))


def scope_cohort(args: Any, package: RoundPackage) -> list[int]:
    """The clients of ``package``'s round that ``--attack_scope`` draws attackers from: those drawn for
    the round (``drawn``) or those that train in it (otherwise)."""
    return package.drawn_cohort if args.attack_scope == "drawn" else package.cohort


def package_attackers(args: Any, package: RoundPackage) -> np.ndarray:
    """The attacker mask of ``package``'s round (:func:`attackers_of`)."""
    return attackers_of(args, package.round, scope_cohort(args, package))


# ----------------------------------------------------------------------------- model poisoning
def sign_flip(update: torch.Tensor, scale: float) -> torch.Tensor:
    return update * -scale


def alie_z(uploads: int, attackers: int) -> float:
    """Baruch et al.'s z_max for n uploads of which m are attackers'."""
    supporters = math.floor(uploads / 2 + 1) - attackers
    share = min(max((uploads - supporters) / uploads, 1e-6), 1 - 1e-6)
    return NormalDist().inv_cdf(share)


def alie(benign: torch.Tensor, z: float) -> torch.Tensor:
    """μ − z·σ of the benign updates (rows), coordinate by coordinate."""
    return benign.mean(0) - z * benign.std(0, correction=0)


def ipm(benign: torch.Tensor, epsilon: float) -> torch.Tensor:
    return benign.mean(0) * -epsilon


MINMAX_DIRECTIONS = ("std", "unit", "sign")


def minmax(benign: torch.Tensor, direction: str) -> torch.Tensor:
    """μ + γ·p with the largest γ ≥ 0 such that max_i ‖μ + γp − b_i‖ ≤ max_ij ‖b_i − b_j‖.

    For each i, ‖(μ − b_i) + γp‖² = T² is a quadratic aγ² + bγ + c = 0 with c ≤ 0 (μ lies in the
    benign updates' hull, so ‖μ − b_i‖ ≤ T): its larger root bounds γ, and γ is the smallest bound."""
    points = benign.double()
    mean = points.mean(0)
    if direction == "std":
        push = -points.std(0, correction=0)
    elif direction == "unit":
        norm = mean.norm()
        push = -mean / norm if norm > 0 else torch.zeros_like(mean)
    else:
        push = -mean.sign()
    limit_sq = float(torch.cdist(points, points).max()) ** 2
    a = float(push @ push)
    if a == 0.0:
        return mean.to(benign.dtype)
    offsets = mean - points
    b = 2 * (offsets @ push)
    c = (offsets * offsets).sum(1) - limit_sq
    roots = (-b + torch.sqrt(torch.clamp(b * b - 4 * a * c, min=0.0))) / (2 * a)
    gamma = max(0.0, float(roots.min()))
    return (mean + gamma * push).to(benign.dtype)


#: model attacks by ``--attack`` name: what the attackers of a round upload instead, as updates
#: relative to the round's global model (one per attacker's upload, in their order), from the
#: run's flags, the round's package, the attackers' uploads and the others'
ModelAttack = Callable[[Any, RoundPackage, list[ClientUpdate], list[ClientUpdate]], list[torch.Tensor]]
MODEL_ATTACKS: dict[str, ModelAttack] = {}


def model_attack(name: str) -> Callable[[ModelAttack], ModelAttack]:
    """Register a model attack as ``--attack name``."""

    def register(attack: ModelAttack) -> ModelAttack:
        if name in MODEL_ATTACKS:
            raise RuntimeError(f"model attack {name!r} is registered twice")
        MODEL_ATTACKS[name] = attack
        return attack

    return register


def benign_updates(package: RoundPackage, bad: list[ClientUpdate], good: list[ClientUpdate]) -> torch.Tensor:
    """The benign updates of the round (rows) that the colluding attacks know; the attackers' own
    honestly trained ones in a round where every upload is an attacker's."""
    return torch.stack([u.params - package.global_params for u in (good or bad)])


@model_attack("sign_flip")
def sign_flip_uploads(args: Any, package: RoundPackage, bad: list[ClientUpdate], good: list[ClientUpdate]):
    start, scale = package.global_params, float(args.attack_scale)
    if args.attack_flip == "weights":  # the upload is start + malicious, so malicious = −s·w − start
        return [sign_flip(u.params, scale) - start for u in bad]
    return [sign_flip(u.params - start, scale) for u in bad]


@model_attack("gaussian")
def gaussian_uploads(args: Any, package: RoundPackage, bad: list[ClientUpdate], good: list[ClientUpdate]):
    start = package.global_params
    return [torch.randn(start.shape, generator=torch_generator(args.seed, "attack-noise", package.round, u.index),
                        dtype=start.dtype).to(start.device) * float(args.attack_noise_std) for u in bad]


@model_attack("alie")
def alie_uploads(args: Any, package: RoundPackage, bad: list[ClientUpdate], good: list[ClientUpdate]):
    z = float(args.attack_z) or alie_z(len(bad) + len(good), len(bad))
    return [alie(benign_updates(package, bad, good), z)] * len(bad)


@model_attack("ipm")
def ipm_uploads(args: Any, package: RoundPackage, bad: list[ClientUpdate], good: list[ClientUpdate]):
    return [ipm(benign_updates(package, bad, good), float(args.attack_epsilon))] * len(bad)


@model_attack("minmax")
def minmax_uploads(args: Any, package: RoundPackage, bad: list[ClientUpdate], good: list[ClientUpdate]):
    return [minmax(benign_updates(package, bad, good), str(args.attack_direction))] * len(bad)


# ----------------------------------------------------------------------------- data poisoning
def parse_label_map(text: str, num_classes: int) -> dict[int, int]:
    """``"a:b,c:d"`` as {a: b, c: d}; empty: y → C − 1 − y for every class."""
    if not text:
        return {y: num_classes - 1 - y for y in range(num_classes)}
    mapping = {}
    for pair in text.split(","):
        try:
            source, target = (int(part) for part in pair.split(":"))
        except ValueError:
            raise FLError(f"--attack_label_map {text!r}: write class pairs as 'from:to,from:to' (e.g. '1:7,7:1')") from None
        if not (0 <= source < num_classes and 0 <= target < num_classes):
            raise FLError(f"--attack_label_map {text!r}: classes must be in 0..{num_classes - 1}")
        mapping[source] = target
    return mapping


@functools.lru_cache(maxsize=8)
def label_table(text: str, num_classes: int) -> torch.Tensor:
    """The label map as a lookup table (index y gives the poisoned label)."""
    table = torch.arange(num_classes)
    for source, target in parse_label_map(text, num_classes).items():
        table[source] = target
    return table


#: Sageflow's MNIST trigger: (row, column) of its 12 pixels
TRIGGER_PIXELS = ((0, 0), (1, 0), (2, 0), (0, 1), (1, 2), (2, 3), (0, 5), (1, 4), (4, 0), (4, 1), (4, 2), (4, 3))


#: DBA's local patterns (MNIST setting): four 1x4 bars, rows 0 and 3, columns 0-3 and 6-9
DBA_PARTS = tuple(tuple((row, col) for col in range(first, first + 4)) for row in (0, 3) for first in (0, 6))
#: DBA's global trigger, stamped at test time: every local pattern
DBA_TRIGGER = tuple(pixel for part in DBA_PARTS for pixel in part)
Pixels = tuple[tuple[int, int], ...]


def stamp_trigger(x: torch.Tensor, value: float, pixels: Pixels = TRIGGER_PIXELS) -> torch.Tensor:
    """A copy of the images ``x`` (N, C, H, W) with ``pixels`` (row, column) set to ``value`` in every channel."""
    stamped = x.clone()
    rows, cols = zip(*pixels)
    stamped[:, :, list(rows), list(cols)] = value
    return stamped


def backdoor_batch(args: Any, x: torch.Tensor, y: torch.Tensor,
                   pixels: Pixels = TRIGGER_PIXELS) -> tuple[torch.Tensor, torch.Tensor]:
    """The minibatch with its first int(B × fraction) samples stamped and relabelled (Sageflow's)."""
    count = int(len(y) * float(args.backdoor_fraction))
    x, y = x.clone(), y.clone()
    x[:count] = stamp_trigger(x[:count], float(args.backdoor_value), pixels)
    y[:count] = int(args.backdoor_target)
    return x, y


def dba_part(args: Any, client: int, package: RoundPackage) -> Pixels:
    """The local pattern of attacker ``client`` in ``package``'s round: the k-th attacker's (by index)
    is part k mod 4."""
    rank = int(np.searchsorted(np.flatnonzero(package_attackers(args, package)), client))
    return DBA_PARTS[rank % len(DBA_PARTS)]


#: data attacks: how attacker ``client``'s minibatch (x, y) of the round of ``package`` is poisoned (``args``:
#: the run's flags)
DATA_ATTACKS: dict[str, Callable[[Any, torch.Tensor, torch.Tensor, int, int, RoundPackage],
                                 tuple[torch.Tensor, torch.Tensor]]] = {
    "label_flip": lambda args, x, y, classes, client, package:
        (x, label_table(str(args.attack_label_map or ""), classes).to(y.device)[y]),
    "backdoor": lambda args, x, y, classes, client, package: backdoor_batch(args, x, y),
    "dba": lambda args, x, y, classes, client, package:
        backdoor_batch(args, x, y, dba_part(args, client, package)),
    "model_replacement": lambda args, x, y, classes, client, package: backdoor_batch(args, x, y),
}
#: the backdoors, and the trigger their attack success rate stamps on the test images
TEST_TRIGGERS: dict[str, Pixels] = {"backdoor": TRIGGER_PIXELS, "dba": DBA_TRIGGER, "model_replacement": TRIGGER_PIXELS}


def replacement_scale(updates: list[ClientUpdate], attacker: np.ndarray) -> float:
    """Model replacement's Γ: the samples of all uploads over the attackers' (module docstring)."""
    bad = sum(u.num_samples for u in updates if attacker[u.index])
    return sum(u.num_samples for u in updates) / bad if bad else 1.0


@register_local_step("data-poisoning")
@dataclass(frozen=True, eq=False)
class PoisonedData(LocalStep):
    """An attacker's minibatches, poisoned before their gradient is taken (by plain SGD, or DP-SGD's
    per-sample clipping and noise with ``-dp``). Which clients attack in a round is
    :func:`attackers_of` (a function of the flags and the round's package), so Ray actors that
    rebuild this strategy from the flags poison the same clients. (Not plain: the batched engine's
    own step would skip the poisoning.)"""

    args: Any

    name: ClassVar[str] = "data poisoning (--attack label_flip or backdoor)"
    transforms: ClassVar[frozenset[str]] = frozenset({"data"})
    order: ClassVar[int] = 10  # first: every later strategy works on the poisoned minibatch

    @classmethod
    def wanted(cls, args) -> bool:
        return args.attack in DATA_ATTACKS and bool(args.attack_fraction)

    @classmethod
    def from_args(cls, args) -> "PoisonedData":
        return cls(args)

    def transform_batch(self, client: "Client", x: torch.Tensor, y: torch.Tensor,
                        package: RoundPackage) -> tuple[torch.Tensor, torch.Tensor]:
        if not package_attackers(self.args, package)[client.index]:
            return x, y
        return DATA_ATTACKS[self.args.attack](self.args, x, y, client.task.num_classes, client.index, package)


def check_backdoor(args: Any, input_shape: tuple[int, ...], num_classes: int) -> None:
    """One line for a backdoor that cannot run: inputs that are not images large enough for the trigger,
    a target outside the classes (the poisoned share's range is declared with its flag)."""
    pixels = TEST_TRIGGERS[args.attack]
    height = max(r for r, _ in pixels) + 1
    width = max(c for _, c in pixels) + 1
    if len(input_shape) != 3 or input_shape[1] < height or input_shape[2] < width:
        raise FLError(f"--attack {args.attack} stamps a pixel trigger on images of at least {height}x{width} pixels; "
                      f"this dataset's inputs have shape {tuple(input_shape)}")
    if not 0 <= int(args.backdoor_target) < num_classes:
        raise FLError(f"--backdoor_target must be a class in 0..{num_classes - 1}, got {args.backdoor_target}")


# ----------------------------------------------------------------------------- the plug-in
ATTACKS = (*MODEL_ATTACKS, *DATA_ATTACKS)


@register_plugin("attack")
class AttackPlugin(RoundPlugin):
    """Chooses the attackers, poisons their uploads (model attacks) and records who attacked."""
    #: model attacks poison uploads, whatever the labels; the data attacks (and the backdoors' success
    #: rate) are the data-poisoning local step's, which takes one class per sample (flcore/objectives.py)
    objectives = ("class", "multilabel")

    flag_group = "attacks (flcore/features/attacks.py)"
    flag_order = 30
    #: what persists (checkpoints): each round's attackers of the cohort, for its late uploads
    carried = ("cohort_attackers",)

    @classmethod
    def compatible(cls, server_cls: type) -> str | None:
        return refused_by_changing_widths(server_cls, "--attack")

    @classmethod
    def check(cls, args) -> None:
        """An attack named in any case; its flags without it, an empty name, or no attacker asked for,
        each one line (an attack table would otherwise show a clean run as an attacked one)."""
        if isinstance(args.attack, str):
            args.attack = args.attack.strip().lower()
            if not args.attack:
                raise FLError("--attack '' names no attack; drop --attack for a run without attackers")
        if args.attack is None:
            cls.refuse_flags_without(args, "--attack", "attack")
        elif args.attack not in ATTACKS:
            raise FLError(f"--attack {args.attack}: unknown attack; choose one of {', '.join(ATTACKS)}")
        elif args.attack_fraction is None:
            raise FLError(f"--attack {args.attack} needs --attack_fraction f, the share of the clients that attack "
                          "(0 <= f < 1, e.g. 0.2)")

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--attack", type=str, default=None,
                 help="Byzantine clients: sign_flip, gaussian, alie, ipm, minmax (model poisoning), label_flip, "
                      "backdoor, dba, model_replacement (data poisoning)")
        add_flag(parser, "--attack_fraction", type=float, default=None, low=0, below=1,
                 help="share of the clients that attack, needed with --attack: round(f x nc) drawn from the seed "
                      "(at least one client stays benign; 0 or a share that rounds to no attacker is said in a warning)")
        add_flag(parser, "--attack_resample", type=bool, default=False, help="draw the attackers anew every round")
        add_flag(parser, "--attack_scope", type=str, default="clients", choices=["clients", "cohort", "drawn"],
                 help="clients: round(f x nc) of all clients attack (fixed, or per round with --attack_resample); "
                      "cohort: round(f x n) of each round's n training clients, drawn every round; drawn: round(f x m) "
                      "of the m clients drawn, before --straggler_busy skip lets busy ones sit out (official Sageflow)")
        add_flag(parser, "--attack_scale", type=float, default=10.0, low=0, help="sign_flip: an attacker uploads -s x its update")
        add_flag(parser, "--attack_flip", type=str, default="update", choices=["update", "weights"],
                 help="sign_flip: flip the update (w - global; default) or the whole weights w, as the official Sageflow code does")
        add_flag(parser, "--attack_noise_std", type=float, default=1.0, low=0, help="gaussian: the std of the uploaded noise update")
        add_flag(parser, "--attack_z", type=float, default=0.0, low=0, help="alie: mean - z x std (0 = Baruch et al.'s z_max)")
        add_flag(parser, "--attack_epsilon", type=float, default=0.5, low=0, help="ipm: attackers upload -epsilon x the benign mean")
        add_flag(parser, "--attack_direction", type=str, default="std", choices=MINMAX_DIRECTIONS,
                 help="minmax: the perturbation -std, -mean/|mean| or -sign(mean) of the benign updates")
        add_flag(parser, "--attack_label_map", type=str, default="",
                 help="label_flip: class pairs 'from:to,...' (empty: y -> C-1-y)")
        add_flag(parser, "--backdoor_target", type=int, default=2, low=0,
                 help="backdoor, dba, model_replacement: the class triggered images are labelled")
        add_flag(parser, "--backdoor_fraction", type=float, default=0.3125, above=0, high=1,
                 help="backdoor: share of each attacker minibatch stamped and relabelled (Sageflow: 20 of 64)")
        add_flag(parser, "--backdoor_scale", type=float, default=10.0, low=0, help="backdoor, dba: attackers scale their update by it ...")
        add_flag(parser, "--backdoor_from_round", type=int, default=10, low=0,
                 help="... from this round on (Sageflow: x10 from 10); model_replacement: its first scaled round")
        add_flag(parser, "--replacement_scale", type=float, default=0.0, low=0,
                 help="model_replacement: the attackers upload G + scale x (X - G) (0: the round's samples over the "
                      "attackers', the paper's n/eta)")
        add_flag(parser, "--backdoor_value", type=float, default=1.0,
                 help="backdoor: the trigger pixels' input value (1.0: white in PFLlib's [-1, 1] normalisation)")

    order = 60  # after the clock (10) has kept the uploads that arrive in time

    @classmethod
    def wanted(cls, args) -> bool:
        return bool(cls.flags(args).attack)

    def __init__(self, runtime: Runtime, server_cls: type):
        super().__init__(runtime, server_cls)
        args = runtime.args
        self.name = str(args.attack)
        if self.name not in ATTACKS:
            raise FLError(f"--attack {self.name}: unknown attack; choose one of {', '.join(ATTACKS)}")
        fraction = float(args.attack_fraction)
        if args.num_clients != len(runtime.clients):
            raise FLError(f"--attack draws attackers among -nc clients: give -nc {len(runtime.clients)} "
                          f"(the training clients), got {args.num_clients}")
        check_attacker_count(fraction, len(runtime.clients) if args.attack_scope == "clients"
                             else cohort_size(len(runtime.clients), args.join_ratio), args.attack_scope)
        uploads = server_cls.client_cls.uploads_instead
        if self.name in MODEL_ATTACKS and uploads is not None:
            raise FLError(f"--attack {self.name} poisons the model weights clients upload, and {args.algorithm}'s "
                          f"clients upload {uploads} instead; use a data-poisoning attack "
                          f"({', '.join(DATA_ATTACKS)}) with it")
        if self.name in DATA_ATTACKS:
            client_cls = server_cls.client_cls
            if client_cls.capabilities.overrides_any(*LOCAL_PROCEDURE, "pre_training"):
                raise FLError(f"--attack {self.name} poisons the base local step, but {args.algorithm}'s clients "
                              f"({client_cls.__name__}) train their own way; use a model-poisoning attack with it")
        if self.name == "label_flip":
            parse_label_map(str(args.attack_label_map or ""), runtime.num_classes)  # a bad map: one line now
        if self.name in TEST_TRIGGERS:
            check_backdoor(args, runtime.dataset.input_shape, runtime.num_classes)
        #: the attack success rate's passes over the test images (backdoors)
        self.evaluator = Evaluator(runtime) if self.name in TEST_TRIGGERS else None
        self.divergence_note = f"the model collapsed under --attack {self.name}"
        #: attackers' client indices among the uploads of the last round poisoned (for the history)
        self.last_attackers: list[int] = []
        #: ``--attack_scope cohort|drawn``: every trained round's attackers (a late upload's start round
        #: is looked up here when it arrives; checkpointed)
        self.cohort_attackers: dict[int, list[int]] = {}

    @classmethod
    def attackers_among(cls, args: Any, uploads: int) -> int:
        """How many of a round's ``uploads`` the flags make attackers' (``--attack_scope cohort``'s
        count; what a defence assumes by default, ``--robust_f -1``): none in a run without an attack."""
        return 0 if args.attack_fraction is None else attacker_count(args.attack_fraction, uploads)

    def attackers(self, rnd: int) -> np.ndarray:
        """The attacker mask of training round ``rnd`` (with ``--attack_scope cohort|drawn``: a round
        that has trained)."""
        if self.args.attack_scope not in PER_COHORT:
            return attackers_of(self.args, rnd)
        mask = np.zeros(int(self.args.num_clients), dtype=bool)
        mask[self.cohort_attackers[rnd]] = True
        return mask

    def after_training(self, package: RoundPackage, trained: list[ClientUpdate], arrived: list[ClientUpdate],
                       result: RoundResult) -> list[ClientUpdate]:
        mask = package_attackers(self.args, package)
        if self.args.attack_scope in PER_COHORT:
            self.cohort_attackers[package.round] = np.flatnonzero(mask).tolist()
        for update in arrived:  # the ground truth, for metrics (module docstring)
            update.attacker = bool(mask[update.index])
        bad = [u for u in arrived if u.attacker]
        self.last_attackers = [u.index for u in bad]
        if bad and self.name in MODEL_ATTACKS:
            self.poison(package, bad, [u for u in arrived if not mask[u.index]])
        elif bad and self.name in TEST_TRIGGERS and package.round >= int(self.args.backdoor_from_round):
            scale = float(self.args.backdoor_scale)
            if self.name == "model_replacement":
                scale = float(self.args.replacement_scale) or replacement_scale(arrived, mask)
            start = package.global_params
            for update in bad:  # the boost: Γ(X − G) + G, so the poisoned update survives averaging
                update.params = start + (update.params - start) * scale
        return arrived

    def poison(self, package: RoundPackage, bad: list[ClientUpdate], good: list[ClientUpdate]) -> None:
        """Replace the attackers' uploads in place (update objects keep their order and weights)."""
        start, shared = package.global_params, package.shared
        for update, malicious in zip(bad, MODEL_ATTACKS[self.name](self.args, package, bad, good)):
            if shared is not None:  # the private part never leaves a client
                malicious = torch.where(shared, malicious, torch.zeros_like(malicious))
            update.params = start + malicious

    def after_evaluation(self, rnd: int, global_params: torch.Tensor, result: RoundResult) -> None:
        if self.name in TEST_TRIGGERS:
            self.runtime.history.add_series("backdoor_asr", self.attack_success_rate(global_params))

    def attack_success_rate(self, params: torch.Tensor) -> float:
        """The share of the test images of the other classes, trigger stamped (DBA: the global trigger),
        classified as the target."""
        dataset = self.runtime.dataset
        x, y = dataset.split("test")
        target, value, trigger = int(self.args.backdoor_target), float(self.args.backdoor_value), TEST_TRIGGERS[self.name]
        rows = torch.nonzero(y != target).flatten()
        if not len(rows):
            return float("nan")
        hits = self.evaluator.map_batches(params, x, lambda net, batch:
                                          int((net(stamp_trigger(batch, value, trigger)).argmax(1) == target).sum()),
                                          dataset.input_table, rows)
        return sum(hits) / len(rows)

    def after_round(self, rnd: int, package: RoundPackage, updates: list[ClientUpdate], result: RoundResult) -> None:
        history = self.runtime.history
        history.add_series("attack_uploads", len(self.last_attackers))
        history.add_series("attackers", list(self.last_attackers))

    def summary(self) -> dict[str, object]:
        fixed = self.args.attack_resample or self.args.attack_scope in PER_COHORT
        return {"attack": self.name, "attack_fraction": float(self.args.attack_fraction),
                "attack_scope": self.args.attack_scope,
                "attackers": None if fixed else np.flatnonzero(self.attackers(0)).tolist()}
