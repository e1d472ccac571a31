"""PFL-DA (Zhang, Kontar et al., Technometrics 2023), PFLlib's ``-algo PFL-DA``.

The server averages the uploaded global heads (sample-weighted) and keeps nothing else: each
client's body and personal head never leave it (``shared = "head"``; ``clientpflda.py`` has the
local rule). A client is evaluated with its body and its personal head; a client never selected
with the initial model. There is no global model to report (the body is per client). A model
whose body has no parameters shares everything: the global part is then FedAvg's model.

Because the personal head is trained with the body frozen, the global head and the bodies evolve
exactly as under LG-FedAvg with the same flags; PFL-DA's personal heads come on top.
"""
from __future__ import annotations

import logging

import torch

from flcore.protocol import with_private_part
from flcore.clients.clientpflda import PFLDAClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from utils.errors import FLError

log = logging.getLogger("fl")


@register_algorithm("PFL-DA")
class PFLDAServer(Server):
    client_cls = PFLDAClient
    personalized = True
    has_global_model = False
    shared = "head"

    def setup(self) -> None:
        if self.hp.lamda < 0:
            raise FLError(f"-lam must be >= 0, got {self.hp.lamda}")
        self.initial_params = self.global_params.clone()
        self.head = self.model.head_mask()
        if self.hp.pflda_penalty == "none" or self.hp.lamda == 0:
            log.warning("warning: PFL-DA without a regulariser (-lam 0 or --pflda_penalty none) trains the "
                        "personal heads on local data only")

    def summary(self) -> dict[str, object]:
        return {"lamda": self.hp.lamda, "penalty": self.hp.pflda_penalty}

    def eval_params(self, index: int) -> torch.Tensor:
        personal_head = self.state.get("personal_head", index)
        if personal_head is None:
            return self.initial_params
        model = with_private_part(self.global_params, self.shared_mask, self.state.get("private", index))
        model = model.clone()
        model[self.head] = personal_head.to(model.dtype)
        return model
