"""FedAMP client (Huang et al., AAAI 2021, arXiv:2007.03797).

Client i approximately solves min_w F_i(w) + λ/(2α_K)·‖w − u_i‖² by minibatch SGD, u_i being the
personalised cloud model from the server; each step is

    squared (paper, default):  w ← w − η (∇F_i(w) + (λ/α_K)(w − u_i))
    norm (PFLlib):             w ← w − η (∇F_i(w) + ½(λ/α_K)(w − u_i)/‖w − u_i‖)

PFLlib adds ``0.5·λ/α_K·torch.norm(w − u)`` (the unsquared norm) to the loss; ``--fedamp_prox
norm`` reproduces it (its gradient at w = u_i is taken as 0, as PyTorch's norm backward does).

Deliberate choice: where local training starts (the paper only states the argmin).
``--fedamp_start u`` (default) starts from u_i, the model the cloud sends, which is how FedACS
(seed 003, §2.3) reads FedAMP ("with a small learning rate W^k = U^k"); ``own`` continues from the
client's own latest model with the proximal pull towards u_i, as PFLlib does (its
``set_parameters`` only replaces the proximal anchor).
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import RoundPackage
from cli.flags import add_flag


class FedAMPClient(Client):
    """SGD with the proximal gradient towards u_i (the server's per-client payload ``u``)."""
    hooks_draw_no_rng = True  # start_point/begin_round read the payload and the state store

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-alk", "--alphaK", type=float, default=1.0, above=0,
                 help="α_K: server step of the attentive message passing (ξ_ij = α_K·exp(−d²/σ)/σ); "
                      "the proximal coefficient is λ/α_K")
        add_flag(parser, "-lam", "--lamda", type=float, default=1.0, low=0,
                 help="λ of the proximal term λ/(2α_K)·‖w − u_i‖²")
        add_flag(parser, "--fedamp_prox", type=str, default="squared", choices=["squared", "norm"],
                 help="proximal term: the paper's squared norm or PFLlib's unsquared norm")
        add_flag(parser, "--fedamp_start", type=str, default="u", choices=["u", "own"],
                 help="local training starts from u_i or from the client's own latest model (PFLlib)")

    def start_point(self, package: RoundPackage) -> torch.Tensor:
        if self.hp.fedamp_start == "u":
            return package.payload(self.index)["u"]
        return self.state.get("latest", self.index, init=lambda: package.global_params.clone())

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        return {"anchor": package.payload(self.index)["u"]}

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        coef = self.hp.lamda / self.hp.alphaK
        diff = w - ctx["anchor"][..., : w.shape[-1]]
        if self.hp.fedamp_prox == "squared":
            return g + coef * diff
        norm = torch.linalg.vector_norm(diff, dim=-1, keepdim=True)
        return g + 0.5 * coef * diff / norm.clamp_min(1e-12)
