"""AdaFL client selection: attention scores plus a dynamic fraction.

Zihan Chen, Kai Fong Ernest Chong, Tony Q. S. Quek, "Dynamic Attention-based
Communication-Efficient Federated Learning", FTL-IJCAI 2021, arXiv:2108.05765.
The equations were lost in extraction; this follows the reconstruction in
``shared/specs/adafl.md`` and every free choice is a ``--adafl_*`` flag.

Attention (§2.2). A probability vector a over the K clients, initialised to n_k / n. Each round
m_t clients are drawn from a without replacement. After aggregation, for every client k whose
model arrived, d_k = ‖w_{t+1} − w_k‖₂ (the new global model; ``--adafl_dist_ref sent_global``
uses the model that was sent, w_t). With A = Σ_{j∈S} a_j the selected clients' mass::

    mass   (default): a_k ← β a_k + (1 − β) · A · d_k / Σ_{j∈S} d_j      k ∈ S
    renorm:           a_k ← β a_k + (1 − β) · d_k / Σ_{j∈S} d_j, then a ← a / Σ a

and a_k is unchanged for k ∉ S (clients whose upload was dropped count as not selected). Scores
are floored at ``--adafl_min_prob`` and renormalised; if Σ d = 0 the update is skipped.

Dynamic fraction (§2.3). With ΔC = (C_T − C_1)/(m − 1), the paper's 1-indexed round r uses
C_r = min(C_1 + ⌊(r − 1)/s⌋ ΔC, C_T). Our rounds are 0-indexed, so round t uses C_{t+1}, i.e.
level ⌊t/s⌋; the cohort has m_t = max(round(C·K), 1) clients (half rounded up).

Ablations: ``--adafl_attention False`` draws exactly as the ``uniform`` policy (the same
cohorts for the same seed, "Dyn. FedAvg" when the fraction is dynamic);
``--adafl_dynamic False`` uses ``-jr``/``-rjr`` as the uniform policy does ("Attn.<jr>").
The probabilities and fraction of every round are recorded as ``rs_selection_probs`` and
``rs_join_fraction`` (at selection time, before the round's update).

Under the virtual clock's restrictions (availability, ``-ts``; ``selectors/uniform.py``) the
draw uses the attention scores of the allowed clients, renormalised over them; the recorded
probabilities are the unrestricted scores.
"""
from __future__ import annotations

import logging
import math
from argparse import ArgumentParser
from typing import TYPE_CHECKING

import numpy as np
import torch

from flcore.registry import register_selector
from flcore.selectors.uniform import UniformSelector, allowed_pool
from cli.flags import add_flag
from utils.errors import FLError
from utils.seeding import numpy_rng

if TYPE_CHECKING:
    from flcore.protocol import ClientUpdate, RoundPackage, Runtime

log = logging.getLogger("fl")


