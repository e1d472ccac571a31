"""The base client and the one local-training sequence every engine runs.

A client object is light (its data tensors and a few numbers); it trains by loading its start
point into the engine's working :class:`~flcore.flat.FlatModel`, so no client holds a model copy.

The sequence of one client in one round lives here once, in four steps that engines call
(the sequential engine back to back, the threaded and batched engines spread over threads or
stacked under vmap, but always in this order per client)::

    job = client.plan_job(package)        seed (seed, t, client); minibatch plan
    client.open_job(job)                  begin_round -> ctx; start point (+ private part); lr
    params, loss = client.train_job(job, model)    local training on a working model
    update = client.finish_job(job, params, loss)  participations, end_round, private part kept

Hooks an algorithm overrides (most override one or two):

* ``begin_round(package, steps)``: per-round context tensors (e.g. FedProx's anchor, SCAFFOLD's
  controls, MOON's previous model); ``steps`` is the number of local steps this round.
* ``adjust_grad(w, g, ctx)``: the local objective's extra gradient terms. It must be a pure
  function of tensors so the batched engine can ``vmap`` it; ``w`` and ``g`` cover the trainable
  parameters only.
* ``local_loss(net, x, y, ctx)``: the minibatch loss, for algorithms that change the objective
  (MOON's contrastive term, FedLC's calibrated logits). ``net`` gives logits, features, the head
  and other models' outputs (:class:`~flcore.flat.Net`). Classes whose loss is a pure tensor
  function set ``vmappable_loss = True`` so the batched engine runs it too.
* ``end_round(params, package, ctx, steps, loss)``: build the upload and update per-client state.
* ``start_point(package)``: where local training starts (the global model by default).
* ``train_job(job, model)``: the whole local procedure, for algorithms whose local step is not
  "SGD on ``local_loss`` plus ``adjust_grad``" (these set ``vectorisable = False``).

Per-client messages from the server arrive in ``package.payload(self.index)``; the parts of the
model an algorithm keeps private (``Server.shared``) are merged into the start point and stored
again after training by the sequence itself.
"""
from __future__ import annotations

from argparse import ArgumentParser, Namespace
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from flcore.flat import FlatModel, Net
from flcore.privacy import dp_sgd_config
from flcore.state import ClientStateStore
from utils.cli import hyperparameters
from utils.data_utils import ClientData
from utils.errors import Diverged
from utils.seeding import numpy_rng, rng_state, seed_global_rng, set_rng_state, torch_generator


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def with_private_part(params: torch.Tensor, shared: torch.Tensor | None, private: torch.Tensor | None) -> torch.Tensor:
    """``params`` with a client's ``private`` entries (those ``shared`` excludes) put in; ``params``
    itself when nothing is private or the client has no private part yet."""
    if shared is None or private is None:
        return params
    merged = params.clone()
    merged[~shared] = private.to(merged.dtype)
    return merged


@dataclass
class RoundPackage:
    """What the server sends to the selected clients in one round.

    ``extras`` go to every client; ``payloads[i]`` only to client ``i`` (FedAMP's and FedACS's
    personalised models). ``shared`` masks the entries of the model that are sent and aggregated
    (None: all of it); the others are each client's own."""

    round: int
    global_params: torch.Tensor
    cohort: list[int]
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    payloads: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    shared: torch.Tensor | None = None

    @property
    def cohort_size(self) -> int:
        return len(self.cohort)

    def payload(self, index: int) -> dict[str, torch.Tensor]:
        return self.payloads.get(index, {})

    @cached_property
    def shared_numel(self) -> int:
        """How many entries of the model are sent and aggregated (counted once per round)."""
        return self.global_params.numel() if self.shared is None else int(self.shared.sum())

    def nbytes(self, index: int | None = None) -> int:
        """Bytes client ``index`` downloads (the shared part of the model, extras, its payload)."""
        own = _nbytes(self.payload(index)) if index is not None else 0
        return self.shared_numel * self.global_params.element_size() + _nbytes(self.extras) + own

    def total_nbytes(self) -> int:
        """Bytes the whole cohort downloads."""
        return sum(self.nbytes(i) for i in self.cohort)


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
    #: how many entries of ``params`` are really sent (the shared part); None = all
    shared_numel: int | None = None
    #: training samples the client processed this round (its work on the virtual clock)
    samples_processed: int = 0

    def nbytes(self) -> int:
        count = self.params.numel() if self.shared_numel is None else self.shared_numel
        size = count * self.params.element_size() if self.uploads_params else 0
        return size + _nbytes(self.extras)


@dataclass(frozen=True)
class Task:
    """What every client knows of the run besides its own data: the task's classes (not only those
    it holds) and the length of the model's trainable prefix of the flat vector."""

    num_classes: int
    num_params: int


@dataclass
class LocalJob:
    """One client's local training in one round, as the sequence prepares it for an engine."""

    client: "Client"
    package: RoundPackage
    plan: list
    rng: tuple
    ctx: dict = field(default_factory=dict)
    start: torch.Tensor | None = None
    lr: float = 0.0

    @property
    def steps(self) -> int:
        return len(self.plan)


