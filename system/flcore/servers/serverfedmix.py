"""FedMix (Yoon, Shin, Hwang, Yang, ICLR 2021, arXiv:2107.00233); not in PFLlib. The AdaFL paper
(Table 3) runs it under AdaFL's selection: ``-algo FedMix --select adafl``.

The server is FedAvg's (sample-weighted average of the uploaded models) plus the mean data of
mean augmented FL: every client's first upload carries its mean batches (``clientfedmix.py``),
which the server keeps, with their owners, and sends to the selected clients in the package's
sent-once part (``mean_x``, ``mean_y``, ``mean_owner`` in ``RoundPackage.static``), so a client
mixes with the other clients' means. The paper exchanges the means once, before training, from
every client; here they are collected as clients first take part, so early rounds mix with the
means of the clients seen so far (round 0 with none: FedAvg). The means only grow by rows appended
at the end, so a client's download counts only the rows it does not hold yet.
"""
from __future__ import annotations

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedmix import FedMixClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from utils.errors import FLError


@register_algorithm("FedMix")
class FedMixServer(Server):
    #: what persists across rounds (checkpoints): the clients' mean samples collected so far
    carried = ("means",)

    client_cls = FedMixClient

    def setup(self) -> None:
        if not 0.0 <= self.hp.fedmix_lambda < 1.0:
            raise FLError(f"FedMix needs --fedmix_lambda in [0, 1), got {self.hp.fedmix_lambda}")
        if self.hp.fedmix_mean_size < 1:
            raise FLError(f"FedMix needs --fedmix_mean_size >= 1, got {self.hp.fedmix_mean_size}")
        self.means: dict[str, torch.Tensor] = {}

    def summary(self) -> dict[str, object]:
        hp = self.hp
        return {"lambda": hp.fedmix_lambda, "mean_size": hp.fedmix_mean_size, "variant": hp.fedmix_variant}

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        return self.package(rnd, cohort, static=dict(self.means))

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        self.global_params = weighted_average(updates)
        for update in updates:
            if "mean_x" not in update.extras:
                continue
            x, y = update.extras["mean_x"], update.extras["mean_y"]
            owner = torch.full((len(x),), update.index, dtype=torch.long, device=x.device)
            for name, part in (("mean_x", x), ("mean_y", y), ("mean_owner", owner)):
                self.means[name] = part if name not in self.means else torch.cat([self.means[name], part])
