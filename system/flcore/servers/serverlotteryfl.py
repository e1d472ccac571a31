"""LotteryFL (Li, Sun, Wang, Duan, Li, Chen, Li, 2020, arXiv:2008.03371): the server.

Each selected client k receives the global model on the entries it last uploaded (its kept set,
the whole model before its first upload; the server's state ``support``) and applies its own mask
(``clientlotteryfl.py``); the server averages each entry over the clients that uploaded it
(sample-weighted; entries nobody kept keep their value). Only the tickets travel: ``rs_bytes_up``
and ``rs_bytes_down`` count their values plus index bytes. Clients are evaluated with their own
tickets; the aggregate is reported as the global model. With ``-kf 1`` this is FedAvg exactly.
"""
from __future__ import annotations

import torch

from flcore.protocol import RoundPackage
from flcore.clients.clientlotteryfl import LotteryFLClient
from flcore.common.sparsemask import encode
from flcore.registry import register_algorithm
from flcore.servers.serversparse import SparseExchangeServer
from utils.errors import FLError


@register_algorithm("LotteryFL")
class LotteryFLServer(SparseExchangeServer):
    client_cls = LotteryFLClient

    def setup(self) -> None:
        super().setup()
        if not 0.0 <= self.hp.prune_rate <= 1.0:
            raise FLError(f"--prune_rate must be in [0, 1], got {self.hp.prune_rate}")

    def summary(self) -> dict[str, object]:
        return {**super().summary(), "prune_rate": self.hp.prune_rate, "acc_threshold": self.hp.acc_threshold}

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        everything = torch.ones(self.global_params.numel(), dtype=torch.bool, device=self.global_params.device)
        messages = {}
        for i in cohort:
            support = self.state.get("support", i)
            messages[i] = encode(self.global_params, everything if support is None else support)
        return self.sparse_package(rnd, cohort, messages)

    def received(self, index: int, sent: torch.Tensor, values: torch.Tensor) -> None:
        self.state.set("support", index, sent)
