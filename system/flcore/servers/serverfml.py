"""FML: federated mutual learning (Shen, Ye, Yu, Jiang, Wu, Zhu, Liu, 2020, arXiv:2006.16765).

The meme model is the global model: the server averages the clients' trained meme models (sample-
weighted, FedAvg's rule and the paper's; ``--fml_weighting uniform`` is PFLlib's plain mean) and
sends it back. Each client's personal model never leaves it (``clientfml.py``); it starts as
the common initial model, whenever the client is first selected (as PFLlib's and ``Local``). Clients are
evaluated with their personal models (the recorded accuracy); the meme model is a global model
too, recorded as ``rs_test_acc_global``. With α = β = 1 neither model learns from the other: the
meme model is FedAvg's and each personal model is Local's.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfml import FMLClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from cli.flags import add_flag
from utils.errors import FLError


@register_algorithm("FML")
class FMLServer(Server):
    client_cls = FMLClient
    personalized = True

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--fml_weighting", type=str, default="samples", choices=["samples", "uniform"],
                 help="FML's average of the meme models: by samples (paper, FedAvg) or plain (PFLlib)")

    def setup(self) -> None:
        for flag, value in (("-al", self.hp.alpha), ("-bt", self.hp.beta)):
            if not 0.0 <= value <= 1.0:
                raise FLError(f"FML needs {flag} in [0, 1], got {value}")
        if self.hp.fml_clip < 0:
            raise FLError(f"--fml_clip must be >= 0 (0: no clipping), got {self.hp.fml_clip}")
        self.initial_params = self.global_params.clone()

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        # a personal model starts as the common initial model (PFLlib, Local), whenever the client
        # is first selected
        for i in cohort:
            self.state.get("personal", i, init=self.initial_params.clone)
        return super().make_package(rnd, cohort)

    def summary(self) -> dict[str, object]:
        hp = self.hp
        return {"alpha": hp.alpha, "beta": hp.beta, "kl": hp.fml_kl, "clip": hp.fml_clip, "weighting": hp.fml_weighting}

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        uniform = [1 / len(updates)] * len(updates) if self.hp.fml_weighting == "uniform" else None
        self.global_params = weighted_average(updates, uniform)

    def eval_params(self, index: int) -> torch.Tensor:
        personal = self.state.get("personal", index)
        return self.initial_params if personal is None else personal
