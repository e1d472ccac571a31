"""Ditto client (Li, Hu, Beirami, Smith, ICML 2021, arXiv:2012.04221).

In each round a selected client, holding the received global model w^t, does (PFLlib's order,
which is the paper's: the personal step is taken against the *received* global model)

1. personal: ``-pls`` epochs of minibatch SGD on v_i for F_i(v) + λ/2·‖v − w^t‖², i.e. each step
   v ← v − η (∇F_i(v) + λ (v − w^t)), from its previous v_i (the common initial model the first
   time, created by the server);
2. global: FedAvg's local training, ``-ls`` epochs from w^t; the result is uploaded.

Both use the learning rate η = ``-lr`` (PFLlib) and each phase starts from the same
(seed, round, client) streams, so the personal phase with λ = 0 and ``-pls`` = ``-ls`` is Local
training step for step and the global phase is FedAvg's. Slow trainers (``-tsr``) shorten only the
global phase. The per-client personal model is the state ``personal``.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import ClassVar

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import LocalJob
from flcore.flat import FlatModel
from cli.flags import add_flag


class DittoClient(Client):
    """Two SGD runs per round: the personal model (proximal to w^t) and the global model."""

    vectorisable: ClassVar[bool] = False
    steps_through_sgd = True  # its own train_job trains through the base sgd (--local_momentum reaches it)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-mu", "--mu", type=float, default=0.0, low=0,
                 help="λ of the personal objective F_i(v) + λ/2·‖v − w‖² "
                      "(PFLlib default 0 = Local personal models)")
        add_flag(parser, "-pls", "--plocal_epochs", type=int, default=1, low=1, help="local epochs of the personal model")

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        return g + ctx["mu"] * (w - ctx["anchor"][..., : w.shape[-1]])

    def expected_gradient_samples(self) -> float:
        """The personal epochs come on top of the global ones."""
        return float((self.local_epochs + self.hp.plocal_epochs) * self.steps_per_epoch * self.batch_size)

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        package, rnd, lr = job.package, job.package.round, job.lr
        anchor = package.global_params
        personal = self.state.get("personal", self.index)  # created by the server (initial model)
        mu = torch.tensor(self.hp.mu, dtype=anchor.dtype, device=anchor.device)

        self.seed_round(rnd)
        model.load(personal)
        self.sgd(model, package, {"anchor": anchor, "mu": mu}, self.batch_plan(rnd, self.hp.plocal_epochs), lr)
        self.state.set("personal", self.index, model.vector)

        self.seed_round(rnd)
        model.load(anchor)
        loss = self.sgd(model, package, {"anchor": anchor, "mu": torch.zeros_like(mu)}, job.plan, lr)
        return model.snapshot(), loss