class Client:
    """FedAvg's client: ``E`` epochs of minibatch SGD from the global model."""

    #: whether ``local_loss`` + ``adjust_grad`` fully describe the local step and the hooks touch
    #: only this client's state (the threaded and batched engines may then run it)
    vectorisable: ClassVar[bool] = True
    #: whether an overridden ``local_loss`` is a pure tensor function the batched engine can vmap
    vmappable_loss: ClassVar[bool] = False
    #: context keys holding one entry per local step (leading axis = steps): step t's hooks see
    #: entry t (e.g. FedGen's generated features, drawn up front from (seed, round, client))
    per_step_context: ClassVar[tuple[str, ...]] = ()

    def __init__(self, index: int, data: ClientData, args: Namespace, state: ClientStateStore,
                 task: Task | None = None):
        self.index = index
        self.task = task
        self.cid = data.cid
        self.data = data
        self.args = args
        self.hp = hyperparameters(args, type(self))  # typed, frozen: the flags this client class declares
        self.state = state
        self.batch_size = int(args.batch_size)
        self.local_epochs = int(args.local_epochs)
        self.participations = 0
        self.slow = False  # -tsr: fewer epochs, slower compute on the virtual clock
        self.send_slow = False  # -ssr: slower links on the virtual clock
        # virtual seconds of the rounds it trained in and their number (-tth averages them)
        self.virtual_seconds = 0.0
        self.virtual_rounds = 0
        self.dp = dp_sgd_config(args)  # DP-SGD's settings with -dp (flcore/privacy), else None
        self.dp_steps = 0  # DP-SGD steps taken so far: what the accountant charges this client for
        self.gradient_samples = 0  # samples of this round's gradient computations (virtual clock)

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

    def local_loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        """The minibatch loss (cross-entropy of the logits)."""
        return F.cross_entropy(net(x), y)

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

    @property
    def steps_per_epoch(self) -> int:
        """Minibatch steps in one epoch: full batches only with ``drop_last`` (PFLlib's default)."""
        n, bs = self.num_train, self.batch_size
        return n // bs if self.args.drop_last else -(-n // bs)

    def epochs_this_round(self, rnd: int) -> int:
        """Slow trainers (``-tsr``) run a random 1..max(1, E//2) epochs, drawn per (round, client)."""
        if not self.slow:
            return self.local_epochs
        upper = max(1, self.local_epochs // 2)
        return int(numpy_rng(self.args.seed, "slow-epochs", rnd, self.cid).integers(1, upper + 1))

    def batch_plan(self, rnd: int, epochs: int | None = None, purpose: str = "batches") -> list[torch.Tensor]:
        """Index tensors of every local minibatch of round ``rnd``, from (seed, purpose, round, client)
        only (``purpose`` names another stream for work outside training: new clients' fine-tuning).

        Each epoch is a fresh permutation; with ``drop_last`` (PFLlib's default) a trailing partial
        batch is skipped, so a client with fewer samples than the batch size takes no step."""
        epochs = self.epochs_this_round(rnd) if epochs is None else epochs
        if self.dp is not None and self.dp.poisson:  # DP-SGD's accountant assumes Poisson batches
            return self.dp.poisson_plan(self, rnd, epochs)
        n, bs = self.num_train, self.batch_size
        generator = torch_generator(self.args.seed, purpose, rnd, self.cid)
        steps, plan = self.steps_per_epoch, []
        for _ in range(epochs):
            order = torch.randperm(n, generator=generator).to(self.data.train_x.device)
            plan.extend(order[i * bs : (i + 1) * bs] for i in range(steps))
        return plan

    def samples_processed(self, job: "LocalJob") -> int:
        """Training samples the client computed gradients on this round: its work on the virtual
        clock. Every pass counts (``count_gradient_samples``), so Ditto's personal model, APFL's two
        gradients a step, pFedMe's K inner steps and FedALA's weight learning are charged as work.
        A client whose plan an engine trained vectorised (no per-client gradient call) ran exactly
        its plan, and is charged the plan (steps × batch size, partial batches as they are; an
        entry may be a tuple of index tensors, PerAvg's meta-steps)."""
        if self.gradient_samples:
            return self.gradient_samples

        def count(entry) -> int:
            if isinstance(entry, (tuple, list)):
                return sum(count(part) for part in entry)
            return int(entry.numel())
        return sum(count(entry) for entry in job.plan)

    def expected_gradient_samples(self) -> float:
        """What ``samples_processed`` will be in a round, known before it (``-ts`` predicts round
        times from it): E epochs of full batches. Algorithms with extra passes scale it."""
        return float(self.local_epochs * self.steps_per_epoch * self.batch_size)

    def count_gradient_samples(self, idx: torch.Tensor) -> None:
        """Add a minibatch to the samples computed on this round (reset when a round's job opens)."""
        self.gradient_samples += int(idx.numel())

    def seed_round(self, rnd: int) -> None:
        """Seed the global torch RNG (dropout) from (seed, round, client) before local work."""
        seed_global_rng(self.args.seed, "local", rnd, self.cid)

    def compute_gradient(self, model: FlatModel, idx: torch.Tensor, ctx: dict | None = None) -> torch.Tensor:
        """``local_loss`` on the minibatch ``idx``; leaves its gradient in ``model.grad``."""
        self.count_gradient_samples(idx)
        model.zero_grad()
        loss = self.local_loss(model.net, self.data.inputs("train", idx), self.data.train_y[idx], ctx or {})
        loss.backward()
        return loss.detach()

    def step_gradient(self, model: FlatModel, idx: torch.Tensor, ctx: dict, rnd: int, step: int) -> torch.Tensor:
        """The gradient local step ``step`` of round ``rnd`` uses, left in ``model.grad`` (returns the
        loss): ``compute_gradient``'s, or with ``-dp`` DP-SGD's, clipped per sample and noised from
        (seed, round, client, step) (``flcore/privacy/dpsgd.py``); whoever replays a step (an
        attack on the uploads) gets what the client used."""
        if self.dp is not None:
            self.count_gradient_samples(idx)
            return self.dp.gradient(self, model, idx, ctx, (rnd, step))
        return self.compute_gradient(model, idx, ctx)

    def check_loss(self, loss_sum: torch.Tensor, steps: int, rnd: int) -> float:
        """Mean loss of the round; a NaN/inf loss stops the run with advice."""
        mean_loss = float(loss_sum) / steps if steps else 0.0
        if not np.isfinite(mean_loss):
            raise Diverged(
                f"training loss became {mean_loss} on client {self.cid} in round {rnd}; "
                f"lower the learning rate (-lr, now {self.learning_rate()})", rnd
            )
        return mean_loss

    def sgd(
        self, model: FlatModel, package: RoundPackage, ctx: dict[str, torch.Tensor], plan: list[torch.Tensor], lr: float
    ) -> float:
        """Minibatch SGD over ``plan``, each step ``w -= lr * adjust_grad(w, g)``; returns the mean loss."""
        model.module.train()
        loss_sum = torch.zeros((), device=model.device)
        for step, idx in enumerate(plan):
            step_ctx = self.context_at(ctx, step)
            loss_sum += self.step_gradient(model, idx, step_ctx, package.round, step)
            direction = self.adjust_grad(model.params, model.grad, step_ctx)
            model.params.add_(direction, alpha=-lr)
        return self.check_loss(loss_sum, len(plan), package.round)

    def context_at(self, ctx: dict, step: int) -> dict:
        """The context local step ``step`` sees: ``per_step_context`` entries sliced at ``step``."""
        if not self.per_step_context:
            return ctx
        return {k: (v[step] if k in self.per_step_context else v) for k, v in ctx.items()}

    # ------------------------------------------------------ the local sequence
    def plan_job(self, package: RoundPackage) -> LocalJob:
        """Step 1: seed the global RNG from (seed, round, client) and plan the minibatches."""
        self.seed_round(package.round)
        plan = self.batch_plan(package.round)
        return LocalJob(self, package, plan, rng_state(self.data.train_y.device))

    def open_job(self, job: LocalJob) -> None:
        """Step 2: the round's context, start point (with this client's private part) and lr.
        Resumes the RNG where step 1 left it, so an engine may run it later."""
        set_rng_state(job.rng)
        self.gradient_samples = 0
        job.ctx = self.begin_round(job.package, job.steps)
        job.start = self.with_private(self.start_point(job.package), job.package)
        job.lr = self.learning_rate()
        job.rng = rng_state(self.data.train_y.device)

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        """Step 3: local training on ``model`` (any working model); returns (params, mean loss).
        Algorithms with another local procedure override this (and set ``vectorisable = False``)."""
        model.load(job.start)
        loss = self.sgd(model, job.package, job.ctx, job.plan, job.lr)
        return model.snapshot(), loss

    def finish_job(self, job: LocalJob, params: torch.Tensor, loss: float) -> ClientUpdate:
        """Step 4: count the participation, build the upload, keep the private part."""
        set_rng_state(job.rng)
        self.participations += 1
        if self.dp is not None:
            self.dp_steps += job.steps
        update = self.end_round(params, job.package, job.ctx, job.steps, loss)
        update.samples_processed = self.samples_processed(job)
        shared = job.package.shared
        if shared is not None:
            self.state.set("private", self.index, params[~shared])
            # the private entries never leave the client: the upload carries the server's values there
            update.params = torch.where(shared, update.params, job.package.global_params)
            update.shared_numel = job.package.shared_numel
        return update

    def local_train(self, model: FlatModel, package: RoundPackage) -> ClientUpdate:
        """The whole sequence for one client on ``model`` (what the sequential engine runs)."""
        job = self.plan_job(package)
        self.open_job(job)
        params, loss = self.train_job(job, model)
        return self.finish_job(job, params, loss)

    def with_private(self, start: torch.Tensor, package: RoundPackage) -> torch.Tensor:
        """``start`` with this client's private part (the part ``Server.shared`` excludes) put in;
        before its first participation the private part is that of ``start``."""
        if package.shared is None:
            return start
        return with_private_part(start, package.shared, self.state.get("private", self.index))
