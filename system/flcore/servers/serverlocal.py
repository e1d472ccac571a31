"""Local training without federation (PFLlib's ``Local``): the no-collaboration baseline.

The global model is only the common initialisation; each client is evaluated with its own
model (the initial model until it has been selected once).
"""
from __future__ import annotations

import torch

from flcore.clients.clientlocal import LocalClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server


@register_algorithm("Local")
class LocalServer(Server):
    client_cls = LocalClient
    personalized = True
    has_global_model = False
    # nothing travels: the common initial model is the run's seed, as for FD and FedProto, so
    # rs_bytes_down is 0 (it counted the whole model every round, though a client reads it only once)
    shared = ()

    def aggregate(self, updates, package) -> None:
        """Nothing is shared, so there is nothing to aggregate."""

    def eval_params(self, index: int) -> torch.Tensor:
        personal = self.state.get("personal", index)
        return self.global_params if personal is None else personal
