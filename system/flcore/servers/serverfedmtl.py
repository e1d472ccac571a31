"""FedMTL (Smith et al., NeurIPS 2017, arXiv:1705.10467): PFLlib's ``-algo FedMTL``.

The server keeps each client's latest uploaded model (the common initial model before its first
upload) and sends each selected client t the sum of the other pooled models, O_t = Σ_{s≠t} w_s,
and the pool size m, which is all the gradient of R(W) in w_t needs (``clientfedmtl.py``). There is
no global model: each client is evaluated with its personal model.

``--fedmtl_pool`` chooses the stacked W:
* ``cohort`` (default, PFLlib): the selected clients' models, m = cohort size;
* ``all``: every client's latest model, the paper's W over all m tasks (the two agree under full
  participation).
A client's payload is one model-sized vector, like FedAMP's, counted in ``rs_bytes_down``.
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedmtl import FedMTLClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from cli.flags import add_flag
from utils.errors import FLError

log = logging.getLogger("fl")


@register_algorithm("FedMTL")
class FedMTLServer(Server):
    client_cls = FedMTLClient
    personalized = True
    has_global_model = False

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--fedmtl_pool", type=str, default="cohort", choices=["cohort", "all"],
                 help="models stacked in W: the selected clients' (PFLlib) or every client's latest (paper)")

    def setup(self) -> None:
        if self.hp.fedmtl_lambda_mean < 0 or self.hp.fedmtl_lambda_norm < 0:
            raise FLError("--fedmtl_lambda_mean and --fedmtl_lambda_norm must be >= 0")
        if self.hp.fedmtl_lambda_mean == 0 and self.hp.fedmtl_lambda_norm == 0:
            log.warning("warning: FedMTL with a zero regulariser trains every client as Local")

    def summary(self) -> dict[str, object]:
        return {"lambda_mean": self.hp.fedmtl_lambda_mean, "lambda_norm": self.hp.fedmtl_lambda_norm,
                "pool": self.hp.fedmtl_pool}

    def latest(self, index: int) -> torch.Tensor:
        model = self.state.get("latest", index)
        return self.global_params if model is None else model

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        pool = cohort if self.hp.fedmtl_pool == "cohort" else range(len(self.clients))
        total = torch.zeros_like(self.global_params, dtype=torch.float64)
        for j in pool:
            total += self.latest(j)
        size = torch.tensor(float(len(pool)))
        payloads = {i: {"others": (total - self.latest(i)).to(self.global_params.dtype), "pool_size": size}
                    for i in cohort}
        return self.package(rnd, cohort, payloads=payloads)

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        """No global model: remember each upload as its client's latest model."""
        for update in updates:
            self.state.set("latest", update.index, update.params)

    def eval_params(self, index: int) -> torch.Tensor:
        personal = self.state.get("personal", index)
        return self.global_params if personal is None else personal
