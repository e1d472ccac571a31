"""FedNTD client: not-true distillation (Lee et al., NeurIPS 2022, arXiv:2106.03097).

The local loss adds a distillation from the received global model restricted to the classes that
are not the sample's true class:

    ℓ = CE(q^l, y) + β · s · KL( q̃_τ^g ‖ q̃_τ^l ),    q̃_τ(c) = softmax_{c ≠ y}(f_c(x) / τ),

q̃ being the softmax over the C − 1 not-true logits only (the true class is removed, not masked),
with the global model's logits as a constant (no gradient); KL is averaged over the minibatch.

* ``s = 1`` by default: the paper's loss. ``--fedntd_tau_squared True`` takes s = τ², the usual
  distillation scaling that the authors' code and PFLlib apply (the two agree at τ = 1).
* β = 0 is FedAvg, and so is any β with 2 classes (one not-true class: q̃ ≡ 1, KL = 0).
  PFLlib's defaults (``-bt 0.0``, ``-tau 1.0``) are kept, so the server warns.

The not-true logits are gathered with an index table built from y (no data-dependent Python
branching), so the batched engine runs the loss.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import RoundPackage
from flcore.flat import Net
from cli.flags import add_flag


def not_true_logits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[B, C] logits without each row's true class: [B, C − 1], the other classes in order."""
    others = torch.arange(logits.shape[-1] - 1, device=logits.device)
    columns = others + (others.unsqueeze(0) >= y.unsqueeze(1)).long()  # skip past the true class
    return logits.gather(-1, columns)


def not_true_distillation(logits: torch.Tensor, teacher_logits: torch.Tensor, y: torch.Tensor,
                          tau: float) -> torch.Tensor:
    """Mean over the batch of KL(q̃_τ^teacher ‖ q̃_τ^student) over the not-true classes."""
    student = F.log_softmax(not_true_logits(logits, y) / tau, dim=-1)
    teacher = F.log_softmax(not_true_logits(teacher_logits, y) / tau, dim=-1)
    return F.kl_div(student, teacher, reduction="batchmean", log_target=True)


class FedNTDClient(Client):
    """Local SGD on cross-entropy plus β times the not-true distillation from the global model."""
    hooks_draw_no_rng = True  # begin_round returns the global model

    vmappable_loss = True

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-bt", "--beta", type=float, default=0.0, low=0,
                 help="FedNTD weight β of the not-true distillation (PFLlib default 0 = FedAvg)")
        add_flag(parser, "-tau", "--tau", type=float, default=1.0, above=0,
                 help="FedNTD distillation temperature τ (PFLlib default 1.0)")
        add_flag(parser, "--fedntd_tau_squared", type=bool, default=False,
                 help="scale the distillation term by τ² (the authors' code, PFLlib); the paper has no factor")

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        return {"global": package.global_params}

    def local_loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        tau = self.hp.tau
        scale = self.hp.beta * (tau * tau if self.hp.fedntd_tau_squared else 1.0)
        logits = net(x)
        if scale == 0:  # β = 0 (PFLlib's default): 0·KL adds nothing, so the global model's forward pass is skipped
            return F.cross_entropy(logits, y)
        distillation = not_true_distillation(logits, net.at(ctx["global"])(x), y, tau)
        return F.cross_entropy(logits, y) + scale * distillation
