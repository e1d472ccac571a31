"""FedMTL client (Smith, Chiang, Sanjabi, Talwalkar, "Federated Multi-Task Learning", NeurIPS 2017,
arXiv:1705.10467), PFLlib's SGD variant rather than MOCHA's dual method.

The paper's objective over the stacked models W = [w_1 … w_m] is Σ_t ℓ_t(w_t) + R(W) with
R(W) = λ₁ tr(W Ω Wᵀ) + λ₂ ‖W‖_F². With the mean-regularised task relationship Ω = (I − 11ᵀ/m)²
(the Ω PFLlib builds; I − 11ᵀ/m is idempotent) tr(W Ω Wᵀ) = Σ_s ‖w_s − w̄‖², and since
Σ_s (w_s − w̄) = 0 its gradient in w_t is 2(w_t − w̄). Client t, holding its personal model and
the sum O_t of the other pooled models (its payload ``others``, fixed during the round), takes
local SGD steps

    w_t ← w_t − η (∇ℓ_t(w_t) + 2λ₁ (w_t − w̄) + 2λ₂ w_t),   w̄ = (w_t + O_t)/m,

and uploads w_t; the personal model is the state ``personal`` (the common initial model before
the first participation). With λ₁ = λ₂ = 0 this is Local training step for step.

PFLlib departs from the paper in ways that switch the method off, so none is reproduced:
its regulariser is built from ``state_dict()`` (detached), so it adds no gradient and PFLlib's
FedMTL trains exactly as Local; it multiplies W by the scalar Ω[0][0]^½ instead of the matrix
(‖W‖² + (1 − 1/m)²‖Σ_s w_s‖² rather than tr(WΩWᵀ)); and it scales by 10^−(digits of d + 1).
``-itk`` (PFLlib's iterations of the quadratic subproblem) is accepted and unused, as in PFLlib,
whose loop over it is commented out. Float buffers (BatchNorm statistics) are not regularised.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, RoundPackage
from cli.flags import add_flag


class FedMTLClient(Client):
    """Local SGD on the personal model with the gradient of the multi-task regulariser."""
    hooks_draw_no_rng = True  # start_point/begin_round/end_round read and write the state store and payload

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-itk", "--itk", type=int, default=4000, low=0,
                 help="PFLlib's iterations of MOCHA's quadratic subproblem: accepted, unused (as in PFLlib)")
        add_flag(parser, "--fedmtl_lambda_mean", type=float, default=0.05, low=0,
                 help="λ₁ of λ₁·tr(WΩWᵀ) = λ₁·Σ_s‖w_s − w̄‖², Ω = (I − 11ᵀ/m)² (0 with λ₂ = 0: Local)")
        add_flag(parser, "--fedmtl_lambda_norm", type=float, default=0.0, low=0,
                 help="λ₂ of λ₂·‖W‖_F² (weight decay of every personal model)")

    def start_point(self, package: RoundPackage) -> torch.Tensor:
        return self.state.get("personal", self.index, init=lambda: package.global_params.clone())

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        payload = package.payload(self.index)
        anchor = package.global_params
        return {"others": payload["others"],
                "pool_size": torch.tensor(float(payload["pool_size"]), dtype=anchor.dtype, device=anchor.device)}

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        mean = (w + ctx["others"][..., : w.shape[-1]]) / ctx["pool_size"]
        return g + 2.0 * self.hp.fedmtl_lambda_mean * (w - mean) + 2.0 * self.hp.fedmtl_lambda_norm * w

    def end_round(self, params, package, ctx, steps, loss) -> ClientUpdate:
        self.state.set("personal", self.index, params)
        return super().end_round(params, package, ctx, steps, loss)
