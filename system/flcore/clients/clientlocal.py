"""Local-only training: each client trains its own model and never communicates.

The lower baseline of personalised FL (PFLlib's ``Local``): every client starts from the same
initial model and continues from its own previous model each time it is selected.
"""
from __future__ import annotations

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, RoundPackage


class LocalClient(Client):
    """Keeps its model as per-client state ``personal``; uploads nothing."""
    uploads_instead = "nothing"
    hooks_draw_no_rng = True  # start_point/end_round read and write the state store

    def personal_model(self, package: RoundPackage) -> torch.Tensor:
        return self.state.get("personal", self.index, init=lambda: package.global_params.clone())

    def start_point(self, package: RoundPackage) -> torch.Tensor:
        return self.personal_model(package)

    def end_round(self, params, package, ctx, steps, loss) -> ClientUpdate:
        self.state.set("personal", self.index, params)
        return ClientUpdate(self.index, self.num_train, steps, params, loss, uploads_params=False)
