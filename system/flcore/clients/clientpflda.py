"""PFL-DA client (Zhang, Kontar et al., "Personalized Federated Learning via Domain Adaptation with
an Application to Distributed 3D Printing", Technometrics 2023), as PFLlib implements it.

Each client holds a body (feature extractor, never uploaded), a personal head h_i and the global
head h_g it received. One round, with learning rate η = ``-lr`` and the same minibatch plan for
both phases:

1. personal head (body frozen): E epochs of SGD on h_i for CE(h_i(body(x)), y) + R(h_i − h_g);
2. global part (personal head untouched): E epochs of FedAvg's SGD on (body, h_g) for
   CE(h_g(body(x)), y); the new h_g is uploaded, the body stays.

Phase 2 is LG-FedAvg's local step exactly (phase 1 moves only h_i), so the body and the global
head follow LG-FedAvg; what PFL-DA adds is the personal head, regularised towards the global
one, and the client is evaluated with (body, h_i).

``--pflda_penalty`` chooses R (λ = ``-lam``):

* ``norm`` (default): λ·‖h_i − h_g‖, the unsquared norm PFLlib writes in its loss. Its gradient
  is λ(h_i − h_g)/‖h_i − h_g‖, taken as 0 where h_i = h_g (PyTorch's norm backward does so).
* ``squared``: λ/2·‖h_i − h_g‖², a proximal term of the usual form.
* ``none``: no gradient from R, which is what PFLlib's code trains: it builds both heads'
  vectors from ``.data``, so its penalty adds a constant to the loss and nothing to the gradient.

The personal head of a client's first participation starts as the global head it receives
(PFLlib starts it as the common initial head: the same in round 0, older afterwards). Only the
global head is uploaded (``Server.shared = "head"``); the personal head is the state
``personal_head`` and the body the protocol's private part.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import ClassVar

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import LocalJob
from flcore.clients.clientfedrep import head_parameters
from flcore.flat import FlatModel
from cli.flags import add_flag


def penalty_gradient(diff: torch.Tensor, lam: float, kind: str) -> torch.Tensor:
    """∇ of R at h_i − h_g = ``diff`` (zero outside the head) for ``--pflda_penalty kind``."""
    if kind == "squared":
        return lam * diff
    if kind == "norm":
        return lam * diff / torch.linalg.vector_norm(diff, dim=-1, keepdim=True).clamp_min(1e-12)
    return torch.zeros_like(diff)


class PFLDAClient(Client):
    """Two SGD phases a round: the personal head (body frozen), then LG-FedAvg's step."""

    vectorisable: ClassVar[bool] = False
    steps_through_sgd = True  # its own train_job trains through the base sgd (--local_momentum reaches it)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-lam", "--lamda", type=float, default=1.0, low=0,
                 help="λ of the personal head's regulariser R towards the global head")
        add_flag(parser, "--pflda_penalty", type=str, default="norm", choices=["norm", "squared", "none"],
                 help="R: λ‖h_i − h_g‖ (PFLlib's written term), λ/2‖h_i − h_g‖², or none (what PFLlib's "
                      "code trains: its term has no gradient)")

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        """Phase 1: only the head moves, pulled towards the global head; phase 2: FedAvg's step."""
        if "head" not in ctx:
            return g
        head = ctx["head"]
        diff = (w - ctx["global"][..., : w.shape[-1]]) * head
        return (g + penalty_gradient(diff, self.hp.lamda, self.hp.pflda_penalty)) * head

    def gradient_inputs(self, model: FlatModel, ctx: dict) -> list[torch.Tensor] | None:
        """Phase 1 moves only the personal head (``adjust_grad`` masks the rest), so its backward pass
        stops at the head instead of running on through the frozen body: the same head gradient, by
        the same operations; phase 2 takes every gradient."""
        return head_parameters(model) if "head" in ctx else None

    def expected_gradient_samples(self) -> float:
        """Both phases pass over the plan."""
        return 2.0 * super().expected_gradient_samples()

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        package, plan, lr = job.package, job.plan, job.lr
        head = model.head_mask()
        start = job.start  # this client's body and the global head
        personal_head = self.state.get("personal_head", self.index)
        personal = start.clone()
        if personal_head is not None:
            personal[head] = personal_head.to(start.dtype)
        trainable_head = head[: model.num_params].to(start.dtype)
        model.load(personal)
        self.sgd(model, package, {"head": trainable_head, "global": start}, plan, lr)
        self.state.set("personal_head", self.index, model.vector[head])
        # phase 2 continues from phase 1's body (unchanged but for BatchNorm statistics) with h_g
        second = model.snapshot()
        second[head] = start[head]
        model.load(second)
        loss = self.sgd(model, package, {}, plan, lr)
        return model.snapshot(), loss
