"""FedCross client (Hu et al., ICDE 2024, arXiv:2210.08285): plain local SGD, started from the
middleware model the server assigned to this client this round (its per-client payload)."""
from __future__ import annotations

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import RoundPackage


class FedCrossClient(Client):
    hooks_draw_no_rng = True  # start_point reads the payload

    def start_point(self, package: RoundPackage) -> torch.Tensor:
        return package.payload(self.index)["start"]
