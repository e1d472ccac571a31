"""FedLC (Zhang et al., ICML 2022, arXiv:2209.00189): the server is FedAvg's.

Only the client's loss differs (logit calibration by label counts, see ``clientfedlc.py``); the
uploads are averaged by samples. PFLlib's default ``-tau 1.0`` is kept; ``-tau 0`` is FedAvg (a
warning says so) and a negative τ is rejected (it would widen the margin of frequent classes
instead). With ``--fedlc_counts global`` (PFLlib's reading) the server sums all clients' label
counts once at the start and every client calibrates with them.
"""
from __future__ import annotations

import logging

import torch

from flcore.clients.clientfedlc import FedLCClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from utils.errors import FLError

log = logging.getLogger("fl")


@register_algorithm("FedLC")
class FedLCServer(Server):
    client_cls = FedLCClient

    def setup(self) -> None:
        tau = self.hp.tau
        if tau < 0:
            raise FLError(f"FedLC needs a calibration strength -tau >= 0, got {tau}")
        if tau == 0:
            log.warning("warning: FedLC with -tau 0 is FedAvg; set -tau, e.g. 1")
        if self.hp.fedlc_counts == "global":
            total = sum(client.label_counts() for client in self.clients)
            for client in self.clients:
                client.configure(global_counts=total)

    def summary(self) -> dict[str, object]:
        return {"tau": self.hp.tau, "fedlc_counts": self.hp.fedlc_counts}
