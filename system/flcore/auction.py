"""Client costs and recruiting under a budget: FAIR's reverse auction and the budgeted baselines.

* **Costs.** Client c's cost of one round of training is drawn once, uniform in
  [``--cost_low``, ``--cost_high``], from (seed, "client-cost", c): the same seed gives every
  method the same costs. Clients bid their cost (the auction below is truthful, so that is their
  best bid).
* **Reverse auction** (FAIR, Deng et al., INFOCOM 2021), per round with budget B (``--budget``,
  per round; inf allowed): candidates are ranked by estimated quality per unit of bid, q_i / b_i,
  highest first (ties by client position). The winners are the longest prefix 1..K of that ranking
  in which every winner's price per unit of quality fits the budget shared in proportion to
  quality, b_k / q_k ≤ B / Σ_{j≤K} q_j (a proportional-share rule: the left side grows and the
  right side shrinks with k, so the winners are a prefix). Each winner is paid for its quality at
  one unit price,

      p_i = q_i · min( B / Σ_{j≤K} q_j ,  b_{K+1} / q_{K+1} ),

  the first loser's price per unit of quality capped by the budget's share. Then Σ p_i ≤ B (budget
  feasible) and p_i ≥ b_i (individually rational: b_i/q_i ≤ b_K/q_K ≤ both terms); a winner's
  payment does not depend on its own bid while the winner set stays the same (the critical-price
  idea behind the paper's truthfulness; we do not re-prove it for bids that change the winner
  set). When every candidate wins there is no loser: the unit price is then the
  budget's share capped by the highest winning price per unit, max_k b_k / q_k (with B = inf,
  that cap; finite payments). Candidates whose estimated quality is 0 or less never win.
  This is our reading of the paper's mechanism (its text was not available offline); the
  proportional-share rule and the critical-price payment are the textbook budget-feasible
  auction it builds on.
* **Pay as bid in a given order** (the baselines: random selection, AdaFL's attention order):
  clients are recruited in the order given while their bid fits what is left of the budget, a
  client that does not fit being skipped, and each is paid its bid.
"""
from __future__ import annotations

from argparse import ArgumentParser

import numpy as np

from cli.flags import add_flag
from utils.errors import FLError
from utils.seeding import numpy_rng


def add_budget_flags(parser: ArgumentParser) -> None:
    """The budget and cost model, declared alike by FAIR and the budgeted selection policies so
    that one command line gives every method the same budget and costs."""
    add_flag(parser, "--budget", type=float, default=20.0, above=0, finite=False,
             help="recruiting budget per round (FAIR's auction, --select budget_uniform/budget_adafl); inf: unlimited")
    add_flag(parser, "--cost_low", type=float, default=1.0, above=0, help="lowest client cost per round (uniform cost model)")
    add_flag(parser, "--cost_high", type=float, default=5.0, above=0, help="highest client cost per round (uniform cost model)")


def client_costs(seed: int, num_clients: int, low: float, high: float) -> np.ndarray:
    """Each client's cost of one round, uniform in [low, high], from (seed, "client-cost", client)."""
    if low > high:
        raise FLError(f"--cost_low {low} is above --cost_high {high}; pass --cost_low <= --cost_high")
    return np.asarray([numpy_rng(seed, "client-cost", c).uniform(low, high) for c in range(num_clients)])


def reverse_auction(quality: np.ndarray, bids: np.ndarray, budget: float) -> tuple[list[int], np.ndarray]:
    """(winners as positions into ``quality``, sorted; every candidate's payment, 0 for losers)."""
    quality = np.asarray(quality, dtype=np.float64)
    bids = np.asarray(bids, dtype=np.float64)
    payments = np.zeros(len(quality))
    eligible = [i for i in range(len(quality)) if quality[i] > 0]
    ranking = sorted(eligible, key=lambda i: (-quality[i] / bids[i], i))
    winners: list[int] = []
    total_quality = 0.0
    for i in ranking:
        if bids[i] / quality[i] > budget / (total_quality + quality[i]):
            break
        winners.append(i)
        total_quality += quality[i]
    if not winners:
        return [], payments
    share = budget / total_quality
    if len(winners) < len(ranking):
        loser = ranking[len(winners)]
        price = min(share, bids[loser] / quality[loser])
    else:  # everyone won: no critical loser, the highest winning unit price caps the share
        price = min(share, max(bids[i] / quality[i] for i in winners))
    for i in winners:
        payments[i] = quality[i] * price
    return sorted(winners), payments


def within_budget(order: np.ndarray | list[int], bids: np.ndarray, budget: float) -> tuple[list[int], float]:
    """(clients recruited in ``order`` while their bid fits the budget left, sorted; total paid)."""
    recruited, spent = [], 0.0
    for c in order:
        if spent + float(bids[c]) <= budget:
            recruited.append(int(c))
            spent += float(bids[c])
    return sorted(recruited), spent
