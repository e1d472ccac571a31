"""FedRoD client (Chen & Chao, ICLR 2022, arXiv:2107.00778).

The model has a body f, a generic head g (shared) and a personal head p (kept by the client);
the personalised prediction is g(f(x)) + p(f(x)). On each minibatch, from one forward pass:

* body and generic head take a step on the balanced softmax loss (Ren et al., 2020)
  CE(g(f(x)) + log n, y), n = the client's training label counts (a class the client lacks gets
  log 0 = −inf, i.e. no probability mass; its logit gets no gradient);
* the personal head takes a step on the empirical risk CE(stopgrad(g(f(x))) + p(stopgrad(f(x))), y):
  it learns on top of the generic prediction and never changes the body or the generic head.

Both steps use ``-lr``; the sum of the two losses has exactly these gradients, so one SGD step
on it is PFLlib's two optimiser steps (which both use the forward pass taken before either
step). The loss is a pure tensor function of the client's label prior (``begin_round``), so the
batched engine runs it. The recorded training loss is the sum of the two losses.
"""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import RoundPackage
from flcore.flat import Net


class FedRoDClient(Client):
    """Balanced softmax on the generic head, cross-entropy on the personalised prediction."""
    hooks_draw_no_rng = True  # begin_round: the log prior from the label counts

    vmappable_loss: ClassVar[bool] = True

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        # one entry per class of the task (not only the classes this client holds)
        counts = torch.bincount(self.data.train_y, minlength=self.task.num_classes)
        return {"log_prior": counts.to(package.global_params.dtype).log()}

    def local_loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        features = net.features(x)
        generic = net.head(features)
        # Net has no public call for a submodule other than body and head; _call runs
        # ``module.personal_head`` with this net's (possibly vmapped) parameters.
        personal = net.part("personal_head", features.detach())
        balanced = F.cross_entropy(generic + ctx["log_prior"], y)
        return balanced + F.cross_entropy(generic.detach() + personal, y)
