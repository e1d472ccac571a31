"""Selection under a recruiting budget: the baselines FAIR is compared with at equal budget.

``--select budget_uniform`` (random selection) and ``--select budget_adafl`` (AdaFL's attention,
``selectors/adafl.py``) order the selectable clients by a random draw without replacement, with
equal probabilities or with AdaFL's attention scores, from (seed, "select", round); then clients
are recruited in that order while their cost fits what is left of the round's ``--budget``, each
paid its cost (``flcore/auction.py``: ``within_budget``; the same seeded costs as FAIR's, from
``--cost_low``/``--cost_high``). The budget replaces -jr and AdaFL's dynamic fraction as what
decides the cohort's size; AdaFL's scores are updated as usual after each round.
``rs_budget_spent`` records what each round paid. Use them with any algorithm, e.g.
``-algo FedAvg --select budget_uniform --budget 20``.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import TYPE_CHECKING

import numpy as np

from flcore.auction import add_budget_flags, client_costs, within_budget
from flcore.registry import register_selector
from flcore.selectors.adafl import AdaFLSelector
from flcore.selectors.uniform import UniformSelector, allowed_pool
from utils.seeding import numpy_rng

if TYPE_CHECKING:
    from flcore.protocol import Runtime


def budgeted_cohort(selector: UniformSelector, rnd: int, selectable: np.ndarray | None, probabilities: np.ndarray,
                    costs: np.ndarray, budget: float) -> list[int]:
    """The clients a draw in ``probabilities``' order recruits within ``budget`` (module docstring),
    among those ``selectable`` allows."""
    pool = allowed_pool(selectable)
    pool = np.arange(selector.num_clients) if pool is None else pool
    if len(pool) == 0:
        return []
    weights = probabilities[pool] / probabilities[pool].sum()
    order = numpy_rng(selector.args.seed, "select", rnd).choice(pool, size=len(pool), replace=False, p=weights)
    cohort, spent = within_budget(order, costs, budget)
    selector.runtime.history.add_series("budget_spent", spent)
    return cohort


class Budgeted:
    """What both budgeted policies add to their base policy: the budget flags and the seeded costs."""

    def __init__(self, runtime: "Runtime"):
        super().__init__(runtime)
        self.costs = client_costs(self.args.seed, self.num_clients, self.hp.cost_low, self.hp.cost_high)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_budget_flags(parser)


@register_selector("budget_uniform")
class BudgetedUniformSelector(Budgeted, UniformSelector):
    """Random order, recruited within the budget."""

    def select(self, rnd: int, selectable: np.ndarray | None) -> list[int]:
        return budgeted_cohort(self, rnd, selectable, UniformSelector.probabilities(self), self.costs, self.hp.budget)


@register_selector("budget_adafl")
class BudgetedAdaFLSelector(Budgeted, AdaFLSelector):
    """AdaFL's attention order, recruited within the budget."""

    def select(self, rnd: int, selectable: np.ndarray | None) -> list[int]:
        probs = self.probabilities()
        self.runtime.history.add_series("selection_probs", probs)
        return budgeted_cohort(self, rnd, selectable, probs, self.costs, self.hp.budget)
