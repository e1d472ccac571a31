"""FedCross: multi-model cross-aggregation (Hu et al., ICDE 2024, arXiv:2210.08285).

The server keeps K middleware models, K = the number of clients selected per round. Each round
every middleware model is sent to one selected client (a random assignment drawn from (seed,
round)) and trained there (plain local SGD, ``clientfedcross.py``). Each trained model v_j is then
cross-aggregated with one collaborative model v_co(j) chosen among the other trained models:

    w_j ← α · v_j + (1 − α) · v_co(j),        α = ``-ca`` (0.99),

with co(j) chosen by ``-cmss``: 0 = in order, (j + t mod (K − 1) + 1) mod K in round t; 1 = the
least similar model (PFLlib's default); 2 = the most similar one; similarity is the cosine of the
flattened trainable parameters. During the first ``-fsb`` rounds every middleware model is set to
the FedAvg of the uploads instead (the paper's optional first stage; 0 = none, PFLlib's default).
The global model, which is evaluated, is the mean of the middleware models (paper);
``--fedcross_global uploads`` uses the sample-weighted mean of the uploads, as PFLlib does.

Deliberate choices where PFLlib differs: PFLlib's similarity sums cosines of pairs of layers
rather than one cosine of the whole vector, and its ``-cmss 2`` may pick the model itself; here
co(j) ≠ j whenever K > 1. A middleware model whose client's upload was dropped (``-cdr``) keeps
its previous weights. The cohort size must be the same every round (``-rjr`` is refused).
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedcross import FedCrossClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from cli.flags import add_flag
from utils.errors import FLError
from utils.seeding import numpy_rng

STRATEGIES = {0: "in order", 1: "least similar", 2: "most similar"}


def collaborators(similarity: torch.Tensor, strategy: int, rnd: int) -> list[int]:
    """co(j) for every middleware model j, from the [K, K] cosine similarities of the trained models."""
    count = similarity.shape[0]
    if count == 1:
        return [0]
    if strategy == 0:
        offset = rnd % (count - 1) + 1
        return [(j + offset) % count for j in range(count)]
    others = similarity.clone()
    others.fill_diagonal_(float("inf") if strategy == 1 else float("-inf"))
    pick = others.argmin(dim=1) if strategy == 1 else others.argmax(dim=1)
    return [int(c) for c in pick]


@register_algorithm("FedCross")
class FedCrossServer(Server):
    #: what persists across rounds (checkpoints): the middleware models and which client trains which
    carried = ("middleware", "assignment")

    client_cls = FedCrossClient

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-fsb", "--first_stage_bound", type=int, default=0, low=0,
                 help="FedCross: rounds of FedAvg before cross-aggregation starts")
        add_flag(parser, "-ca", "--fedcross_alpha", type=float, default=0.99, low=0, high=1,
                 help="FedCross: weight α of a trained model in its cross-aggregation with its collaborator")
        add_flag(parser, "-cmss", "--collaberative_model_select_strategy", "--collaborative_model_select_strategy",
                 dest="collaberative_model_select_strategy", type=int, default=1, choices=sorted(STRATEGIES),
                 help="FedCross: collaborator of each model: 0 in order, 1 least similar, 2 most similar")
        add_flag(parser, "--fedcross_global", type=str, default="middleware", choices=["middleware", "uploads"],
                 help="FedCross: global model = mean of the middleware models (paper) or of the uploads (PFLlib)")

    def setup(self) -> None:
        if not 0 <= self.hp.fedcross_alpha <= 1:
            raise FLError(f"-ca must be in [0, 1], got {self.hp.fedcross_alpha}")
        if self.args.random_join_ratio:
            raise FLError("FedCross keeps one middleware model per selected client: it needs the same number of "
                          "clients every round; drop -rjr")
        self.middleware: torch.Tensor | None = None  # [K, D], created at the first round
        self.assignment: dict[int, int] = {}

    def summary(self) -> dict[str, object]:
        a = self.hp
        return {"alpha": a.fedcross_alpha, "strategy": STRATEGIES[a.collaberative_model_select_strategy],
                "first_stage_bound": a.first_stage_bound, "global": a.fedcross_global}

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        if self.middleware is None:
            self.middleware = self.global_params.unsqueeze(0).repeat(len(cohort), 1)
        if len(cohort) != len(self.middleware):
            raise FLError(f"FedCross has {len(self.middleware)} middleware models but round {rnd} selected "
                          f"{len(cohort)} clients; use a selection with a fixed cohort size")
        order = numpy_rng(self.args.seed, "fedcross-assign", rnd).permutation(len(cohort))
        self.assignment = {client: int(order[pos]) for pos, client in enumerate(cohort)}
        return self.package(rnd, cohort, payloads={c: {"start": self.middleware[m]} for c, m in self.assignment.items()})

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        trained = self.middleware.clone()
        for update in updates:
            trained[self.assignment[update.index]] = update.params
        uploads_mean = weighted_average(updates)
        if package.round < self.hp.first_stage_bound:
            self.middleware = uploads_mean.unsqueeze(0).repeat(len(trained), 1)
            self.global_params = uploads_mean
            return
        params = trained[:, : self.model.num_params].double()
        unit = params / params.norm(dim=1, keepdim=True).clamp_min(1e-12)
        partner = collaborators(unit @ unit.T, self.hp.collaberative_model_select_strategy, package.round)
        alpha = float(self.hp.fedcross_alpha)
        self.middleware = alpha * trained + (1 - alpha) * trained[partner]
        self.global_params = self.middleware.mean(0) if self.hp.fedcross_global == "middleware" else uploads_mean
