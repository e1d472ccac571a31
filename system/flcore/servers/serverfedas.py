"""FedAS (Yang, Huang, Ye, CVPR 2024): PFLlib's ``-algo FedAS``.

Client synchronisation: the server averages the uploaded bodies weighted by the clients' Fisher
information traces, w = Σ_k (F_k / Σ_j F_j) w_k (sample weights if every trace is 0); the heads
stay with the clients (``shared = "body"``; PFLlib uploads and averages the heads too but no
client ever loads the averaged head). The client's side (parameter alignment, the trace) is in
``clientfedas.py``. Each client is evaluated with its personal model (its last trained model),
the initial model before its first participation, as in PFLlib; there is no meaningful global
model (its head is the initial one).
"""
from __future__ import annotations

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedas import FedASClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from utils.errors import FLError


@register_algorithm("FedAS")
class FedASServer(Server):
    client_cls = FedASClient
    personalized = True
    has_global_model = False
    shared = "body"

    def setup(self) -> None:
        if self.hp.fedas_align_epochs < 0 or self.hp.fedas_align_batch < 1 or self.hp.fedas_align_lr < 0:
            raise FLError("FedAS needs --fedas_align_epochs >= 0, --fedas_align_batch >= 1 and --fedas_align_lr >= 0")
        self.initial_params = self.global_params.clone()

    def summary(self) -> dict[str, object]:
        return {"align_epochs": self.hp.fedas_align_epochs, "align_batch": self.hp.fedas_align_batch,
                "align_lr": self.hp.fedas_align_lr}

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        traces = [float(u.extras["fisher_trace"]) for u in updates]
        total = sum(traces)
        self.global_params = weighted_average(updates, [t / total for t in traces] if total > 0 else None)
        self.history.add_series("fedas_fisher_trace", total / len(traces))

    def eval_params(self, index: int) -> torch.Tensor:
        personal = self.state.get("personal", index)
        return self.initial_params if personal is None else personal
