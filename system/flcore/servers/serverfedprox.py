"""FedProx (Li et al., MLSys 2020, arXiv:1812.06127): the server is FedAvg's unchanged.

Only the client differs (the proximal term μ/2·‖w − w_t‖², see ``clientfedprox.py``). PFLlib's
default μ = 0 is kept for command-line compatibility; a warning says that it equals FedAvg.
"""
from __future__ import annotations

import logging

from flcore.clients.clientfedprox import FedProxClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server

log = logging.getLogger("fl")


@register_algorithm("FedProx")
class FedProxServer(Server):
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    client_cls = FedProxClient

    def setup(self) -> None:
        if self.hp.mu == 0.0:
            log.warning("warning: FedProx with -mu 0 (PFLlib's default) is FedAvg; set -mu, e.g. 0.01")

    def summary(self) -> dict[str, object]:
        return {"mu": self.hp.mu}
