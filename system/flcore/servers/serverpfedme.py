"""pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020, arXiv:2006.08848): server step with β.

The server averages the uploaded local models w_i (sample-weighted over the uploads received, as
PFLlib) and moves the global model part of the way:

    w ← (1 − β) w + β · Σ_i (n_i / n) w_i

β = 1 is plain averaging (FedAvg's server). ``-bt`` defaults to 1.0 here: PFLlib's default 0.0
freezes the global model for ever (every round is then local training from the initial model),
while the paper uses β ∈ [1, 2]. The mix covers float buffers as well (PFLlib mixes parameters
only). Clients are evaluated with their personalised models θ_i (the global model before a
client's first participation); the global model's accuracy is recorded as ``rs_test_acc_global``.
``rs_train_loss`` is the plain cross-entropy of θ_i on the client's training data (PFLlib adds
0.5·λ·‖w_i − θ_i‖, unsquared).
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.clients.clientbase import ClientUpdate, RoundPackage
from flcore.clients.clientpfedme import PFedMeClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from utils.cli import add_flag
from utils.errors import FLError


@register_algorithm("pFedMe")
class PFedMeServer(Server):
    client_cls = PFedMeClient
    personalized = True

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-bt", "--beta", type=float, default=1.0,
                 help="pFedMe: server step β in w ← (1−β)w + β·mean(w_i); 1 = averaging "
                      "(PFLlib's default 0 freezes the global model; paper 1–2)")

    def setup(self) -> None:
        hp = self.hp
        if hp.K < 1 or hp.p_learning_rate <= 0 or hp.lamda < 0 or hp.beta < 0:
            raise FLError("pFedMe needs -K >= 1, -lrp > 0, -lam >= 0 and -bt >= 0")

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        beta = self.hp.beta
        self.global_params = (1 - beta) * package.global_params + beta * weighted_average(updates)

    def eval_params(self, index: int) -> torch.Tensor:
        personal = self.state.get("personal", index)
        return self.global_params if personal is None else personal

    def summary(self) -> dict[str, object]:
        hp = self.hp
        return {"beta": hp.beta, "lamda": hp.lamda, "K": hp.K, "p_learning_rate": hp.p_learning_rate,
                "pfedme_mu": hp.pfedme_mu}
