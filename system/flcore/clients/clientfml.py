"""FML client: federated mutual learning (Shen et al., 2020, arXiv:2006.16765).

Each client trains two models of the same architecture side by side on the same minibatches: its
personal model (never shared, the state ``personal``, which the server starts as the common initial
model) and the meme model (received from the server, trained, uploaded). With p_l and p_m
their softmax outputs, each step descends, for the two models at once (deep mutual learning),

    L_local = α · CE(p_l, y) + (1 − α) · KL(p_m ‖ p_l)
    L_meme  = β · CE(p_m, y) + (1 − β) · KL(p_l ‖ p_m)

with the other model's prediction a constant in each loss (as in deep mutual learning), both by
SGD at the client's learning rate. Deliberate choices, where paper and PFLlib differ:

* ``-al``/``-bt`` default to the paper's 0.5 each; PFLlib's defaults (α = 1, β = 0) make the
  personal model plain local training and the meme model a pure distillation of it.
* ``--fml_kl batchmean`` (default) is the paper's KL (summed over classes, averaged over the
  batch); ``mean`` is PFLlib's ``nn.KLDivLoss()``, which also divides by the number of classes.
* ``--fml_clip`` clips each model's gradient to this L2 norm (0, the default, does not clip; PFLlib
  clips both at 10). PFLlib also lets each KL term's gradient reach the other model (its targets
  are not detached); here they do not.

Two models are trained per step, so a client computes twice FedAvg's gradients; the procedure
is not SGD on one model, so this client runs its own ``train_job`` (the engines train it
sequentially). The personal model is a functional view of its own vector, BatchNorm statistics
included.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import Iterator

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, LocalJob, RoundPackage
from flcore.flat import FlatModel, Net
from cli.flags import add_flag


def kl_divergence(log_q: torch.Tensor, target: torch.Tensor, reduction: str) -> torch.Tensor:
    """KL(target ‖ q) for ``log_q`` = log-probabilities and ``target`` probabilities (a constant),
    averaged over the batch, and over the classes too with ``reduction="mean"`` (PFLlib)."""
    kl = F.kl_div(log_q, target.detach(), reduction="batchmean")
    return kl / log_q.shape[1] if reduction == "mean" else kl


def paired_batches(client: Client, job: LocalJob, model: FlatModel, vector: torch.Tensor
                   ) -> Iterator[tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], Net]]:
    """The minibatches of a job that trains two models side by side: the working ``model`` from the
    job's start point, and a second one held in ``vector``. Per step: (x, y, fresh leaves of
    ``vector``'s parameters, one per parameter, the second model as a :class:`Net` of them); the
    working model's gradient is zeroed and both models' samples are counted. The second model's
    float buffers are views of ``vector`` itself, so a BatchNorm layer updates that model's own
    statistics. (One leaf per parameter, not views of one flat leaf: the backward of each view
    wrote its gradient into a zero-filled copy of the whole vector, 11% of an FML round.)"""
    model.load(job.start)
    model.module.train()
    n = model.num_params
    for idx in job.plan:
        client.count_gradient_samples(idx)
        client.count_gradient_samples(idx)
        model.zero_grad()
        params = vector[:n].clone()
        leaves, named = [], {}
        for seg in model.segments:
            if seg.is_param:
                leaves.append(params[seg.start : seg.stop].view(seg.shape).detach().requires_grad_(True))
                named[seg.name] = leaves[-1]
            else:
                named[seg.name] = vector[seg.start : seg.stop].view(seg.shape)
        yield client.data.inputs("train", idx), client.data.train_y[idx], leaves, Net(model.module, model, named)


def flat_gradient(loss: torch.Tensor, leaves: list[torch.Tensor], *others: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The gradient of ``loss`` for the ``leaves`` of :func:`paired_batches` as one flat vector (zero
    for a parameter the loss does not reach), then its gradients for ``others``."""
    grads = torch.autograd.grad(loss, [*leaves, *others], allow_unused=True, materialize_grads=True)
    return torch.cat([g.reshape(-1) for g in grads[: len(leaves)]]), *grads[len(leaves):]


class FMLClient(Client):
    """Mutual learning of the personal and the meme model; uploads the meme model."""

    vectorisable = False  # two models trained per step: its own train_job

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-al", "--alpha", type=float, default=0.5, low=0, high=1,
                 help="FML: α, the personal model's weight of cross-entropy against KL to the meme model "
                      "(paper 0.5; PFLlib 1)")
        add_flag(parser, "-bt", "--beta", type=float, default=0.5, low=0, high=1,
                 help="FML: β, the meme model's weight of cross-entropy against KL to the personal model "
                      "(paper 0.5; PFLlib 0)")
        add_flag(parser, "--fml_kl", type=str, default="batchmean", choices=["batchmean", "mean"],
                 help="FML's KL reduction: per sample, averaged over the batch (paper) or also over classes (PFLlib)")
        add_flag(parser, "--fml_clip", type=float, default=0.0, low=0,
                 help="FML: clip each model's gradient to this L2 norm (0: no clipping, paper; PFLlib: 10)")

    def expected_gradient_samples(self) -> float:
        return 2 * super().expected_gradient_samples()

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        return {"personal": self.state.get("personal", self.index)}  # created by the server (initial model)

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        hp, lr = self.hp, job.lr
        personal = job.ctx["personal"].clone()  # the personal model: its own vector, trained functionally
        n = model.num_params
        loss_sum = torch.zeros((), device=model.device)
        for x, y, leaves, personal_net in paired_batches(self, job, model, personal):
            local_out = personal_net(x)
            meme_out = model.net(x)
            local_loss = hp.alpha * F.cross_entropy(local_out, y) + (1 - hp.alpha) * kl_divergence(
                F.log_softmax(local_out, dim=1), F.softmax(meme_out, dim=1), hp.fml_kl)
            meme_loss = hp.beta * F.cross_entropy(meme_out, y) + (1 - hp.beta) * kl_divergence(
                F.log_softmax(meme_out, dim=1), F.softmax(local_out, dim=1), hp.fml_kl)
            (local_grad,) = flat_gradient(local_loss, leaves)
            meme_loss.backward()
            personal[:n] -= lr * self.clipped(local_grad)
            model.params.sub_(self.clipped(model.grad), alpha=lr)
            loss_sum += meme_loss.detach()
        job.ctx["personal"] = personal
        return model.snapshot(), self.check_loss(loss_sum, len(job.plan), job.package.round)

    def clipped(self, grad: torch.Tensor) -> torch.Tensor:
        if self.hp.fml_clip <= 0:
            return grad
        norm = torch.linalg.vector_norm(grad)
        return grad * torch.clamp(self.hp.fml_clip / (norm + 1e-6), max=1.0)

    def end_round(self, params, package, ctx, steps, loss) -> ClientUpdate:
        self.state.set("personal", self.index, ctx["personal"])
        return super().end_round(params, package, ctx, steps, loss)
