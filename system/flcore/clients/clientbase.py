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
* ``gradient_inputs(model, ctx)``: the parameters a step needs gradients for (default all); a step
  that moves only the head says so, and its backward pass stops there (FedRep, PFL-DA).
* ``end_round(params, package, ctx, steps, loss)``: build the upload and update per-client state.
* ``start_point(package)``: where local training starts (the global model by default).
* ``pre_training(job, model)`` / ``post_training(job, model)``: work on the working model just
  before and just after the local SGD (KT-pFL's distillation and FedPAC's head epoch before it;
  prototypes, class means or soft predictions of the trained model after it), keeping what the
  upload needs in ``job.ctx``. Every engine runs them around its SGD, so a class that needs only
  these keeps the base ``train_job`` and stays vectorisable.
* ``train_job(job, model)``: the whole local procedure, for algorithms whose local step is not
  "SGD on ``local_loss`` plus ``adjust_grad``" (these set ``vectorisable = False``).

Per-client messages from the server arrive in ``package.payload(self.index)``; the parts of the
model an algorithm keeps private (``Server.shared``) are merged into the start point and stored
again after training by the sequence itself.
"""
from __future__ import annotations

import math
from argparse import ArgumentParser, Namespace
from typing import Any, Callable, ClassVar

import torch

from flcore.capabilities import CLIENT_HOOKS, Capabilities
from flcore.clients.localstep import PLAIN_SGD
from flcore.extension import LocalStep, carried_names, carried_values, set_carried_values
from flcore.flat import FlatModel, Net
from flcore.objectives import objective_of
from flcore.protocol import ClientUpdate, LocalJob, RoundPackage, Task, with_private_part
from flcore.state import ClientStateStore
from cli.flags import hyperparameters
from fldata.loading import ClientData
from utils.errors import Diverged, FLError
from utils.seeding import rng_state, scratch_generator, seed_global_rng, set_rng_state


class Client:
    """FedAvg's client: ``E`` epochs of minibatch SGD from the global model."""

    #: whether ``local_loss`` + ``adjust_grad`` fully describe the local step and the hooks touch
    #: only this client's state (the threaded and batched engines may then run it)
    vectorisable: ClassVar[bool] = True
    #: whether an overridden ``local_loss`` is a pure tensor function the batched engine can vmap
    vmappable_loss: ClassVar[bool] = False
    #: what the client uploads instead of its model's weights (None: the weights, which model-poisoning
    #: attacks can poison); a description for the one-line refusal of an attack that cannot apply
    uploads_instead: ClassVar[str | None] = None
    #: context keys holding one entry per local step (leading axis = steps): step t's hooks see
    #: entry t (e.g. FedGen's generated features, drawn up front from (seed, round, client))
    per_step_context: ClassVar[tuple[str, ...]] = ()

    #: the attributes of a client that change across rounds, besides its state-store entries: the
    #: client-state contract (declared as servers and plug-ins declare theirs, ``flcore.extension.Carries``;
    #: a subclass names only its own). Checkpoints save exactly these (with the local step's ``carried``),
    #: and the Ray engine sends exactly these between driver and actors. Algorithms keep what
    #: persists per client in the state store (``self.state``), not in attributes.
    carried: ClassVar[tuple[str, ...]] = ("participations",)
    #: attributes a server (in ``setup``) or a round plug-in (when it is built) may set on its
    #: clients, once (``configure``): settings rebuilt from the flags and data, so checkpoints skip
    #: them; Ray actors receive them when built
    settable: ClassVar[tuple[str, ...]] = ("epoch_schedule",)
    #: which hooks the class overrides, computed once per class (flcore/capabilities.py)
    capabilities: ClassVar[Capabilities]

    #: a promise that this class's own ``begin_round``, ``start_point`` and ``end_round`` draw nothing
    #: from the global torch RNG (they use streams of their own from (seed, round, client), or none),
    #: so that the batched engine may plan its jobs lean as it plans FedAvg's. It covers the hooks the
    #: declaring class has: a subclass that overrides one of them is not covered until it declares the
    #: promise again (``Capabilities.rng_free_sequence``, flcore/capabilities.py)
    hooks_draw_no_rng: ClassVar[bool] = False
    #: hooks of ``SHORTCUT_HOOKS`` this class overrides with a faster way to the base step's gradient
    #: (the same loss, the same gradient up to float rounding), which engines and features that compute
    #: the base step their own way may ignore (``is_base_step_shortcut``, flcore/capabilities.py)
    base_step_shortcuts: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.capabilities = Capabilities.of(cls, Client, CLIENT_HOOKS)

    def __init__(self, index: int, data: ClientData, args: Namespace, state: ClientStateStore,
                 task: Task | None = None, local_step: LocalStep = PLAIN_SGD, hp: Any = None):
        self.index = index
        self.task = task
        #: the loss and metrics of the dataset's label type (flcore/objectives.py)
        self.objective = task.objective if task is not None else objective_of({})
        self.cid = data.cid
        self.data = data
        self.args = args
        #: typed, frozen: the flags this client class declares (``hp``: computed once for all clients)
        self.hp = hyperparameters(args, type(self)) if hp is None else hp
        self.state = state
        self.batch_size = int(args.batch_size)
        self.local_epochs = int(args.local_epochs)
        self.participations = 0
        #: the local epochs of each round, ``(round, client id) -> epochs``, where a round plug-in sets
        #: one (the virtual clock's slow trainers, -tsr); None: ``-ls`` every round
        self.epoch_schedule: Callable[[int, int], int] | None = None
        #: how a local step is computed: plain SGD, or the strategies the flags ask for, chained
        #: (data poisoning, DP-SGD with -dp: flcore/clients/localstep.py)
        self.local_step = local_step
        local_step.prepare(self)
        self.gradient_samples = 0  # samples of this round's gradient computations (virtual clock)
        #: heavy-ball momentum β of the local SGD (``--local_momentum``, a generic flag; 0 = plain SGD)
        self.local_momentum = float(args.local_momentum)
        if self.local_momentum and not type(self).uses_local_momentum():
            raise FLError(f"--local_momentum: {type(self).__name__} trains with its own optimiser, not the base "
                          "client's SGD; run it without --local_momentum")

    #: whether this class's local training steps through :meth:`sgd`, so that ``--local_momentum``
    #: reaches it. None: yes unless the class replaces the local procedure (``train_job``, ``sgd``,
    #: ``local_train``); a class whose own ``train_job`` still calls ``sgd`` says True, one with its
    #: own optimiser (pFedMe, Per-FedAvg, ...) keeps None and the flag is refused for it
    steps_through_sgd: ClassVar[bool | None] = None

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        """Declare this algorithm's client flags (called once per class in the MRO)."""

    @classmethod
    def uses_local_momentum(cls) -> bool:
        """Whether ``--local_momentum`` reaches this class's local training (see ``steps_through_sgd``)."""
        if cls.steps_through_sgd is not None:
            return cls.steps_through_sgd
        return not cls.capabilities.overrides_any("train_job", "sgd", "local_train")

    # ----------------------------------------------------------------- hooks
    def start_point(self, package: RoundPackage) -> torch.Tensor:
        return package.global_params

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        return {}

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        return g

    def local_loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        """The minibatch loss: the dataset's objective (cross-entropy of the logits for one class per
        sample, flcore/objectives.py)."""
        return self.objective.loss(net(x), y)

    def pre_training(self, job: LocalJob, model: FlatModel) -> None:
        """Before the local SGD: ``model`` holds ``job.start``, and the SGD starts from whatever it
        holds on return. It may train (counting its samples with ``count_gradient_samples``) and add
        context, for the SGD (the same keys for every client of a round) or for ``end_round``. It
        touches only ``job``, ``model`` and this client's own state: an engine may run it in a
        worker thread, or after other clients' ``open_job``."""

    def post_training(self, job: LocalJob, model: FlatModel) -> None:
        """After the local SGD: ``model`` holds the trained parameters (already taken as the
        upload's); a pass that needs the trained model (prototypes, soft predictions) keeps its
        results in ``job.ctx`` for ``end_round``. The contract of ``pre_training`` holds."""

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
        """The local epochs of round ``rnd``: ``-ls``, or what the ``epoch_schedule`` a plug-in set says
        (the virtual clock's slow trainers run fewer)."""
        if self.epoch_schedule is None:
            return self.local_epochs
        return self.epoch_schedule(rnd, self.cid)

    def batch_plan(self, rnd: int, epochs: int | None = None, purpose: str = "batches") -> list[torch.Tensor]:
        """Index tensors of every local minibatch of round ``rnd``, from (seed, purpose, round, client)
        only (``purpose`` names another stream for work outside training: new clients' fine-tuning).

        Each epoch is a fresh permutation; with ``drop_last`` (PFLlib's default) a trailing partial
        batch is skipped, so a client with fewer samples than the batch size takes no step. The
        local-step strategy decides (DP-SGD draws Poisson batches instead)."""
        epochs = self.epochs_this_round(rnd) if epochs is None else epochs
        return self.local_step.batch_plan(self, rnd, epochs, purpose)

    def shuffled_plan(self, rnd: int, epochs: int, purpose: str = "batches", device: torch.device | str | None = None,
                      stacked: bool = False) -> list[torch.Tensor] | torch.Tensor:
        """Plain SGD's batches (``batch_plan``): a permutation per epoch from (seed, purpose, round,
        client), on ``device`` (default: the client's data's). ``stacked=True``, where every batch
        is full: the batches as the rows of one ``[steps, B]`` tensor, which has the list's length
        and iterates as it does, without a tensor object per batch (the batched engine's lean plan)."""
        n, bs = self.num_train, self.batch_size
        generator = scratch_generator(self.args.seed, purpose, rnd, self.cid)  # used up here
        steps = self.steps_per_epoch
        full = min(steps, n // bs)  # batches of bs rows; with --drop_last False a shorter last one
        device = self.data.train_x.device if device is None else device
        orders = [torch.randperm(n, generator=generator).to(device) for _ in range(epochs)]
        if stacked and steps == full and orders:
            rows = [order[: full * bs].view(full, bs) for order in orders]
            return rows[0] if len(rows) == 1 else torch.cat(rows)
        plan = []
        for order in orders:
            plan.extend(order[: full * bs].view(full, bs).unbind(0))  # (one call, not one slice per batch)
            if steps > full:
                plan.append(order[full * bs :])
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

    def gradient_inputs(self, model: FlatModel, ctx: dict) -> list[torch.Tensor] | None:
        """The parameters whose gradient a step needs (None: all of them). A step that moves only part
        of the model (FedRep's head steps) names that part, so ``compute_gradient``'s backward pass stops
        there and the rest of ``model.grad`` stays zero. Steps computed elsewhere (the batched engine,
        DP-SGD) take every gradient, which ``adjust_grad``'s mask then zeroes as before."""
        return None

    def compute_gradient(self, model: FlatModel, idx: torch.Tensor, ctx: dict | None = None) -> torch.Tensor:
        """``local_loss`` on the minibatch ``idx``; leaves its gradient in ``model.grad``."""
        self.count_gradient_samples(idx)
        return self.batch_gradient(model, self.data.inputs("train", idx), self.data.train_y[idx], {} if ctx is None else ctx)

    def batch_gradient(self, model: FlatModel, x: torch.Tensor, y: torch.Tensor, ctx: dict) -> torch.Tensor:
        """``local_loss`` on the minibatch ``(x, y)`` (this client's rows, or a local-step strategy's
        transform of them: an attacker's poisoned labels); leaves its gradient in ``model.grad``."""
        model.zero_grad()
        loss = self.local_loss(model.net, x, y, ctx)
        loss.backward(inputs=self.gradient_inputs(model, ctx))
        return loss.detach()

    def step_gradient(self, model: FlatModel, idx: torch.Tensor, ctx: dict, package: RoundPackage,
                      step: int) -> torch.Tensor:
        """The gradient local step ``step`` of the round of ``package`` uses, left in ``model.grad``
        (returns the loss), as the client's local-step strategies compute it
        (``flcore/clients/localstep.py``): ``compute_gradient``'s, or that of the minibatch an
        attacker poisoned (``features/attacks.py``), with ``-dp`` clipped and noised per sample
        (``flcore/features/privacy/dpsgd.py``); whoever replays a step (an attack on the uploads) gets what the
        client used."""
        return self.local_step.gradient(self, model, idx, ctx, package, step)

    def check_loss(self, loss_sum: torch.Tensor | float, steps: int, rnd: int) -> float:
        """Mean loss of the round; a NaN/inf loss stops the run with advice. ``loss_sum`` may be
        a float already (an engine that reads all its clients' sums back in one transfer)."""
        mean_loss = float(loss_sum) / steps if steps else 0.0
        if not math.isfinite(mean_loss):  # (np.isfinite costs ~1 us a call, math's ~20 ns)
            raise Diverged(f"training loss became {mean_loss} on client {self.cid} in round {rnd}", rnd,
                           advice=f"lower the learning rate (-lr, now {self.learning_rate()})")
        return mean_loss

    def sgd(
        self, model: FlatModel, package: RoundPackage, ctx: dict[str, torch.Tensor], plan: list[torch.Tensor], lr: float
    ) -> float:
        """Minibatch SGD over ``plan``, each step ``w -= lr * adjust_grad(w, g)``; returns the mean loss.
        With ``--local_momentum β`` the step is ``w -= lr * v``, ``v = β·v + adjust_grad(w, g)``, with a
        buffer that lives only in this call (as a new ``torch.optim.SGD`` per local training)."""
        model.module.train()
        loss_sum = torch.zeros((), device=model.device)
        beta = self.local_momentum
        velocity: torch.Tensor | None = None
        for step, idx in enumerate(plan):
            step_ctx = self.context_at(ctx, step)
            loss_sum += self.step_gradient(model, idx, step_ctx, package, step)
            direction = self.adjust_grad(model.params, model.grad, step_ctx)
            if beta:
                # PyTorch's first step copies the gradient into the buffer (= β·0 + g)
                velocity = direction.clone() if velocity is None else velocity.mul_(beta).add_(direction)
                direction = velocity
            model.params.add_(direction, alpha=-lr)
        return self.check_loss(loss_sum, len(plan), package.round)

    def context_at(self, ctx: dict, step: int) -> dict:
        """The context local step ``step`` sees: ``per_step_context`` entries sliced at ``step``."""
        if not self.per_step_context:
            return ctx
        return {k: (v[step] if k in self.per_step_context else v) for k, v in ctx.items()}

    # ------------------------------------------------------ the client-state contract
    def carried_names(self) -> tuple[str, ...]:
        """The attributes that change across rounds: the class's ``carried`` (its bases' too) and
        the local step's."""
        return (*carried_names(type(self)), *self.local_step.carried)

    def carried_state(self) -> dict[str, Any]:
        """The values of the attributes that change across rounds (``carried_names``): what a
        checkpoint saves and what the Ray engine sends."""
        return carried_values(self, self.carried_names())

    def restore_carried_state(self, values: dict[str, Any]) -> None:
        """Set the attributes ``carried_state`` returned (a checkpoint's, or a Ray actor's)."""
        set_carried_values(self, self.carried_names(), values, f"client {self.cid}")

    def configure(self, **settings: Any) -> None:
        """Set attributes the class declares ``settable`` (servers call it in ``setup``): the one
        way a server changes its clients besides the package."""
        unknown = set(settings) - set(self.settable)
        if unknown:
            raise TypeError(f"{type(self).__name__} declares no settable {', '.join(sorted(unknown))}")
        for name, value in settings.items():
            setattr(self, name, value)

    def settings(self) -> dict[str, Any]:
        """The values of the ``settable`` attributes (sent to a Ray actor that builds this client)."""
        return {name: getattr(self, name) for name in self.settable}

    # ------------------------------------------------------ the local sequence
    def plan_job(self, package: RoundPackage) -> LocalJob:
        """Step 1: seed the global RNG from (seed, round, client) and plan the minibatches (an engine
        that computes the steps itself may plan a job its own way where that changes nothing: the
        batched engine's lean plans)."""
        self.seed_round(package.round)
        plan = self.batch_plan(package.round)
        return LocalJob(self, package, plan, rng_state(self.data.train_y.device))

    def open_job(self, job: LocalJob) -> None:
        """Step 2: the round's context, start point (with this client's private part) and lr.
        Resumes the RNG where step 1 left it, so an engine may run it later."""
        if job.rng is not None:
            set_rng_state(job.rng)
        self.gradient_samples = 0
        job.ctx = self.begin_round(job.package, job.steps)
        job.start = self.with_private(self.start_point(job.package), job.package)
        job.lr = self.learning_rate()
        if job.rng is not None:
            job.rng = rng_state(self.data.train_y.device)

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        """Step 3: local training on ``model`` (any working model); returns (params, mean loss).
        Algorithms with another local procedure override this (and set ``vectorisable = False``)."""
        model.load(job.start)
        self.pre_training(job, model)
        loss = self.sgd(model, job.package, job.ctx, job.plan, job.lr)
        params = model.snapshot()
        self.post_training(job, model)
        return params, loss

    def finish_job(self, job: LocalJob, params: torch.Tensor, loss: float) -> ClientUpdate:
        """Step 4: count the participation, build the upload, keep the private part."""
        if job.rng is not None:
            set_rng_state(job.rng)
        self.participations += 1
        self.local_step.job_finished(self, job)
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


Client.capabilities = Capabilities.of(Client, Client, CLIENT_HOOKS)
