"""FedProx client (Li et al., MLSys 2020, arXiv:1812.06127).

Client k approximately minimises h_k(w; w_t) = F_k(w) + μ/2 · ‖w − w_t‖² from the received
global model w_t. As in PFLlib's ``PerturbedGradientDescent`` every minibatch step is

    w ← w − η · (∇F_k(w; batch) + μ · (w − w_t)),

i.e. plain SGD on h_k, so the only change from FedAvg is the gradient term in ``adjust_grad``.
μ = 0 is FedAvg step for step. PFLlib's logged train loss adds 0.5·μ·‖w − w_t‖ (unsquared); here
the recorded train loss is the plain cross-entropy of the global model, as for every algorithm.

The step itself is :class:`ProximalClient`'s, which FedAsync's workers share with their own
coefficient (``clientfedasync.py``); it declares no flag, so FedAsync has no ``-mu``.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.protocol import RoundPackage
from flcore.clients.clientfedavg import FedAvgClient
from cli.flags import add_flag


class ProximalClient(FedAvgClient):
    """Local SGD with the proximal gradient c·(w − w_t) towards the model the round started from,
    c = ``proximal_coefficient()``, which each subclass reads from a flag of its own."""

    hooks_draw_no_rng = True  # begin_round returns the global model

    def proximal_coefficient(self) -> float:
        """The weight c of c/2·‖w − w_t‖² (the subclass's flag)."""
        raise NotImplementedError(f"{type(self).__name__} must say which flag sets its proximal coefficient")

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        return {"anchor": package.global_params}

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        coefficient = self.proximal_coefficient()
        if not coefficient:  # FedAvg's step (and no model-sized term computed to add zero)
            return g
        # The anchor is the whole model vector; w covers the trainable prefix only.
        anchor = ctx["anchor"][..., : w.shape[-1]]
        return g + coefficient * (w - anchor)


class FedProxClient(ProximalClient):
    """Local SGD with the proximal gradient μ·(w − w_t)."""
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-mu", "--mu", type=float, default=0.0, low=0,
                 help="FedProx proximal coefficient μ in μ/2·‖w − w_t‖² (PFLlib default 0 = FedAvg; "
                      "paper grid {0.001, 0.01, 0.1, 1})")

    def proximal_coefficient(self) -> float:
        return self.hp.mu
