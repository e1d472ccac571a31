"""FedProx client (Li et al., MLSys 2020, arXiv:1812.06127).

Client k approximately minimises h_k(w; w_t) = F_k(w) + μ/2 · ‖w − w_t‖² from the received
global model w_t. As in PFLlib's ``PerturbedGradientDescent`` every minibatch step is

    w ← w − η · (∇F_k(w; batch) + μ · (w − w_t)),

i.e. plain SGD on h_k, so the only change from FedAvg is the gradient term in ``adjust_grad``.
μ = 0 is FedAvg step for step. PFLlib's logged train loss adds 0.5·μ·‖w − w_t‖ (unsquared); here
the recorded train loss is the plain cross-entropy of the global model, as for every algorithm.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.clients.clientbase import RoundPackage
from flcore.clients.clientfedavg import FedAvgClient
from utils.cli import add_flag


class FedProxClient(FedAvgClient):
    """Local SGD with the proximal gradient μ·(w − w_t)."""

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-mu", "--mu", type=float, default=0.0, low=0,
                 help="FedProx proximal coefficient μ in μ/2·‖w − w_t‖² (PFLlib default 0 = FedAvg; "
                      "paper grid {0.001, 0.01, 0.1, 1})")

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        return {"anchor": package.global_params}

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        # The anchor is the whole model vector; w covers the trainable prefix only.
        anchor = ctx["anchor"][..., : w.shape[-1]]
        return g + self.hp.mu * (w - anchor)
