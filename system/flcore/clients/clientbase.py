"""The base client: local SGD on one shared working model, with hooks for what algorithms change.

A client object is light (its data tensors and a few numbers); it trains by loading its start
point into the engine's working :class:`~flcore.flat.FlatModel`, so no client holds a model copy.

Hooks an algorithm overrides (most override one or two):

* ``begin_round(package, steps)``: per-round context tensors (e.g. FedProx's anchor, SCAFFOLD's
  controls); ``steps`` is the number of local steps this client takes this round.
* ``adjust_grad(w, g, ctx)``: the local objective's extra gradient terms. It must be a pure
  function of tensors so the batched engine can ``vmap`` it; ``w`` and ``g`` cover the trainable
  parameters only.
* ``end_round(params, package, ctx, steps, loss)``: build the upload and update per-client state.
* ``start_point(package)``: where local training starts (the global model by default).
* ``local_train(model, package)``: the whole procedure, for algorithms whose local step is not
  plain gradient descent (these set ``vectorisable = False``).
"""
from __future__ import annotations

from argparse import ArgumentParser, Namespace
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from flcore.flat import FlatModel
from flcore.state import ClientStateStore
from utils.cli import hyperparameters
from utils.data_utils import ClientData
from utils.errors import FLError
from utils.seeding import numpy_rng, seed_global_rng, torch_generator


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


@dataclass
class RoundPackage:
    """What the server sends to each selected client in one round."""

    round: int
    global_params: torch.Tensor
    cohort: list[int]
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def cohort_size(self) -> int:
        return len(self.cohort)

    def nbytes(self) -> int:
        """Bytes one client downloads."""
        return self.global_params.numel() * self.global_params.element_size() + _nbytes(self.extras)


@dataclass
class ClientUpdate:
    """What one client uploads after local training (``params`` = its final model vector)."""

    index: int
    num_samples: int
    num_steps: int
    params: torch.Tensor
    loss: float
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    uploads_params: bool = True

    def nbytes(self) -> int:
        size = self.params.numel() * self.params.element_size() if self.uploads_params else 0
        return size + _nbytes(self.extras)


class Client:
    """FedAvg's client: ``E`` epochs of minibatch SGD from the global model."""

    #: whether ``adjust_grad`` fully describes the local step (the batched engine can run it)
    vectorisable: ClassVar[bool] = True

    def __init__(self, index: int, data: ClientData, args: Namespace, state: ClientStateStore):
        self.index = index
        self.cid = data.cid
        self.data = data
        self.args = args
        self.hp = hyperparameters(args, type(self))  # typed, frozen: the flags this client class declares
        self.state = state
        self.batch_size = int(args.batch_size)
        self.local_epochs = int(args.local_epochs)
        self.participations = 0
        self.slow = False

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        """Declare this algorithm's client flags (called once per class in the MRO)."""

    # ----------------------------------------------------------------- hooks
    def start_point(self, package: RoundPackage) -> torch.Tensor:
        return package.global_params

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        return {}

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        return g

    def end_round(
        self, params: torch.Tensor, package: RoundPackage, ctx: dict[str, torch.Tensor], steps: int, loss: float
    ) -> ClientUpdate:
        return ClientUpdate(self.index, self.data.num_train, steps, params, loss)

    # ------------------------------------------------------------- machinery
    @property
    def num_train(self) -> int:
        return self.data.num_train

    def learning_rate(self) -> float:
        """PFLlib decays each client's lr once per local training call (``-ld``)."""
        lr = float(self.args.local_learning_rate)
        if self.args.learning_rate_decay:
            lr *= float(self.args.learning_rate_decay_gamma) ** self.participations
        return lr

    def epochs_this_round(self, rnd: int) -> int:
        """Slow trainers (``-tsr``) run a random 1..max(1, E//2) epochs, drawn per (round, client)."""
        if not self.slow:
            return self.local_epochs
        upper = max(1, self.local_epochs // 2)
        return int(numpy_rng(self.args.seed, "slow-epochs", rnd, self.cid).integers(1, upper + 1))

    def batch_plan(self, rnd: int, epochs: int | None = None) -> list[torch.Tensor]:
        """Index tensors of every local minibatch of round ``rnd``, from (seed, round, client) only.

        Each epoch is a fresh permutation; with ``drop_last`` (PFLlib's default) a trailing partial
        batch is skipped, so a client with fewer samples than the batch size takes no step."""
        epochs = self.epochs_this_round(rnd) if epochs is None else epochs
        n, bs = self.num_train, self.batch_size
        generator = torch_generator(self.args.seed, "batches", rnd, self.cid)
        full = n // bs if self.args.drop_last else -(-n // bs)
        plan = []
        for _ in range(epochs):
            order = torch.randperm(n, generator=generator).to(self.data.train_x.device)
            plan.extend(order[i * bs : (i + 1) * bs] for i in range(full))
        return plan

    def seed_round(self, rnd: int) -> None:
        """Seed the global torch RNG (dropout) from (seed, round, client) before local work."""
        seed_global_rng(self.args.seed, "local", rnd, self.cid)

    def compute_gradient(self, model: FlatModel, idx: torch.Tensor) -> torch.Tensor:
        """Cross-entropy on the minibatch ``idx``; leaves its gradient in ``model.grad``."""
        model.zero_grad()
        loss = F.cross_entropy(model.module(self.data.inputs("train", idx)), self.data.train_y[idx])
        loss.backward()
        return loss.detach()

    def check_loss(self, loss_sum: torch.Tensor, steps: int, rnd: int) -> float:
        """Mean loss of the round; a NaN/inf loss stops the run with advice."""
        mean_loss = float(loss_sum) / steps if steps else 0.0
        if not np.isfinite(mean_loss):
            raise FLError(
                f"training loss became {mean_loss} on client {self.cid} in round {rnd}; "
                f"lower the learning rate (-lr, now {self.learning_rate()})"
            )
        return mean_loss

    def sgd(
        self, model: FlatModel, package: RoundPackage, ctx: dict[str, torch.Tensor], plan: list[torch.Tensor], lr: float
    ) -> float:
        """Minibatch SGD over ``plan``, each step ``w -= lr * adjust_grad(w, g)``; returns the mean loss."""
        model.module.train()
        loss_sum = torch.zeros((), device=model.device)
        for idx in plan:
            loss_sum += self.compute_gradient(model, idx)
            direction = self.adjust_grad(model.params, model.grad, ctx)
            model.params.add_(direction, alpha=-lr)
        return self.check_loss(loss_sum, len(plan), package.round)

    def local_train(self, model: FlatModel, package: RoundPackage) -> ClientUpdate:
        """Sequential-engine entry point: start point -> SGD -> upload."""
        self.seed_round(package.round)
        plan = self.batch_plan(package.round)
        ctx = self.begin_round(package, len(plan))
        model.load(self.start_point(package))
        loss = self.sgd(model, package, ctx, plan, self.learning_rate())
        self.participations += 1
        return self.end_round(model.snapshot(), package, ctx, len(plan), loss)
