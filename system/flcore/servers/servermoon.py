"""MOON (Li, He, Song, CVPR 2021, arXiv:2103.16257): the server is FedAvg's.

Only the client differs (the model-contrastive term, ``clientmoon.py``); the server averages the
uploads by samples, as the paper and PFLlib do. PFLlib's defaults are kept for command-line
compatibility: ``-mu 0`` makes MOON FedAvg (a warning says so; the paper uses μ ∈ {0.1, 1, 5, 10})
and ``-tau 1.0`` (the paper uses τ = 0.5). With ``--moon_first_previous initial`` (PFLlib's
reading) every client's previous model starts as the common initial model, created here when the
client is first selected.
"""
from __future__ import annotations

import logging

from flcore.protocol import RoundPackage
from flcore.clients.clientmoon import MoonClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from utils.errors import FLError

log = logging.getLogger("fl")


@register_algorithm("MOON")
class MoonServer(Server):
    client_cls = MoonClient

    def setup(self) -> None:
        if self.hp.tau <= 0:
            raise FLError(f"MOON needs a temperature -tau > 0, got {self.hp.tau}")
        if self.hp.mu == 0.0:
            log.warning("warning: MOON with -mu 0 (PFLlib's default) is FedAvg; set -mu, e.g. 1 (paper: 0.1-10)")
        initial = self.hp.moon_first_previous == "initial" and self.hp.mu > 0.0  # μ = 0 never reads it
        self.initial_params = self.global_params.clone() if initial else None

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        if self.initial_params is not None:
            for i in cohort:
                self.state.get("previous", i, init=self.initial_params.clone)
        return super().make_package(rnd, cohort)

    def summary(self) -> dict[str, object]:
        return {"mu": self.hp.mu, "tau": self.hp.tau,
                "moon_first_previous": self.hp.moon_first_previous}
