"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, ICML 2021, arXiv:2102.07078).

Rule: clients share a global representation (the body) and keep their own heads. Each round a
selected client first trains its head with the body frozen, then the body with its new head
frozen (``clientfedrep.py``); only the body is uploaded, and the server averages the bodies
(``shared = "body"``, sample-weighted). Each client is evaluated with the global body and its
own head; a client never selected, with the initial head.

Differences:
* The paper trains the head for τ = 10 local epochs and the body for 1; PFLlib's ``-pls`` (head
  epochs) defaults to 1 and the body takes ``-ls`` epochs. We keep PFLlib's defaults; pass
  ``-pls 10 -ls 1`` for the paper's set-up.
* The paper averages the bodies uniformly over the sampled clients; PFLlib weights them by
  training samples (FedAvg's weights), our default; ``--fedrep_weighting uniform`` is the paper's.
With ``-pls 0`` the head never moves and FedRep's training is FedBABU's (same global model).
FedRep clients run on every engine (the two phases are a per-step gradient mask).
The shared model has no meaning of its own (its head is the initial one), so only the
personalised accuracy is recorded.
"""
from __future__ import annotations

from argparse import ArgumentParser

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedrep import FedRepClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from cli.flags import add_flag
from utils.errors import FLError


@register_algorithm("FedRep")
class FedRepServer(Server):
    client_cls = FedRepClient
    personalized = True
    has_global_model = False
    shared = "body"

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--fedrep_weighting", type=str, default="samples", choices=["samples", "uniform"],
                 help="average the bodies weighted by training samples (PFLlib) or uniformly (paper)")

    def setup(self) -> None:
        if self.hp.plocal_epochs < 0:
            raise FLError(f"-pls must be >= 0, got {self.hp.plocal_epochs}")

    def summary(self) -> dict[str, object]:
        return {"plocal_epochs": self.hp.plocal_epochs, "fedrep_weighting": self.hp.fedrep_weighting}

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        if self.hp.fedrep_weighting == "uniform":
            self.global_params = weighted_average(updates, [1 / len(updates)] * len(updates))
        else:
            super().aggregate(updates, package)
