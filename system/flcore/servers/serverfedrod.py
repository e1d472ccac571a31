"""FedRoD, Federated Robust Decoupling (Chen & Chao, ICLR 2022, arXiv:2107.00778).

Rule: the model is a body f, a generic head g and a personal head p per client. Body and
generic head are trained by every client on a class-balanced loss (the balanced softmax, so each
client optimises an objective that does not depend on its label skew) and averaged by the
server like FedAvg (``shared = ("body.", "head.")``); the personal head is trained on the
client's empirical risk of the personalised prediction g(f(x)) + p(f(x)) without changing f or g
(``clientfedrod.py``) and never leaves the client. Each client is evaluated with the
personalised prediction; the generic model f, g is recorded as ``rs_test_acc_global``.

The server wraps the chosen model (which must be split into ``body`` and ``head``) in
:class:`GenericPersonalModel`, adding ``personal_head``, a copy of the head. In the shared vector
the personal head is all zeros, so that vector *is* the generic model (a zero linear head adds
nothing) and the global accuracy is the generic model's.

Choices and differences:
* The personal head's start (``--fedrod_phead_init``): ``head`` (default, PFLlib) a copy of the
  generic head's initial values, given to a client at its first selection; ``zero`` starts at
  zero, so every personalised model starts as the generic one. The paper does not fix it.
  A client not yet selected is evaluated with the generic model either way (PFLlib would add
  its initial personal head).
* Loss and schedule: the paper's BSM loss, one step of both heads per minibatch from the same
  forward pass (PFLlib's schedule). The paper's other balanced losses and its hypernetwork
  variant of the personal head are not implemented.
* The generic part is averaged weighted by training samples (FedAvg, PFLlib).
"""
from __future__ import annotations

import copy
from argparse import ArgumentParser, Namespace

import torch
from torch import nn

from flcore.protocol import RoundPackage
from flcore.clients.clientfedrod import FedRoDClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from cli.flags import add_flag
from fldata.loading import FederatedDataset
from utils.errors import FLError


class GenericPersonalModel(nn.Module):
    """``body``, generic ``head`` and ``personal_head`` (zero-initialised copy of the head);
    ``forward`` is the personalised prediction head(body(x)) + personal_head(body(x))."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.body = model.body
        self.head = model.head
        self.personal_head = copy.deepcopy(model.head)
        with torch.no_grad():
            for param in self.personal_head.parameters():
                param.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.body(x)
        return self.head(features) + self.personal_head(features)


@register_algorithm("FedROD")
class FedRoDServer(Server):
    client_cls = FedRoDClient
    personalized = True
    shared = ("body.", "head.")

    def __init__(self, args: Namespace, dataset: FederatedDataset, module: nn.Module, device: torch.device):
        if not all(isinstance(getattr(module, part, None), nn.Module) for part in ("body", "head")):
            raise FLError(f"FedROD needs a model split into body and head; {type(module).__name__} is not")
        super().__init__(args, dataset, GenericPersonalModel(module), device)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--fedrod_phead_init", type=str, default="head", choices=["head", "zero"],
                 help="start of each personal head: a copy of the initial generic head (PFLlib) or zero")

    def setup(self) -> None:
        self.personal_init: torch.Tensor | None = None
        if self.hp.fedrod_phead_init == "head":
            # The personal head's entries (the private part) lie in the same order as the head's.
            self.personal_init = self.global_params[self.model.head_mask()].clone()

    def summary(self) -> dict[str, object]:
        return {"fedrod_phead_init": self.hp.fedrod_phead_init}

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        if self.personal_init is not None:
            for i in cohort:
                self.state.get("private", i, init=self.personal_init.clone)
        return super().make_package(rnd, cohort)
