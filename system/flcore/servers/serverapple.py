"""APPLE (Luo & Wu, IJCAI 2022, arXiv:2110.08394): PFLlib's ``-algo APPLE``.

The server keeps every client's latest core model (the common initial model before its first
upload) and sends all N of them to each selected client, with the sample shares p0_j = n_j / n
(``extras``; each client's download is N models, counted in ``rs_bytes_down``). The local rule is
in ``clientapple.py``. Clients are evaluated with their personalised models Σ_j p_ij c_j as they
stood after their last training (the initial model before it); there is no global model.

PFLlib trains every client in every round whatever ``-jr`` is (its loop runs ``client.train`` for
all clients); here the selected cohort trains, so ``-jr 1`` reproduces PFLlib's schedule.
"""
from __future__ import annotations

import logging

import torch

from flcore.clients.clientapple import APPLEClient
from flcore.protocol import ClientUpdate, RoundPackage
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from utils.errors import FLError

log = logging.getLogger("fl")


@register_algorithm("APPLE")
class APPLEServer(Server):
    @classmethod
    def population_limit(cls, args):
        return cls.ALL_CLIENTS_LIMIT, "every round sends each selected client every client's core model"

    client_cls = APPLEClient
    personalized = True
    has_global_model = False

    def setup(self) -> None:
        if self.hp.dr_learning_rate < 0 or self.hp.mu < 0 or self.hp.L <= 0:
            raise FLError("APPLE needs -dlr >= 0, -mu >= 0 and -L > 0")
        if self.hp.dr_learning_rate == 0:
            log.warning("warning: APPLE with -dlr 0 (PFLlib's default) never learns the DR vectors: every "
                        "personalised model is the plain mean of the core models; set -dlr")
        if self.hp.apple_core_lr_scale:
            log.warning("warning: APPLE with --apple_core_lr_scale True (PFLlib's N·lr for the core models): with "
                        "parallel clients one round moves the mean of the cores by about lr × local steps × the "
                        "full gradient; it oscillated at PFLlib's own -lr 0.005 on MNIST. PFLlib is stable at this "
                        "rate only because its clients train one after another on shared cores")
        if self.hp.mu == 0:
            log.warning("warning: APPLE with -mu 0 (PFLlib's default) has no proximal pull of the DR vectors "
                        "towards p0 (its λ(t) schedule then does nothing); set -mu")
        counts = torch.tensor([float(c.num_train) for c in self.clients], dtype=torch.float64)
        #: p0_j = n_j / n, the prior the DR vectors are pulled towards
        self.prior = counts / counts.sum()

    def summary(self) -> dict[str, object]:
        return {"dr_learning_rate": self.hp.dr_learning_rate, "mu": self.hp.mu, "L": self.hp.L,
                "core_lr_scale": self.hp.apple_core_lr_scale, "p_grad": self.hp.apple_p_grad}

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        cores = torch.stack([self.core(j) for j in range(len(self.clients))])
        return self.package(rnd, cohort, extras={"apple_cores": cores, "apple_p0": self.prior})

    def core(self, index: int) -> torch.Tensor:
        model = self.state.get("core", index)
        return self.global_params if model is None else model

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        """No global model: each upload is its client's new core model."""
        for update in updates:
            self.state.set("core", update.index, update.params)

    def eval_params(self, index: int) -> torch.Tensor:
        personal = self.state.get("personal", index)
        return self.global_params if personal is None else personal
