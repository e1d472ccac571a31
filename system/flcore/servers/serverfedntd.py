"""FedNTD (Lee et al., NeurIPS 2022, arXiv:2106.03097): the server is FedAvg's.

Only the client's loss differs (not-true distillation from the received global model, see
``clientfedntd.py``); uploads are averaged by samples. PFLlib's defaults are kept for command-line
compatibility: ``-bt 0`` makes FedNTD FedAvg, so a warning says so; ``-tau`` must be positive.
"""
from __future__ import annotations

import logging

from flcore.clients.clientfedntd import FedNTDClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from utils.errors import FLError

log = logging.getLogger("fl")


@register_algorithm("FedNTD")
class FedNTDServer(Server):
    client_cls = FedNTDClient

    def setup(self) -> None:
        if self.hp.tau <= 0:
            raise FLError(f"FedNTD needs a temperature -tau > 0, got {self.hp.tau}")
        if self.num_classes < 2:
            raise FLError("FedNTD needs at least 2 classes (it distils the classes that are not the true one)")
        if self.hp.beta == 0.0:
            log.warning("warning: FedNTD with -bt 0 (PFLlib's default) is FedAvg; set -bt, e.g. 1")

    def summary(self) -> dict[str, object]:
        return {"beta": self.hp.beta, "tau": self.hp.tau,
                "fedntd_tau_squared": self.hp.fedntd_tau_squared}
