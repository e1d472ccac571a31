"""Per-FedAvg client (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020, arXiv:2002.07948).

Local training is MAML on minibatches. Each local step takes two fresh batches D, D' (three,
with D'', for the second-order variants) at the current model w:

    w̃ = w − α ∇f(w; D)                                  (temporary point)
    w ← w − β ∇f(w̃; D')                                  Per-FedAvg (FO): PFLlib's and the default
    w ← w − β (I − α H) ∇f(w̃; D')                        ``--peravg_order hessian_free`` / ``second``

with α = ``-lr`` and β = ``-bt``. For Per-FedAvg (HF) the Hessian-vector product is the paper's
finite difference H v = (∇f(w + δv; D'') − ∇f(w − δv; D'')) / 2δ with δ = ``--peravg_delta``;
``second`` uses the exact product ∇²f(w; D'') v (double backward), the paper's Per-FedAvg with
a stochastic Hessian.

Choices where the paper, PFLlib (``clientperavg.py``) and this file differ:

* β: ``-bt`` > 0 is used as given; ``-bt 0`` (PFLlib's default) means β = ``-lr``, which is what
  PFLlib always uses (its client ignores ``-bt``). As in PFLlib, ``-ld`` decays α but not β.
* Batches: the round's batch plan (``-lbs``, fresh permutation per epoch) taken in consecutive
  pairs (triples) within each epoch; a trailing unpaired batch is skipped. With ``drop_last``
  this is exactly PFLlib's loader of ``2·-lbs`` split in halves.
* PFLlib's server calls ``client.train()`` twice per round, i.e. 2·E local epochs; here a round
  has E epochs: pass ``-ls 2E`` to match it.
* The recorded local loss is the mean of f(w̃; D') (the meta-objective).
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import LocalJob
from flcore.flat import FlatModel
from cli.flags import add_flag
from utils.seeding import seed_global_rng, torch_generator


class PerAvgClient(Client):
    """MAML-style local steps from the global model; nothing is kept between rounds."""

    vectorisable = False

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-bt", "--beta", type=float, default=0.0, low=0,
                 help="Per-FedAvg: outer step size β; 0 = use -lr (PFLlib always uses -lr)")
        add_flag(parser, "--peravg_order", type=str, default="first", choices=["first", "hessian_free", "second"],
                 help="Per-FedAvg: first-order MAML (FO, PFLlib), Hessian-free (HF: finite-difference "
                      "Hessian-vector product on a third batch) or second order (exact product)")
        add_flag(parser, "--peravg_delta", type=float, default=0.001, above=0,
                 help="Per-FedAvg (HF): finite-difference step δ of the Hessian-vector product")

    def outer_step_size(self) -> float:
        beta = self.hp.beta
        return beta if beta > 0 else self.args.local_learning_rate

    def meta_batches(self, rnd: int) -> list[tuple[torch.Tensor, ...]]:
        """Consecutive pairs (triples for Hessian-free) of this round's minibatches, within epochs."""
        group = 2 if self.hp.peravg_order == "first" else 3
        epochs = self.epochs_this_round(rnd)
        plan = self.batch_plan(rnd, epochs)
        per_epoch = len(plan) // epochs
        steps = []
        for e in range(epochs):
            epoch = plan[e * per_epoch : (e + 1) * per_epoch]
            steps.extend(tuple(epoch[i : i + group]) for i in range(0, len(epoch) - group + 1, group))
        return steps

    def hessian_vector(self, model: FlatModel, idx: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
        """H(w; idx) · vector at the model's current parameters w (left in place), as a flat tensor."""
        if self.hp.peravg_order == "hessian_free":
            delta = self.hp.peravg_delta
            start = model.params.clone()
            model.params.add_(vector, alpha=delta)
            self.compute_gradient(model, idx)
            plus = model.grad.clone()
            model.params.copy_(start).add_(vector, alpha=-delta)
            self.compute_gradient(model, idx)
            model.params.copy_(start)
            return (plus - model.grad) / (2 * delta)
        params = list(model.module.parameters())
        live = [p for p in params if p.requires_grad]
        for _ in range(2):  # a gradient and its double backward: charged as the two passes hessian_free takes
            self.count_gradient_samples(idx)
        loss = F.cross_entropy(model.module(self.data.inputs("train", idx)), self.data.train_y[idx])
        grads = torch.autograd.grad(loss, live, create_graph=True, allow_unused=True)
        products = torch.autograd.grad(_flatten(params, live, grads) @ vector, live, allow_unused=True)
        return _flatten(params, live, products).detach()

    def batch_plan(self, rnd: int, epochs: int | None = None) -> list:
        """A round's plan is its meta-steps (pairs or triples of minibatches)."""
        return self.meta_batches(rnd) if epochs is None else super().batch_plan(rnd, epochs)

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        rnd, steps = job.package.round, job.plan
        alpha, beta = job.lr, self.outer_step_size()
        model.load(job.start)
        model.module.train()
        loss_sum = torch.zeros((), device=model.device)
        for batches in steps:
            start = model.params.clone()
            self.compute_gradient(model, batches[0])
            model.params.add_(model.grad, alpha=-alpha)  # temporary point w̃
            loss_sum += self.compute_gradient(model, batches[1])
            direction = model.grad.clone()
            model.params.copy_(start)
            if len(batches) == 3:
                direction -= alpha * self.hessian_vector(model, batches[2], direction)
            model.params.add_(direction, alpha=-beta)
        return model.snapshot(), self.check_loss(loss_sum, len(steps), rnd)

    def adapted(self, model: FlatModel, global_params: torch.Tensor, rnd: int) -> torch.Tensor:
        """The personalised model: one SGD step (lr α) from ``global_params`` on one training batch.

        The batch is the first ``-lbs`` samples of a permutation drawn from (seed, "peravg-adapt",
        round, client); with ``drop_last`` a client with fewer samples keeps the global model."""
        n = self.num_train
        if n == 0 or (self.args.drop_last and n < self.batch_size):
            return global_params
        generator = torch_generator(self.args.seed, "peravg-adapt", rnd, self.cid)
        idx = torch.randperm(n, generator=generator)[: self.batch_size].to(self.data.train_x.device)
        seed_global_rng(self.args.seed, "peravg-adapt", rnd, self.cid)
        model.load(global_params)
        model.module.train()
        self.compute_gradient(model, idx)
        model.params.add_(model.grad, alpha=-self.learning_rate())
        return model.snapshot()


def _flatten(params: list[torch.Tensor], live: list[torch.Tensor], grads: tuple) -> torch.Tensor:
    """One flat vector in the model's layout from per-parameter gradients (None/frozen = zeros)."""
    found = {id(p): g for p, g in zip(live, grads) if g is not None}
    return torch.cat([found[id(p)].reshape(-1) if id(p) in found else torch.zeros_like(p).reshape(-1) for p in params])