def scheduled_fraction(rnd: int, start: float, end: float, num_fracs: int, step: int) -> float:
    """C_{rnd+1} of the paper's schedule for our 0-indexed round ``rnd``."""
    increment = (end - start) / (num_fracs - 1) if num_fracs > 1 else 0.0
    level = min(rnd // step, num_fracs - 1)
    return min(start + level * increment, end)


def clients_for_fraction(fraction: float, num_clients: int) -> int:
    """m = max(round(C·K), 1), halves rounded up; the epsilon keeps 0.3·100 at 30."""
    return max(1, min(num_clients, math.floor(fraction * num_clients + 0.5 + 1e-9)))


def attention_update(scores: np.ndarray, selected: np.ndarray, distances: np.ndarray, beta: float,
                     rule: str = "mass", min_prob: float = 1e-12) -> np.ndarray:
    """The new score vector after clients ``selected`` reported ``distances`` (a new array).

    Unselected entries keep their score (up to the floor's renormalisation); a zero distance sum
    leaves the vector unchanged."""
    scores = np.asarray(scores, dtype=np.float64)
    selected = np.asarray(selected, dtype=np.int64)
    distances = np.asarray(distances, dtype=np.float64)
    total = float(distances.sum())
    if selected.size == 0 or not total > 0 or not np.isfinite(total):
        return scores.copy()
    new = scores.copy()
    share = distances / total
    if rule == "mass":
        mass = float(scores[selected].sum())
        new[selected] = beta * scores[selected] + (1 - beta) * mass * share
    elif rule == "renorm":
        new[selected] = beta * scores[selected] + (1 - beta) * share
    else:
        raise FLError(f"--adafl_update must be mass or renorm, got {rule!r}")
    # The mass rule sums to 1 exactly up to rounding; dividing anyway would perturb the
    # unselected entries, so only a drift beyond rounding is corrected.
    if rule == "renorm" or abs(new.sum() - 1.0) > 1e-9:
        new /= new.sum()
    if min_prob > 0 and new.min() < min_prob:
        new = np.maximum(new, min_prob)
        new /= new.sum()
    return new


@register_selector("adafl")
class AdaFLSelector(UniformSelector):
    """Attention-weighted sampling with a growing cohort (AdaFL)."""

    #: the attention scores, updated after each round (``observe``)
    carried = ("scores",)

    def __init__(self, runtime: "Runtime"):
        super().__init__(runtime)
        args = self.args
        hp = self.hp
        self.attention = hp.adafl_attention
        self.dynamic = hp.adafl_dynamic
        self.beta = hp.adafl_beta
        self.rule = hp.adafl_update
        self.dist_ref = hp.adafl_dist_ref
        self.replace = hp.adafl_replace
        self.min_prob = hp.adafl_min_prob
        self.with_buffers = hp.adafl_dist_buffers
        self._validate()
        sizes = np.asarray([client.num_train for client in runtime.clients], dtype=np.float64)
        if sizes.sum() > 0:
            self.scores = sizes / sizes.sum()
        else:
            self.scores = np.full(self.num_clients, 1.0 / self.num_clients)
        if self.min_prob > 0 and self.scores.min() < self.min_prob:
            self.scores = np.maximum(self.scores, self.min_prob)
            self.scores /= self.scores.sum()
        if self.dynamic and (args.join_ratio != 1.0 or args.random_join_ratio):
            log.info("adafl: the dynamic fraction replaces -jr/-rjr (use --adafl_dynamic False for a constant -jr)")

    def _validate(self) -> None:
        a = self.hp
        if not 0.0 <= self.beta <= 1.0:
            raise FLError(f"--adafl_beta must be in [0, 1], got {self.beta}")
        if not 0 < a.adafl_frac_start <= a.adafl_frac_end <= 1:
            raise FLError(
                f"need 0 < --adafl_frac_start <= --adafl_frac_end <= 1, got {a.adafl_frac_start}, {a.adafl_frac_end}"
            )
        if a.adafl_num_fracs < 1 or a.adafl_frac_step < 1:
            raise FLError("--adafl_num_fracs and --adafl_frac_step must be >= 1")
        if not 0 <= self.min_prob < 1.0 / self.num_clients:
            raise FLError(f"--adafl_min_prob must be in [0, 1/K), got {self.min_prob}")

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--adafl_attention", type=bool, default=True,
                 help="sample by attention scores (False: uniform sampling, the 'uniform' policy's cohorts)")
        add_flag(parser, "--adafl_dynamic", type=bool, default=True,
                 help="growing fraction C_1 -> C_T (False: the constant -jr, 'Attn.<jr>')")
        add_flag(parser, "--adafl_beta", type=float, default=0.5, low=0, high=1,
                 help="β, decay of the previous attention score (value stripped from the paper; spec default)")
        add_flag(parser, "--adafl_update", type=str, default="mass", choices=["mass", "renorm"],
                 help="score update: mass keeps the selected clients' total probability; renorm divides by the sum")
        add_flag(parser, "--adafl_dist_ref", type=str, default="new_global", choices=["new_global", "sent_global"],
                 help="distance of each local model to the new global model w_{t+1} or to the sent one w_t")
        add_flag(parser, "--adafl_dist_buffers", type=bool, default=False,
                 help="include float buffers (BatchNorm statistics) in the distance, not only the weights")
        add_flag(parser, "--adafl_replace", type=bool, default=False,
                 help="draw with replacement (duplicates collapse: the cohort may have fewer than m_t clients)")
        add_flag(parser, "--adafl_min_prob", type=float, default=1e-12, low=0, below=1,
                 help="floor of every selection probability (then renormalised)")
        add_flag(parser, "--adafl_frac_start", type=float, default=0.1, above=0, high=1, help="C_1, the first round's fraction")
        add_flag(parser, "--adafl_frac_end", type=float, default=0.5, above=0, high=1, help="C_T, the final fraction")
        add_flag(parser, "--adafl_num_fracs", type=int, default=5, low=1, help="m, the number of distinct fractions")
        add_flag(parser, "--adafl_frac_step", type=int, default=200, low=1, help="s, rounds between fraction increases")

    # ---------------------------------------------------------------- sizes
    def fraction(self, rnd: int) -> float:
        """The fraction used in 0-indexed round ``rnd`` (the paper's C_{rnd+1} when dynamic)."""
        if not self.dynamic:
            if self.args.random_join_ratio:
                return self.num_to_select(rnd) / self.num_clients
            return float(self.args.join_ratio)
        a = self.hp
        return scheduled_fraction(rnd, a.adafl_frac_start, a.adafl_frac_end, a.adafl_num_fracs, a.adafl_frac_step)

    def num_to_select(self, rnd: int) -> int:
        if not self.dynamic:
            return super().num_to_select(rnd)
        return clients_for_fraction(self.fraction(rnd), self.num_clients)

    # ------------------------------------------------------------ selection
    def probabilities(self) -> np.ndarray:
        if not self.attention:
            return super().probabilities()
        return self.scores.copy()

    def select(self, rnd: int, selectable: np.ndarray | None) -> list[int]:
        probs = self.probabilities()
        if not self.attention:
            cohort = super().select(rnd, selectable)
        else:
            count = self.num_to_select(rnd)
            pool = allowed_pool(selectable)
            if pool is None:
                if count >= self.num_clients and not self.replace:
                    cohort = list(range(self.num_clients))
                else:
                    rng = numpy_rng(self.args.seed, "select", rnd)
                    drawn = rng.choice(self.num_clients, size=count, replace=self.replace, p=probs)
                    cohort = sorted({int(i) for i in drawn})
            elif count >= len(pool) and not self.replace:
                cohort = [int(i) for i in pool]
            else:
                rng = numpy_rng(self.args.seed, "select", rnd)
                drawn = rng.choice(pool, size=count, replace=self.replace, p=probs[pool] / probs[pool].sum())
                cohort = sorted({int(i) for i in drawn})
        history = self.runtime.history
        history.add_series("selection_probs", probs)
        history.add_series("join_fraction", self.fraction(rnd))
        return cohort

    # --------------------------------------------------------------- update
    def distances(self, updates: list["ClientUpdate"], reference: torch.Tensor) -> np.ndarray:
        """‖reference − w_k‖₂ over the weights (and float buffers with --adafl_dist_buffers)."""
        width = reference.numel() if self.with_buffers else self.runtime.model.num_params
        ref = reference[:width].double()
        return np.asarray([float(torch.linalg.vector_norm(u.params[:width].double() - ref)) for u in updates])

    def observe(self, rnd: int, package: "RoundPackage", updates: list["ClientUpdate"],
                global_params: torch.Tensor) -> None:
        if not self.attention or not updates:
            return
        reference = global_params if self.dist_ref == "new_global" else package.global_params
        selected = np.asarray([u.index for u in updates], dtype=np.int64)
        dist = self.distances(updates, reference)
        if not dist.sum() > 0:
            log.info("adafl: round %d, every local model equals the reference; scores unchanged", rnd)
            return
        self.scores = attention_update(self.scores, selected, dist, self.beta, self.rule, self.min_prob)

    def settings(self) -> dict[str, object]:
        """The policy's hyperparameters, for the run's log line."""
        a = self.hp
        out: dict[str, object] = {"attention": self.attention, "dynamic": self.dynamic}
        if self.attention:
            out.update(beta=self.beta, update=self.rule, dist_ref=self.dist_ref, replace=self.replace)
        if self.dynamic:
            out.update(frac_start=a.adafl_frac_start, frac_end=a.adafl_frac_end,
                       num_fracs=a.adafl_num_fracs, frac_step=a.adafl_frac_step)
        else:
            out.update(join_ratio=self.args.join_ratio)
        return out
