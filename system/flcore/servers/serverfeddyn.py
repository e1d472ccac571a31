"""FedDyn (Acar, Zhao, Navarro, Mattina, Whatmough, Saligrama, ICLR 2021, arXiv:2111.04263).

The server keeps a state h (zero at start, over the trainable parameters). With P_t the uploads
received in round t, N the number of clients and θ^{t−1} the model sent,

    h ← h − α · (1/N) · Σ_{k∈P_t} (θ_k^t − θ^{t−1}),      θ^t = (1/|P_t|) Σ_{k∈P_t} θ_k^t − h/α,

and θ^t is what the clients receive next (the paper's Algorithm 1). The clients' side is in
``clientfeddyn.py``. Differences and choices:

* The mean of the uploads is uniform over the uploads received (paper). PFLlib divides by the
  planned cohort size even when uploads are dropped (``-cdr``), which shrinks the mean.
* Float buffers (BatchNorm statistics) have no FedDyn state: they take the plain uniform mean
  (PFLlib keeps the first upload's).
* α = 0 leaves h at zero and the clients' steps plain SGD, so θ^t is the uniform mean of the
  uploads (h/α is taken as 0): FedAvg with uniform weights, with a warning. PFLlib's default
  ``-al 1.0`` is kept; the paper tunes α in {0.1, 0.01, 0.001}.
* PFLlib's unsquared regulariser is ``--feddyn_norm unsquared`` (see the client).
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfeddyn import FedDynClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from utils.errors import FLError

log = logging.getLogger("fl")


@register_algorithm("FedDyn")
class FedDynServer(Server):
    #: what persists across rounds (checkpoints): the server's state h (the clients' accumulated drift)
    carried = ("h",)

    client_cls = FedDynClient

    def setup(self) -> None:
        alpha = self.hp.alpha
        if alpha < 0:
            raise FLError(f"FedDyn needs -al (α) >= 0, got {alpha}")
        if alpha == 0:
            log.warning("warning: FedDyn with -al 0 has no dynamic regulariser: FedAvg with a uniform mean")
        self.h = torch.zeros_like(self.global_params[: self.model.num_params])

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        n, alpha = self.model.num_params, self.hp.alpha
        sent = package.global_params[:n]
        drift = torch.zeros_like(self.h)
        for update in updates:
            drift.add_(update.params[:n] - sent)
        # a new tensor: nothing that holds the old h is modified
        self.h = self.h - (alpha / len(self.clients)) * drift
        model = weighted_average(updates, np.full(len(updates), 1 / len(updates)))
        if alpha > 0:
            model[:n] -= self.h / alpha
        self.global_params = model

    def summary(self) -> dict[str, object]:
        return {"alpha": self.hp.alpha, "feddyn_norm": self.hp.feddyn_norm}
