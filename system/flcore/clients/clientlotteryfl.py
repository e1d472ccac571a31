"""LotteryFL client (Li, Sun, Wang, Duan, Li, Chen, Li, 2020, arXiv:2008.03371).

Client k keeps a binary mask m_k over the model (its lottery ticket; the state ``mask``, all ones at
first) and, in a round where it is selected (the paper's ClientUpdate):

1. θ ← θ_g ⊙ m_k, from the download (the server sends the global model on the entries k last
   uploaded, ``serverlotteryfl.py``);
2. if the accuracy of θ on its training data exceeds ``--acc_threshold`` and it still keeps more
   than the target ``-kf`` of its prunable weights, it prunes: in every weight tensor (biases are
   never pruned) the ``--prune_rate`` r_p of the still-kept weights with the smallest |θ| are
   dropped, never below ⌈kf · size⌉ (the last step is cut short to land on the target), and the
   kept weights are reset to their initial values, θ ← θ_0 ⊙ m_k (the lottery ticket's rewind);
3. E epochs of SGD on the ticket (gradients masked, so pruned weights stay 0);
4. the upload is θ ⊙ m_k as values plus the indices or bitmap of m_k: the server aggregates each
   entry over the clients that kept it, so the kept set is what it must learn; the mask itself
   (the state entry) stays on the client.

The model a client is evaluated with is its latest θ ⊙ m_k (the common initial model before it
first trains). With ``-kf 1`` nothing is ever pruned and the round is FedAvg's exactly.
Deliberate choices: the accuracy test uses the training split (no validation split exists here),
pruning is layer-wise (the lottery ticket hypothesis's rule) and the server's mean is
sample-weighted, as FedAvg's.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import ClassVar

import torch

from flcore.protocol import ClientUpdate, LocalJob, RoundPackage
from flcore.clients.clientsparse import SparseClient, sparse_update
from flcore.common.sparsemask import decode, encode, kept_count, keep_largest, weight_groups
from flcore.flat import FlatModel
from cli.flags import add_flag

EVAL_CHUNK = 1024  # samples per forward pass of the accuracy test


class LotteryFLClient(SparseClient):
    """Masked SGD on the client's ticket; prunes when accurate enough and above the target."""

    #: the pruning decision needs a forward pass of the received model before training and may
    #: change the mask and the start point within the job, which the hooks alone cannot do
    vectorisable: ClassVar[bool] = False
    steps_through_sgd = True  # its own train_job trains through the base sgd (--local_momentum reaches it)
    #: reset the kept weights to the initial model after pruning (the lottery ticket's rewind)
    rewind: ClassVar[bool] = True

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--prune_rate", type=float, default=0.2, low=0, high=1,
                 help="r_p: share of the still-kept weights (LotteryFL) or channels (Hermes) one pruning step drops")
        add_flag(parser, "--acc_threshold", type=float, default=0.5, high=1,
                 help="a client prunes only when its accuracy on its training data exceeds this")

    def start_point(self, package: RoundPackage) -> torch.Tensor:
        values, _ = decode(package.payload(self.index), self.initial_params.numel())
        return torch.where(self.mask(), values, torch.zeros_like(values))

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        return {"mask": self.mask()[: self.task.num_params].to(self.initial_params.dtype)}

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        return g * ctx["mask"]

    # ---------------------------------------------------------------- pruning
    def prune_groups(self) -> list[tuple[int, int]]:
        return weight_groups(self.segments)

    def may_prune(self, mask: torch.Tensor) -> bool:
        """Whether some weight tensor still keeps more than its target ⌈kf · size⌉."""
        return any(int(mask[a:b].sum()) > kept_count(b - a, self.hp.kept_fraction) for a, b in self.prune_groups())

    def pruned(self, theta: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The mask after one pruning step: per weight tensor, the r_p smallest |θ| of the kept weights
        dropped, never leaving fewer than ⌈kf · size⌉."""
        counts = []
        for a, b in self.prune_groups():
            alive = int(mask[a:b].sum())
            floor = kept_count(b - a, self.hp.kept_fraction)
            counts.append(max(min(alive, floor), alive - round(self.hp.prune_rate * alive)))
        return keep_largest(theta.abs(), self.prune_groups(), 1.0, eligible=mask, counts=counts) & mask

    def accuracy(self, model: FlatModel, theta: torch.Tensor) -> float:
        """Accuracy of ``theta`` on this client's training data (eval mode, no randomness used)."""
        model.load(theta)
        model.module.eval()
        correct = 0
        with torch.no_grad():
            for start in range(0, self.num_train, EVAL_CHUNK):
                idx = torch.arange(start, min(start + EVAL_CHUNK, self.num_train), device=self.data.train_y.device)
                logits = model.net(self.data.inputs("train", idx))
                correct += int((logits.argmax(dim=1) == self.data.train_y[idx]).sum())
        model.module.train()
        return correct / max(self.num_train, 1)

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        theta, mask, ctx = job.start, self.mask(), job.ctx
        if self.may_prune(mask) and self.accuracy(model, theta) > self.hp.acc_threshold:
            mask = self.pruned(theta, mask)
            self.state.set("mask", self.index, mask)
            base = self.initial_params if self.rewind else theta
            theta = torch.where(mask, base, torch.zeros_like(base))
            ctx = {**ctx, "mask": mask[: self.task.num_params].to(theta.dtype)}
        model.load(theta)
        loss = self.sgd(model, job.package, ctx, job.plan, job.lr)
        return model.snapshot(), loss

    def end_round(self, params: torch.Tensor, package: RoundPackage, ctx: dict[str, torch.Tensor], steps: int,
                  loss: float) -> ClientUpdate:
        mask = self.mask()
        personal = torch.where(mask, params, torch.zeros_like(params))
        self.state.set("personal", self.index, personal)
        return sparse_update(self, steps, loss, encode(personal, mask), params)
