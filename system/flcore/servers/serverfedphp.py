"""FedPHP (Li, Zhan, Shao, Li, Song, ECML-PKDD 2021): PFLlib's ``-algo FedPHP``.

The server is FedAvg's (sample-weighted average of the uploaded models); the inherited private
models and the personalised models stay with the clients (``clientfedphp.py``, with the choices
where this differs from PFLlib). Each client is evaluated with its personalised model (or its HPM,
``--fedphp_eval inherited``), the global model before its first participation; the global
model's accuracy is recorded too (``rs_test_acc_global``).
"""
from __future__ import annotations

import logging

import torch

from flcore.clients.clientfedphp import FedPHPClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from utils.errors import FLError

log = logging.getLogger("fl")


@register_algorithm("FedPHP")
class FedPHPServer(Server):
    client_cls = FedPHPClient
    personalized = True

    def setup(self) -> None:
        if not 0 <= self.hp.lamda <= 1 or not 0 <= self.hp.mu <= 1:
            raise FLError(f"FedPHP's -lam and -mu must lie in [0, 1], got {self.hp.lamda} and {self.hp.mu}")
        if self.hp.lamda == 1:
            log.warning("warning: FedPHP with -lam 1 (PFLlib's default) gives the cross-entropy weight 0; "
                        "clients only match their HPM's features (e.g. -lam 0.5)")
        if self.hp.mu == 0:
            log.warning("warning: FedPHP with -mu 0 (PFLlib's default) makes each HPM the last local model "
                        "(no temporal ensembling; e.g. -mu 0.9)")

    def summary(self) -> dict[str, object]:
        return {"lamda": self.hp.lamda, "mu": self.hp.mu, "eval": self.hp.fedphp_eval}

    def eval_params(self, index: int) -> torch.Tensor:
        name = "personalised" if self.hp.fedphp_eval == "local" else "inherited"
        model = self.state.get(name, index)
        return self.global_params if model is None else model
