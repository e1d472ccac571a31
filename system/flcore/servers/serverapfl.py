"""APFL: adaptive personalised FL (Deng, Kamani, Mahdavi, 2020, arXiv:2003.13461).

Each client i keeps a personal model v_i and a mixing weight α_i; its personalised model is the
mixture v̄_i = α_i v_i + (1 − α_i) w. The global model w is trained and averaged exactly as FedAvg;
the clients' extra work is in ``clientapfl.py``.

Evaluation: client i is evaluated with α_i v_i + (1 − α_i) w, w being the *current* global model
(the w a client holds right after the synchronisation step of the paper's Algorithm 1). PFLlib
instead evaluates the mixture with the client's own pre-aggregation local model; with α = 0
fixed our evaluated model is exactly the global model. The global model's own accuracy is
recorded too (``rs_test_acc_global``).

Every v_i starts as the common initial model and every α_i at ``-al`` (created by the server when
the client is first selected; a client never selected is evaluated with α_0 v_0 + (1 − α_0) w).
"""
from __future__ import annotations

import torch

from flcore.clients.clientapfl import APFLClient
from flcore.protocol import RoundPackage
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from utils.errors import FLError


@register_algorithm("APFL")
class APFLServer(Server):
    client_cls = APFLClient
    personalized = True

    def setup(self) -> None:
        if not 0.0 <= self.hp.alpha <= 1.0:
            raise FLError(f"-al (APFL's initial mixing weight) must be in [0, 1], got {self.hp.alpha}")
        self.initial_params = self.global_params.clone()

    def summary(self) -> dict[str, object]:
        return {"alpha": self.hp.alpha, "adaptive_alpha": self.hp.apfl_adaptive_alpha}

    def initial_alpha(self) -> torch.Tensor:
        return torch.tensor([self.hp.alpha], dtype=torch.float64)

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        for i in cohort:
            self.state.get("personal", i, init=self.initial_params.clone)
            self.state.get("alpha", i, init=self.initial_alpha)
        return super().make_package(rnd, cohort)

    def mixing_weight(self, index: int) -> float:
        alpha = self.state.get("alpha", index)
        return self.hp.alpha if alpha is None else float(alpha[0])

    def eval_params(self, index: int) -> torch.Tensor:
        personal = self.state.get("personal", index)
        personal = self.initial_params if personal is None else personal
        alpha = self.mixing_weight(index)
        return alpha * personal + (1.0 - alpha) * self.global_params
