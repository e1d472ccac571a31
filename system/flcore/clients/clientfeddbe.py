"""FedDBE client (Zhang, Hua, Cao, Wang, Song, Xue, Ma, Guan, "Eliminating Domain Bias for Federated
Learning in Representation Space", NeurIPS 2023, arXiv:2311.14975): FedAvg + DBE.

DBE splits the representation the head sees into the body's output z and a personalised
representation bias b_i (PRBM), a trainable vector of the feature size kept by the client
(state ``dbe_bias``, zero at first), and adds the mean regularisation (MR) that pulls the client's
running mean of z towards the consensus mean z̄ᵍ fixed by the server before round 0. Every local
step on a minibatch (learning rate η = ``-lr`` for the model and for b_i):

    r ← (1 − m)·r + m·mean_batch(z)          (r = 0 at the start of each round, m = ``-mo``;
                                              the gradient flows through this batch's term only)
    loss = CE(head(z + b_i), y) + κ · mean_k ½ (r_k − z̄ᵍ_k)²     (κ = ``-klw``)

and the model and b_i both take an SGD step; the model is uploaded and averaged as in FedAvg,
b_i never leaves the client. The MR form (½ mean of squares) and the running mean reset each
round are PFLlib's (the authors' code).

Before round 0 the server runs a warm-up (``serverfeddbe.py``): every client trains one round
as FedAvg's client, without b_i and MR, and uploads only r; the trained model is discarded. This
is PFLlib's warm-up (its client.train() before the first round, which also advances ``-ld``'s
decay once). Choices:
* ``-klw`` keeps PFLlib's default 0, which switches MR off (a warning says so; the paper's κ is
  positive);
* ``--dbe_prbm False`` freezes b_i at zero (the paper's "MR only" ablation); with ``-klw 0`` too
  every round is FedAvg's local step exactly;
* b_i's learning rate follows ``-ld``'s decay like the model's (PFLlib never decays it).
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import ClassVar

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, LocalJob, RoundPackage
from flcore.flat import FlatModel
from cli.flags import add_flag


class FedDBEClient(Client):
    """SGD on the model and the representation bias together, with the running-mean regulariser."""

    vectorisable: ClassVar[bool] = False

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-mo", "--momentum", type=float, default=0.1, low=0, high=1,
                 help="m of the running mean r ← (1 − m)·r + m·mean(z) of the representations")
        add_flag(parser, "-klw", "--kl_weight", type=float, default=0.0, low=0,
                 help="κ of the mean regulariser κ·mean(½(r − z̄ᵍ)²) (PFLlib default 0 switches it off)")
        add_flag(parser, "--dbe_prbm", type=bool, default=True,
                 help="learn the personalised representation bias b_i (False: frozen at zero, MR only)")

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        package, lr = job.package, job.lr
        consensus = package.extras.get("dbe_consensus")  # None during the warm-up
        momentum, kappa = self.hp.momentum, self.hp.kl_weight
        net = model.net
        model.load(job.start)
        model.module.train()
        bias = None
        if consensus is not None and self.hp.dbe_prbm:
            bias = self.representation_bias(model).clone().requires_grad_(True)
        running = None
        loss_sum = torch.zeros((), device=model.device)
        for idx in job.plan:
            self.count_gradient_samples(idx)
            model.zero_grad()
            z = net.features(self.data.inputs("train", idx))
            batch_mean = z.mean(0)
            previous = torch.zeros_like(batch_mean) if running is None else running.detach()
            running = (1 - momentum) * previous + momentum * batch_mean
            loss = F.cross_entropy(net.head(z if bias is None else z + bias), self.data.train_y[idx])
            if consensus is not None and kappa != 0:
                loss = loss + kappa * (0.5 * (running - consensus) ** 2).mean()
            if bias is not None:
                bias.grad = None
            loss.backward()
            loss_sum += loss.detach()
            model.params.add_(model.grad, alpha=-lr)
            if bias is not None:
                with torch.no_grad():
                    bias -= lr * bias.grad
        if bias is not None:
            self.state.set("dbe_bias", self.index, bias.detach())
        job.ctx["running_mean"] = running.detach() if running is not None else None
        return model.snapshot(), self.check_loss(loss_sum, len(job.plan), package.round)

    def representation_bias(self, model: FlatModel) -> torch.Tensor:
        features = model.module.head.in_features
        return self.state.get("dbe_bias", self.index,
                              init=lambda: torch.zeros(features, dtype=model.vector.dtype, device=model.device))

    def end_round(self, params, package: RoundPackage, ctx, steps, loss) -> ClientUpdate:
        update = super().end_round(params, package, ctx, steps, loss)
        if "dbe_consensus" not in package.extras and ctx.get("running_mean") is not None:
            update.extras["running_mean"] = ctx["running_mean"]  # the warm-up's only upload
        return update
