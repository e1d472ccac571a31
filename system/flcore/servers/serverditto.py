"""Ditto (Li, Hu, Beirami, Smith, ICML 2021, arXiv:2012.04221).

The global model w is trained exactly as FedAvg (same local SGD, same sample-weighted average);
each selected client also updates its personal model v_i against the global model it received
(``clientditto.py``). Clients are evaluated with v_i (Ditto-P); the global model's accuracy is
recorded too (Ditto-G, ``rs_test_acc_global``). Every v_i starts as the common initial model
(PFLlib's ``pmodel``, the paper's v_i^0), so a client never selected is evaluated with it.

``-mu`` (λ) keeps PFLlib's default 0 for command-line compatibility, as FedProx does here; with
λ = 0 the personal models are Local training, so a warning says so. The paper tunes λ per data
set; pass a positive ``-mu`` (e.g. 0.1) for Ditto proper.
"""
from __future__ import annotations

import logging

import torch

from flcore.protocol import RoundPackage
from flcore.clients.clientditto import DittoClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from utils.errors import FLError

log = logging.getLogger("fl")


@register_algorithm("Ditto")
class DittoServer(Server):
    client_cls = DittoClient
    personalized = True

    def setup(self) -> None:
        if self.hp.plocal_epochs < 1:
            raise FLError(f"-pls must be >= 1, got {self.hp.plocal_epochs}")
        self.initial_params = self.global_params.clone()
        if self.hp.mu == 0.0:
            log.warning("warning: Ditto with -mu 0 (PFLlib's default) trains the personal models as Local; "
                        "set -mu, e.g. 0.1")

    def summary(self) -> dict[str, object]:
        return {"mu": self.hp.mu, "plocal_epochs": self.hp.plocal_epochs}

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        """A client's personal model starts as the common initial model (PFLlib, the paper's v_i^0)."""
        for i in cohort:
            self.state.get("personal", i, init=self.initial_params.clone)
        return super().make_package(rnd, cohort)

    def eval_params(self, index: int) -> torch.Tensor:
        personal = self.state.get("personal", index)
        return self.initial_params if personal is None else personal
