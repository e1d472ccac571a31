"""FedAS client (Yang, Huang, Ye, "FedAS: Bridging Inconsistency in Personalized Federated
Learning", CVPR 2024), as PFLlib implements it.

A client's model is a shared body (aggregated) and its own head (never uploaded,
``Server.shared = "body"``). When selected it

1. aligns the received global body to its own representation (parameter alignment): with
   p_c the mean feature of class c under its current model (its last trained model; the received
   global model before its first participation, where PFLlib uses the initial model), it trains
   the global body for ``--fedas_align_epochs`` epochs (minibatches of ``--fedas_align_batch``,
   learning rate ``--fedas_align_lr``; PFLlib: 1, 16, 0.01, fixed) on
   Σ_c MSE(body(x)[y = c], p_c) over the classes c of the minibatch;
2. trains (aligned body, own head) with FedAvg's local SGD; the trained model is its personal
   model (state ``personal``), the one it is evaluated with;
3. estimates the trace of its empirical Fisher information at the trained model,
   F = Σ_batches ‖∇ mean NLL(batch)‖² over one pass of its training data in minibatches of
   ``-lbs`` (eval mode, as PFLlib), and uploads it (``extras["fisher_trace"]``) with the body.

The server weighs the bodies by these traces (``serverfedas.py``). PFLlib also computes the trace
of every unselected client each round and never uses it; that work is skipped here.
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
from utils.seeding import torch_generator

PROTOTYPE_CHUNK = 512  # rows per forward pass when the class means are computed (bounds the memory)


def alignment_loss(features: torch.Tensor, y: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """Σ over the classes c in the batch of mean((features[y = c] − p_c)²)."""
    per_sample = (features.flatten(1) - prototypes[y]).pow(2).mean(dim=1)
    counts = torch.bincount(y, minlength=prototypes.shape[0]).to(per_sample.dtype)
    return (per_sample / counts[y]).sum()


class FedASClient(Client):
    """Parameter alignment of the global body, local SGD, then the Fisher trace."""

    vectorisable: ClassVar[bool] = False
    steps_through_sgd = True  # its own train_job trains through the base sgd (--local_momentum reaches it)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--fedas_align_epochs", type=int, default=1, low=0, help="epochs of parameter alignment (PFLlib 1)")
        add_flag(parser, "--fedas_align_batch", type=int, default=16, low=1, help="minibatch size of the alignment (PFLlib 16)")
        add_flag(parser, "--fedas_align_lr", type=float, default=0.01, low=0, help="learning rate of the alignment (PFLlib 0.01)")

    def expected_gradient_samples(self) -> float:
        """The alignment epochs and the Fisher pass come on top of local training."""
        n, bs = self.num_train, self.hp.fedas_align_batch
        align = self.hp.fedas_align_epochs * (n // bs if self.args.drop_last else -(-n // bs)) * bs
        return super().expected_gradient_samples() * (self.local_epochs + 1) / max(self.local_epochs, 1) + align

    def batches(self, rnd: int, purpose: str, batch_size: int, epochs: int) -> list[torch.Tensor]:
        """Minibatches of the training rows from (seed, purpose, round, client), ``drop_last`` as for training."""
        n = self.num_train
        steps = n // batch_size if self.args.drop_last else -(-n // batch_size)
        generator = torch_generator(self.args.seed, purpose, rnd, self.cid)
        plan = []
        for _ in range(epochs):
            order = torch.randperm(n, generator=generator).to(self.data.train_y.device)
            plan.extend(order[k * batch_size:(k + 1) * batch_size] for k in range(steps))
        return plan

    def prototypes(self, model: FlatModel, params: torch.Tensor, num_classes: int) -> torch.Tensor:
        """Mean feature of each class under ``params`` (zero for classes the client lacks)."""
        model.load(params)
        model.module.eval()
        y, sums = self.data.train_y, None
        with torch.no_grad():
            for start in range(0, self.data.num_train, PROTOTYPE_CHUNK):
                rows = slice(start, start + PROTOTYPE_CHUNK)
                features = model.net.features(self.data.inputs("train", rows)).flatten(1)
                if sums is None:
                    sums = torch.zeros(num_classes, features.shape[1], dtype=features.dtype, device=features.device)
                sums.index_add_(0, y[rows], features)
        counts = torch.bincount(y, minlength=num_classes).clamp_min(1).to(sums.dtype)
        return sums / counts[:, None]

    def fisher_trace(self, model: FlatModel, rnd: int) -> float:
        model.module.eval()
        total = torch.zeros((), dtype=torch.float64, device=model.device)
        squares = model.grad.new_empty(model.grad.shape, dtype=torch.float64)  # reused: one buffer, not two a batch
        for idx in self.batches(rnd, "fedas-fisher", self.batch_size, 1):
            model.zero_grad()
            self.count_gradient_samples(idx)
            logits = model.module(self.data.inputs("train", idx))
            F.cross_entropy(logits, self.data.train_y[idx]).backward()
            total += squares.copy_(model.grad).pow_(2).sum()
        return float(total)

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        package, rnd = job.package, job.package.round
        num_classes = self.task.num_classes if self.task is not None else int(self.data.train_y.max()) + 1
        head = model.head_mask()[: model.num_params]
        own = self.state.get("personal", self.index)
        protos = self.prototypes(model, own if own is not None else package.global_params, num_classes)
        model.load(job.start)  # the global body with this client's head
        model.module.train()
        # a body without parameters has nothing to align
        align_epochs = self.hp.fedas_align_epochs if bool((~head).any()) else 0
        body_grad = torch.empty_like(model.grad)  # reused by every alignment step
        for idx in self.batches(rnd, "fedas-align", self.hp.fedas_align_batch, align_epochs):
            model.zero_grad()
            self.count_gradient_samples(idx)
            features = model.net.features(self.data.inputs("train", idx))
            alignment_loss(features, self.data.train_y[idx], protos).backward()
            model.params.add_(body_grad.copy_(model.grad).masked_fill_(head, 0.0), alpha=-self.hp.fedas_align_lr)
        loss = self.sgd(model, package, job.ctx, job.plan, job.lr)
        trained = model.snapshot()
        self.state.set("personal", self.index, trained)
        job.ctx["fisher_trace"] = torch.tensor(self.fisher_trace(model, rnd), dtype=torch.float64)
        return trained, loss

    def end_round(self, params, package: RoundPackage, ctx, steps, loss) -> ClientUpdate:
        update = super().end_round(params, package, ctx, steps, loss)
        update.extras["fisher_trace"] = ctx["fisher_trace"]
        return update
