"""The batched cohort engine (``--engine batched``): K clients' local SGD in one vectorised step.

Every local step of every selected client is one ``torch.func.vmap`` of ``grad_and_value`` over
the ``[K, D]`` tensor of stacked client models (passed as named ``[K, *shape]`` views) and a
``[B, K, ...]`` tensor of their minibatches, then one SGD update of the ``[K, D]`` tensor. Per
client it runs the one local sequence of ``clientbase`` with ``train_job`` replaced by a stacked
step::

    job = plan_job(package); open_job(job)                # the same minibatches and context
    for idx in job.plan: w -= lr * adjust_grad(w, grad local_loss(w; idx), ctx)
    finish_job(job, w, check_loss(...))

Design (what a reader should know before changing it):

* **Ragged clients.** Clients are sorted by their number of local steps (descending, stable), so
  at step ``s`` the clients that still have a batch are a *prefix* of the stacked tensor; the step
  is computed for that prefix only and the other rows are not touched. This is the padded-and-
  masked scheme with the mask folded into a slice: a client with fewer batches takes exact no-op
  steps (its row, optimizer state included, is bit-for-bit unchanged) and no FLOPs are spent on
  padding. Batch indices come from each client's own ``batch_plan`` and are turned into one
  ``[K, T_max, B]`` tensor of row indices into the concatenated training data (the server's
  evaluation cache when it exists, else a per-chunk concatenation), so a step gathers all
  clients' minibatches with one indexing op (rows and client offsets come from the dataset). Partial batches (``--drop_last False``) are padded
  and masked out of the loss (sum of per-sample losses / valid count = the mean the sequential
  engine takes).
* **Step runners.** Each step is one call of the cohort step function (``_cohort_step``: gather,
  forward, loss hook, gradient, ``adjust_grad``, update, retirement mask), run by the runner
  ``--step_runner`` picks (``capture.py``): eagerly on the prefix of active clients (a CPU), or
  on static buffers replayed from a CUDA graph (``auto`` on a GPU), where the prefix is rounded up
  to a power of two and the retired rows in it are kept exactly by an ``active`` mask. The host
  only slices precomputed device tensors per step; which steps have partial batches is known
  from the plans, so nothing is read back from the device within a chunk.
* **Chunks.** ``--cohort_chunk N`` trains at most N clients at once (0 = the whole cohort); the
  chunks are consecutive in the sorted order, so each chunk holds clients of similar length.
  ``begin_round``/``end_round`` are called chunk by chunk, so per-client context tensors of only
  one chunk are alive at a time; within a chunk both are called in cohort order.
* **Context.** The tensors of ``begin_round`` are stacked per key and vmapped with ``in_dims=0``,
  except a key whose value is *the same object* for every client of the chunk (``is``; e.g.
  FedProx's anchor ``package.global_params`` or a server-wide control): it is passed unbatched.
  Non-tensor values that are equal (``==``) for all clients are passed unbatched too.
  Keys a client class lists in ``per_step_context`` hold one entry per local step; they are
  padded to the chunk's longest plan and sliced at the current step.
* **adjust_grad.** The first client's bound ``adjust_grad`` is vmapped for all clients of its
  class (a pure function of ``(w, g, ctx)`` and of run-wide hyperparameters on ``self``); it is
  skipped when the class keeps the base identity. With an ``adjust_grad`` the per-name gradients
  are concatenated into one ``[K, P]`` tensor and the update is one fused op on ``[K, P]``; plain
  SGD updates each parameter's ``[K, *shape]`` view in place instead, which saves a full copy of
  the gradient per step (the concatenation was ~12% of a CPU step: the performance page). Learning rates are
  per client (``-ld`` decays them with each client's own participations); equal rates use a
  scalar ``add_`` (the sequential arithmetic), different ones an ``addcmul_`` with a ``[K, 1]``
  rate tensor. With ``--local_momentum`` each client's momentum buffer is a row of a ``[K, P]``
  tensor, zero at the chunk's start, updated by the sequential rule (``_update``); ``--weight_decay``'s
  λ·w (the local step's ``l2_term``) is added to each client's gradient first. When one client is left (the tail of a ragged cohort) the same function runs
  without vmap, which only adds overhead for K = 1.
* **Speed.** On a GPU the sequential engine is launch-bound (batch 10) and batching K clients
  multiplies the work per kernel; replaying the step from a CUDA graph removes the launches and
  the Python of vmap (``capture.py``). On a CPU the CNNs are compute-bound at batch 10 already, so
  batching has nothing to win and functorch's batched convolution loses: it folds the clients
  into a grouped convolution (``groups=K``) with layout copies around it and cannot use oneDNN's
  channels-last kernels; ``auto`` uses the threaded engine on CPUs. With the step captured, a
  round's cost is the host's work per client (planning, the hooks, the upload), cut to the
  sequence's own: lean plans, the index and the losses per cohort, not per client, and no CUDA
  calls per client (RNG state copies and seeding, plan copies, index kernels, read-backs). What
  bounds a round then is the step itself: cuDNN runs vmap's grouped convolution as one kernel per
  client. ``--batched_conv unfold`` (``client_conv.py``, opt-in) replaces it by one strided im2col
  over all clients and batched matrix products, and ``grouped_nhwc`` keeps the grouped
  convolution channels-last. The measurements behind each of these choices, with their commands:
  ``docs/results/performance.md``, "The batched engine: CPU steps, host cost per client and the
  GPU's convolution".
* **Memory.** ``--cohort_chunk`` bounds how many clients are trained at once. When the device
  runs out of memory anyway, the chunk is halved and retried from its start points (a warning
  says so), so ``auto``, which trains whole cohorts on a GPU, does not fail on a large cohort.
* **Who is batched.** A client is batched when its class says ``vectorisable = True`` and keeps
  the base ``train_job``, ``sgd`` and ``compute_gradient`` (the batched step re-implements
  exactly those; its ``pre_training`` and ``post_training`` run one client at a time on the
  server's working model, before the chunk's steps and before its ``finish_job``), with the base ``local_loss`` or one it declares vmappable
  (``vmappable_loss = True``; such a loss gets a functional :class:`~flcore.flat.Net` of each
  client's parameters and its context, and needs full batches, ``--drop_last``); other clients
  are trained by the sequential sequence on the server's working model, in cohort order before
  the batched groups.
* **Which models.** The model must be a deterministic, buffer-free function of its parameters in
  train mode. Models with float buffers (BatchNorm running statistics: functorch cannot update
  them per client under ``grad``) and models with dropout (``vmap(randomness="different")``
  cannot reproduce the sequential engine's per-client ``seed_round`` stream) fall back to the
  sequential engine with one notice, as does a model whose forward fails under ``vmap``. Dropout
  is detected by module type and, for functional dropout inside ``forward``, by a probe that runs
  the model twice in train mode under different seeds.
* **Randomness.** Nothing here draws random numbers: batches come from ``batch_plan`` (seeded by
  (seed, round, client)), so a client's update does not depend on which clients share its chunk
  or in which order the cohort is given, beyond float rounding of differently shaped kernels.
  ``seed_round`` is still called before each client's ``begin_round``, the global torch RNG state
  after it is restored before that client's ``end_round``, and the round ends with the state the
  last client's ``end_round`` left: a hook that draws from the global RNG sees exactly the stream
  it sees under the sequential engine. A client whose sequence has no hook that could draw
  (:func:`leaves_rng_alone`: FedAvg's) is planned lean instead (:func:`lean_job`): no seeding and
  no state copies per client, its batch indices drawn on the host and moved for the whole chunk at
  once; the cohort's last client is seeded at the end, which leaves the same state (why:
  P2's round on a GPU was bound by such per-client host work).
* **Equivalence.** Same seed, same batches, same arithmetic per client: the global model after a
  round matches the sequential engine's up to float rounding (vmapped kernels sum in another
  order; ``tests/engines/test_batched.py`` checks every vectorisable algorithm).
* **Side effects.** ``begin_round`` of every client of a chunk runs before any of their
  ``end_round``: hooks must touch only the client's own state (the contract that makes a client
  batchable in the first place). The server's working model holds the last cohort client's final
  vector afterwards, as with the sequential engine.
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.func import functional_call, grad_and_value, vmap

from flcore.capabilities import RNG_FREE_SEQUENCE
from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, LocalJob, RoundPackage, Runtime
from flcore.engines.base import Engine, has_dropout, keeps_base_training
from flcore.engines.capture import STEP_RUNNERS, make_step_runner
from flcore.engines.client_conv import BATCHED_CONVS, batched_convolutions
from flcore.engines.precision import check_precision, precision_context
from flcore.flat import Net
from flcore.registry import register_engine
from flcore.trainmodel.layout import plain_convolutions
from cli.flags import add_flag, hyperparameters
from fldata.loading import decode_inputs
from utils.errors import FLError
from utils.mem_utils import OUT_OF_MEMORY
from utils.seeding import set_rng_state

if TYPE_CHECKING:
    from flcore.protocol import Runtime

log = logging.getLogger("fl")


def flat_device(runtime: Runtime) -> torch.device:
    return runtime.model.device


def _same_for_all(values: list[Any]) -> bool:
    first = values[0]
    if all(v is first for v in values):
        return True
    if isinstance(first, torch.Tensor):
        return False
    try:
        return all(not isinstance(v, torch.Tensor) and bool(v == first) for v in values)
    except Exception:  # noqa: BLE001 - an odd value type is simply stacked
        return False


def _pad_steps(value: torch.Tensor, steps: int) -> torch.Tensor:
    if value.shape[0] == steps:
        return value
    pad = value.new_zeros((steps - value.shape[0], *value.shape[1:]))
    return torch.cat([value, pad])


def _at_step(value, step: int | None, dim: int | None):
    """A per-step context entry at ``step`` (axis 1 when stacked over clients, else axis 0)."""
    if step is None:
        return value
    return value[:, step] if dim == 0 else value[step]


def stack_contexts(ctxs: list[dict[str, Any]], device: torch.device) -> tuple[dict[str, Any], dict[str, int | None]]:
    """(values, in_dims) for vmap: one entry per key, stacked on axis 0 unless shared by all."""
    if not ctxs:
        return {}, {}
    keys = list(ctxs[0])
    for ctx in ctxs[1:]:
        if set(ctx) != set(keys):
            raise RuntimeError("begin_round returned different context keys for clients of one class")
    values: dict[str, Any] = {}
    dims: dict[str, int | None] = {}
    for key in keys:
        items = [ctx[key] for ctx in ctxs]
        if _same_for_all(items):
            values[key], dims[key] = items[0], None
        else:
            values[key] = torch.stack([torch.as_tensor(v, device=device) for v in items])
            dims[key] = 0
    return values, dims


def leaves_rng_alone(client: Client) -> bool:
    """Whether nothing of ``client``'s sequence outside ``train_job`` reads the global RNG: its class
    overrides none of ``RNG_FREE_SEQUENCE`` (the base versions draw nothing from it: the plan has its
    own generator) but hooks it promises draw nothing (``Capabilities.rng_free_sequence``), nor
    replaces one on the object, and it trains by plain SGD's local step. Then the RNG is the one
    ``seed_round`` leaves wherever the sequence resumes it, so a job this engine trains may be planned
    lean (:func:`lean_job`) and only the cohort's last client seeded at the end, which leaves the RNG
    as the sequential engine does."""
    return (type(client).capabilities.rng_free_sequence and client.local_step.l2_term is not None
            and client.__dict__.keys().isdisjoint(RNG_FREE_SEQUENCE))


def lean_job(client: Client, package: RoundPackage) -> LocalJob:
    """``client.plan_job(package)``'s job without its host work, for a client that
    :func:`leaves_rng_alone`: the RNG is neither seeded nor kept (``job.rng`` is None, and the later
    steps leave it alone too), and the batch indices stay on the CPU where they are drawn (the engine
    moves the whole cohort's at once), as the rows of one tensor where every batch is full
    (``shuffled_plan(stacked=True)``). The batches are ``batch_plan``'s, which for such a client are
    ``shuffled_plan``'s."""
    if not leaves_rng_alone(client):
        raise RuntimeError(f"a lean job for {type(client).__name__}, whose sequence may read the global RNG")
    rnd = package.round
    return LocalJob(client, package, client.shuffled_plan(rnd, client.epochs_this_round(rnd), device="cpu", stacked=True),
                    None)


@register_engine("batched")
class BatchedEngine(Engine):
    """Train the vectorisable part of the cohort with ``torch.func``; the rest sequentially."""

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--cohort_chunk", type=int, default=0, low=0,
                 help="batched engine: train at most this many clients at once (0 = the whole cohort); "
                      "bounds memory to chunk x (model + context + activations)")
        add_flag(parser, "--step_runner", type=str, default="auto", choices=list(STEP_RUNNERS),
                 help="batched engine: how the cohort step runs: auto (graph on a GPU, eager elsewhere), eager, "
                      "graph (replayed from a CUDA graph per cohort and batch shape), compiled (torch.compile)")
        add_flag(parser, "--batched_conv", type=str, default="grouped", choices=list(BATCHED_CONVS),
                 help="batched engine: how the vmapped step convolves the clients: grouped (vmap's rule: one grouped "
                      "convolution, the clients as groups), unfold (im2col over all clients and batched matrix "
                      "products) or grouped_nhwc (vmap's grouped convolution in the channels-last layout); "
                      "flcore/engines/client_conv.py; equal up to float rounding")

    def __init__(self, runtime: "Runtime"):
        super().__init__(runtime)
        hp = hyperparameters(runtime.args, BatchedEngine)  # typed: the flags this engine declares
        self.chunk = hp.cohort_chunk
        if self.chunk < 0:
            raise FLError(f"--cohort_chunk must be >= 0, got {self.chunk}")
        self.precision = check_precision(runtime.args, flat_device(runtime))
        self.runner = make_step_runner(hp.step_runner, flat_device(runtime),
                                       lambda message: self.notice(message, message))
        self.batched_conv = hp.batched_conv
        if self.batched_conv not in BATCHED_CONVS:
            raise FLError(f"--batched_conv {self.batched_conv}: choose one of {', '.join(BATCHED_CONVS)}")
        self._step_fns: dict[tuple, Callable] = {}
        self._finals: dict[int, torch.Tensor] = {}
        self._rng_after: dict[int, tuple] = {}
        self._reseed: set[int] = set()  # clients planned lean (their RNG neither seeded nor kept)
        self._last_index: int | None = None
        self.stats = {"batched_clients": 0, "sequential_clients": 0}

    # ------------------------------------------------------------ qualification
    def client_fallback_reason(self, client: Client) -> str | None:
        if not keeps_base_training(client):
            return "is not vectorisable"
        if client.local_step.l2_term is None:
            return f"trains with {client.local_step.name}, which the batched step does not compute"
        caps = type(client).capabilities
        if caps.own_loss:
            if not caps.vmappable_loss:
                return "has a loss hook that is not declared vmappable"
            if not self.runtime.args.drop_last:
                return "has its own loss, which the batched engine runs on full batches only (--drop_last)"
        return None

    def check_model(self) -> str | None:
        flat, module = self.flat, self.flat.module
        if flat.num_total > flat.num_params:
            return "the model has float buffers (BatchNorm running statistics), which the batched step cannot update per client"
        if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules()):
            # also without running statistics: a sample's output depends on its batch, and the
            # batched step pads partial batches with repeated rows
            return "the model has BatchNorm, whose batch statistics the batched step's padded batches would change"
        if has_dropout(module):
            return "the model has dropout, whose per-client random masks only the sequential engine reproduces"
        if not flat.vector.is_floating_point():
            return "the model is not floating point"
        x = self.runtime.dataset.sample_inputs(2).to(flat.device)
        saved = flat.vector.detach().clone()
        was_training = module.training
        try:
            module.train()
            with torch.no_grad(), torch.random.fork_rng(devices=[flat.device] if flat.device.type == "cuda" else []):
                torch.manual_seed(1)
                first = module(x)
                torch.manual_seed(2)
                second = module(x)
            if not torch.equal(first, second):
                return "the model's forward pass is random in train mode (dropout), which only the sequential engine reproduces per client"
            label_shape = self.runtime.dataset.split("train")[1].shape[1:]  # a multi-label row: [T] label ids
            y = torch.zeros(2, len(x), *label_shape, dtype=torch.long, device=x.device)
            rows = flat.params.detach().unsqueeze(0).repeat(2, 1)
            with plain_convolutions(), batched_convolutions(self.batched_conv):
                self._step(Client, False)(self._param_views(rows), x.unsqueeze(1).expand(len(x), 2, *x.shape[1:]), y)
        except Exception as exc:  # noqa: BLE001 - any failure means: train it sequentially
            return f"the model cannot run under torch.func.vmap ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        finally:
            flat.vector.copy_(saved)
            module.train(was_training)
        return None

    # ------------------------------------------------------------ the vmapped step
    def _step(self, owner: Client | type, masked: bool, batched: bool = True, ctx_dims: dict | None = None) -> Callable:
        """vmap(grad_and_value(loss)) over (params {name: [K, ...]}, x [B, K, ...], y [K, B][, mask
        [K, B]][, ctx]); with ``batched=False`` the same function for one client without vmap (the
        tail of a ragged cohort, where a vmap over one client only adds overhead).

        The loss is cross-entropy, or ``owner``'s own ``local_loss`` (a vmappable loss hook) on a
        functional :class:`Net` of the client's parameters, which then also gets the context.
        The parameters go in as named views of the ``[K, D]`` tensor and the gradients come back
        per name, so the plain SGD update needs no flat copy of the gradient. The inputs carry the
        client axis second: functorch's batched convolution folds it into the channel axis
        (``groups=K``), which is then a free view instead of a transposing copy per layer."""
        cls = owner if isinstance(owner, type) else type(owner)
        own_loss = cls.capabilities.own_loss
        dims_key = tuple(sorted((ctx_dims or {}).items())) if own_loss else ()
        key = (cls if own_loss else Client, masked, batched, dims_key)
        fn = self._step_fns.get(key)
        if fn is not None:
            return fn
        module, flat = self.flat.module, self.flat
        objective = self.runtime.objective  # the dataset's loss (flcore/objectives.py)

        if own_loss:
            hook = owner.local_loss

            def loss_fn(params, x, y, ctx):
                return hook(Net(module, flat, params), x, y, ctx)

            in_dims: tuple = (0, 1, 0, dict(ctx_dims or {}))
        elif masked:
            def loss_fn(params, x, y, m):
                per_sample = objective.loss(functional_call(module, params, (x,)), y, reduction="none")
                return (per_sample * m).sum() / m.sum()

            in_dims = (0, 1, 0, 0)
        else:
            def loss_fn(params, x, y):
                return objective.loss(functional_call(module, params, (x,)), y)

            in_dims = (0, 1, 0)
        fn = vmap(grad_and_value(loss_fn), in_dims=in_dims) if batched else grad_and_value(loss_fn)
        self._step_fns[key] = fn
        return fn

    def _param_views(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named ``[K, *shape]`` views of the trainable part of ``rows`` ([K, D])."""
        count = rows.shape[0]
        return {s.name: rows[:, s.start : s.stop].view(count, *s.shape) for s in self.flat.param_segments()}

    # ------------------------------------------------------------ data
    def _data_for(self, clients: list[Client]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """(x, y, row offset of each client) covering ``clients``' training data: the dataset's
        merged training split, which the clients' tensors are views of."""
        dataset = self.runtime.dataset
        x, y = dataset.split("train")
        offsets = dataset.offsets("train")
        return x, y, [offsets[c.index] for c in clients]

    # ------------------------------------------------------------ training
    def train_sequentially(self, client: Client, package: RoundPackage) -> ClientUpdate:
        with precision_context(self.precision, self.flat.device):  # the batched step applies it itself
            return super().train_sequentially(client, package)

    def train(self, clients: list[Client], package: RoundPackage) -> list[ClientUpdate]:
        updates: list[ClientUpdate | None] = [None] * len(clients)
        groups: dict[type, list[int]] = {}
        # only the last cohort client's RNG is needed (end_like_sequential): one state copy a round
        self._last_index = clients[-1].index if clients else None
        qualified: dict[tuple, bool] = {}  # the answer depends on the class and the local step only
        for pos, client in enumerate(clients):
            kind = (type(client), client.local_step)
            if kind not in qualified:
                qualified[kind] = self.qualifies(client)
            if qualified[kind]:
                groups.setdefault(type(client), []).append(pos)
            else:
                updates[pos] = self.train_sequentially(client, package)
                if client.index == self._last_index:
                    self._rng_after[client.index] = self.rng_now()
        self._finals = {}
        for positions in groups.values():
            group = [clients[p] for p in positions]
            for pos, update in zip(positions, self._train_group(group, package)):
                updates[pos] = update
            self.stats["batched_clients"] += len(group)
        if clients:
            last = clients[-1].index
            self.end_like_sequential(self._finals.get(last), self._rng_after.get(last))
            if last in self._reseed:  # planned lean: its sequence ends with the RNG its seed_round leaves
                clients[-1].seed_round(package.round)
        self._finals, self._rng_after, self._reseed = {}, {}, set()
        return updates  # type: ignore[return-value]

    def _train_group(self, clients: list[Client], package: RoundPackage) -> list[ClientUpdate]:
        """Batched local training of clients of one class; updates in the given order."""
        # a client whose sequence leaves the global RNG alone is planned lean: neither seeded nor
        # its RNG state copied, and its batches stay on the host (~20 us a client, more
        # with a GPU's generator, and a host-to-device copy); ``train`` seeds the last one at the end
        lean = all(leaves_rng_alone(client) for client in clients)
        jobs = [lean_job(client, package) if lean else client.plan_job(package) for client in clients]
        if lean:  # (groups keep cohort order: the cohort's last client, if here, is the group's last)
            self._reseed.add(clients[-1].index)
        order = sorted(range(len(clients)), key=lambda k: -jobs[k].steps)
        size = self.chunk if self.chunk > 0 else len(clients)
        updates: list[ClientUpdate | None] = [None] * len(clients)
        for start in range(0, len(order), size):
            members = order[start : start + size]
            for k, update in self._train_chunk([jobs[k] for k in members]):
                updates[members[k]] = update
        return updates  # type: ignore[return-value]

    def _train_chunk(self, jobs: list[LocalJob]) -> list[tuple[int, ClientUpdate]]:
        """Train one chunk (sorted by steps, descending); returns (chunk position, update) pairs."""
        flat = self.flat
        device = flat.device
        count = len(jobs)
        cohort_order = sorted(range(count), key=lambda j: jobs[j].client.index)
        for j in cohort_order:
            jobs[j].client.open_job(jobs[j])
            if "pre_training" in type(jobs[j].client).capabilities.overrides:  # KT-pFL's distillation
                jobs[j].start = self._around_sgd(jobs[j], "pre_training", jobs[j].start)

        weights = torch.stack([job.start.to(device=device, dtype=flat.vector.dtype) for job in jobs])  # [K, D], fresh
        losses = torch.zeros(count, dtype=weights.dtype, device=device)
        if max(job.steps for job in jobs):
            self._run_steps_fitting(jobs, weights, losses)

        out = []
        loss_sums = losses.tolist()  # one transfer for the chunk, not one (and a sync) per client
        finals = weights.unbind(0)  # the clients' rows as views, in one call
        for j in cohort_order:
            job = jobs[j]
            client = job.client
            loss = client.check_loss(loss_sums[j], job.steps, job.package.round)
            if isinstance(job.plan, torch.Tensor):  # a lean plan's batches, all at once
                client.count_gradient_samples(job.plan)
            else:
                for idx in job.plan:  # the vectorised steps' samples, beside those a pre_training counted
                    client.count_gradient_samples(idx)
            if "post_training" in type(client).capabilities.overrides:  # prototypes, soft predictions
                self._around_sgd(job, "post_training", finals[j])
            self._finals[client.index] = finals[j]
            out.append((j, client.finish_job(job, finals[j], loss)))
            if client.index == self._last_index:
                self._rng_after[client.index] = self.rng_now()
        return out

    def _around_sgd(self, job: LocalJob, hook: str, params: torch.Tensor) -> torch.Tensor:
        """The client's ``pre_training`` or ``post_training`` on the server's working model loaded
        with ``params``, from the global RNG state its ``open_job`` left (as sequentially, where
        nothing draws from it in between without dropout); returns the model it leaves."""
        set_rng_state(job.rng)
        self.flat.load(params)
        with precision_context(self.precision, self.flat.device):
            getattr(job.client, hook)(job, self.flat)
        return self.flat.snapshot()

    def _run_steps_fitting(self, jobs: list[LocalJob], weights: torch.Tensor, losses: torch.Tensor) -> None:
        """``_run_steps``, in halves when the device runs out of memory (and with half the chunk
        from then on), so that ``auto`` on a GPU never fails for a cohort too large to train at once.
        Each half restarts from its clients' start points, so the result is that of a smaller
        ``--cohort_chunk``. The halves are contiguous, hence still sorted by step count."""
        try:
            self._run_steps(jobs, weights, losses)
            return
        except OUT_OF_MEMORY:
            if len(jobs) == 1:
                raise
        if weights.device.type == "cuda":
            torch.cuda.empty_cache()
        half = (len(jobs) + 1) // 2
        self.chunk = half if self.chunk <= 0 else min(self.chunk, half)
        log.warning("engine %s: out of memory training %d clients at once; continuing with --cohort_chunk %d",
                    self.registered_name, len(jobs), self.chunk)
        for part in (slice(0, half), slice(half, len(jobs))):
            rows = weights[part]
            for row, job in zip(rows, jobs[part]):
                row.copy_(job.start)
            losses[part] = 0
            self._run_steps_fitting(jobs[part], rows, losses[part])

    def _run_steps(self, jobs: list[LocalJob], weights: torch.Tensor, losses: torch.Tensor) -> None:
        """The chunk's local steps, each one call of the cohort step through ``self.runner``.

        Per step the host only slices precomputed device tensors (batch rows, masks, per-step
        context): nothing is read back from the device until the chunk's losses are checked."""
        flat = self.flat
        device = weights.device
        clients = [job.client for job in jobs]
        plans, steps = [job.plan for job in jobs], [job.steps for job in jobs]
        ctxs, lrs = [job.ctx for job in jobs], [job.lr for job in jobs]
        count, max_steps = len(clients), max(steps)
        _, _, offsets = self._data_for(clients)

        # [K, T_max, B] rows into the training data; a sample mask only where some batch is
        # partial (--drop_last False), and which steps have one (known here, without a sync)
        mask: torch.Tensor | None = None
        partial_steps: set[int] = set()
        if all(isinstance(plan, torch.Tensor) for plan in plans):  # lean plans: [steps, B] of full batches
            bs, rows = plans[0].shape[1], torch.cat(plans)  # (on the host: one copy below)
            full = True
        else:  # (a lean plan with a short last batch is a list; one without, its rows)
            plans = [list(plan) if isinstance(plan, torch.Tensor) else plan for plan in plans]
            sizes = [b.shape[0] for p in plans for b in p]  # (Tensor.__len__ is a Python method: 5x slower)
            bs = max(sizes)
            full = min(sizes) == bs
            if full:  # (the rows are joined only where they are used)
                rows = torch.cat([b for plan in plans for b in plan])
        if full:
            # full batches only (every batch has at most bs rows): the whole index in a few ops,
            # not three per client (per-client host work and kernel launches)
            rows = rows.view(-1, bs)
            rows += torch.tensor(offsets, device=rows.device).repeat_interleave(
                torch.tensor(steps, device=rows.device)).unsqueeze(1)
            index = self._place_steps(rows.to(device), steps, max_steps, device)
            plans = []  # placed
        else:
            index = torch.zeros(count, max_steps, bs, dtype=torch.long, device=device)
        for j, plan in enumerate(plans):
            if not plan:
                continue
            if all(len(b) == bs for b in plan):
                index[j, : len(plan)] = torch.stack(plan).to(device) + offsets[j]
                continue
            if mask is None:
                mask = torch.ones(count, max_steps, bs, dtype=weights.dtype, device=device)
            for t, b in enumerate(plan):
                index[j, t, : len(b)] = b.to(device) + offsets[j]
                index[j, t, len(b) :] = offsets[j]
                if len(b) < bs:
                    mask[j, t, len(b) :] = 0
                    partial_steps.add(t)
        active = [sum(1 for s in steps if s > t) for t in range(max_steps)]  # a prefix (sorted by steps)
        alive = torch.arange(max_steps, device=device) < torch.tensor(steps, device=device).unsqueeze(1)  # [K, T]

        owner = clients[0]
        per_step = set(type(owner).per_step_context)
        if per_step:  # one entry per step: pad the shorter clients' (their padded steps never run)
            ctxs = [{k: (_pad_steps(v, max_steps) if k in per_step else v) for k, v in ctx.items()} for ctx in ctxs]
        ctx_values, ctx_dims = stack_contexts(ctxs, device)
        lr_col = torch.tensor(lrs, dtype=weights.dtype, device=device).unsqueeze(1)

        flat.module.train()
        runner = self.runner
        # one segment for the chunk: the step function trains the first n rows of these tensors
        consts = {"lr": lr_col, "ctx": {k: v for k, v in ctx_values.items() if k not in per_step}}
        state = {"weights": weights, "losses": losses}
        if owner.local_momentum:  # --local_momentum: each client's buffer, zero at the job's start
            state["velocity"] = torch.zeros(count, flat.num_params, dtype=weights.dtype, device=device)
        segment = runner.open(state, consts)
        # vmap has no channels-last batched weights; --batched_conv picks how the clients' convolutions run
        with torch.no_grad(), plain_convolutions(), batched_convolutions(self.batched_conv):
            for t in range(max_steps):
                n = runner.rows_for(active[t], count)
                masked = t in partial_steps
                inputs: dict[str, Any] = {"rows": index[:n, t]}
                if n > active[t]:
                    inputs["active"] = alive[:n, t]
                if masked:
                    inputs["mask"] = mask[:n, t]  # type: ignore[index]
                if per_step:
                    inputs["ctx"] = {k: _at_step(v[:n] if ctx_dims[k] == 0 else v, t, ctx_dims[k])
                                     for k, v in ctx_values.items() if k in per_step}
                segment.step(self._cohort_step(owner, masked, n > 1, ctx_dims, "active" in inputs), inputs)
        segment.close()

    @staticmethod
    def _place_steps(rows: torch.Tensor, steps: list[int], max_steps: int, device: torch.device) -> torch.Tensor:
        """The ``[K, T_max, B]`` index holding each client's ``steps[j]`` rows of ``rows`` (client by
        client, in step order) at its first steps, zero after them."""
        count, bs = len(steps), rows.shape[1]
        if all(s == max_steps for s in steps):
            return rows.view(count, max_steps, bs)
        index = torch.zeros(count * max_steps, bs, dtype=torch.long, device=device)
        first = torch.arange(count).mul_(max_steps).repeat_interleave(torch.tensor(steps))  # each row's client's start
        within = torch.arange(len(rows)) - torch.tensor([0, *steps[:-1]]).cumsum(0).repeat_interleave(torch.tensor(steps))
        index.index_copy_(0, (first + within).to(device), rows)
        return index.view(count, max_steps, bs)

    def _cohort_step(self, owner: Client, masked: bool, batched: bool, ctx_dims: dict, retire: bool) -> Callable:
        """One local step of the first n rows (n = the rows of ``inputs["rows"]``):
        ``fn(state, inputs, consts)`` updating ``state["weights"][:n]`` and adding to
        ``state["losses"][:n]`` in place; the function a step runner runs or captures (cached, so
        that captured graphs are found again next round). ``state`` and ``consts`` hold the whole
        chunk (K rows), so one set of static buffers serves every bucket of rows.

        ``inputs``: ``rows`` [n, B] rows of the training data, ``mask`` [n, B] (partial batches),
        ``active`` [n] (with ``retire``: rows whose client has no batch left keep their weights
        and loss exactly), ``ctx`` the per-step context entries. ``consts``: ``lr`` [K, 1] and the
        rest of the context (per-client entries [K, ...]). With ``--local_momentum`` ``state`` also
        holds ``velocity`` [K, P], the clients' momentum buffers."""
        cls = type(owner)
        own_loss = cls.capabilities.own_loss
        adjust = owner.adjust_grad if "adjust_grad" in cls.capabilities.overrides else None
        dims_key = tuple(sorted(ctx_dims.items()))
        x_all, y_all = self.runtime.dataset.split("train")
        beta, decay = owner.local_momentum, owner.local_step.l2_term
        key = ("cohort", cls if (own_loss or adjust) else Client, masked, batched, dims_key, retire, self.precision,
               x_all.data_ptr(), y_all.data_ptr(), beta, decay)
        fn = self._step_fns.get(key)
        if fn is not None:
            return fn
        grad_fn = self._step(owner, masked and not own_loss, batched, ctx_dims)
        vadjust = None
        if adjust is not None:
            vadjust = vmap(adjust, in_dims=(0, 0, ctx_dims)) if batched else adjust
        flat, precision = self.flat, self.precision
        table = self.runtime.dataset.input_table
        device = flat.device
        num_params = flat.num_params
        segments = flat.param_segments()

        def step(state: dict, inputs: dict, consts: dict) -> None:
            index = inputs["rows"]
            n = index.shape[0]
            weights, losses = state["weights"][:n], state["losses"][:n]
            params = weights[:, :num_params]
            views = {s.name: params[:, s.start : s.stop].view(n, *s.shape) for s in segments}
            velocity = state["velocity"][:n] if beta else None
            ctx = {k: (v[:n] if ctx_dims[k] == 0 else v) for k, v in consts["ctx"].items()}
            ctx.update(inputs.get("ctx", {}))
            if batched:
                x, y = decode_inputs(x_all[index.t()], table), y_all[index]  # x: [B, n, ...] (client axis second)
                extra: tuple = (ctx,) if own_loss else ((inputs["mask"],) if masked else ())
                with precision_context(precision, device):
                    grads, loss = grad_fn(views, x, y, *extra)
            else:  # one row: the same function without vmap
                one_ctx = {k: (v[0] if ctx_dims[k] == 0 else v) for k, v in ctx.items()}
                extra = (one_ctx,) if own_loss else ((inputs["mask"][0],) if masked else ())
                with precision_context(precision, device):
                    grads, loss = grad_fn({k: v[0] for k, v in views.items()}, decode_inputs(x_all[index[0]], table),
                                          y_all[index[0]], *extra)
                grads, loss = {k: g.unsqueeze(0) for k, g in grads.items()}, loss.unsqueeze(0)
                ctx = one_ctx
            keep = inputs["active"] if retire else None
            lr = consts["lr"][:n]
            if vadjust is not None:
                # the algorithm's term works on flat vectors: one [n, P] gradient, one fused update
                flat_grad = torch.cat([grads[s.name].reshape(n, -1) for s in segments], dim=1)
                del grads  # peak memory: the per-name gradients are no longer needed
                if decay:  # --weight_decay's λ·w, before the algorithm's term (as the sequential chain)
                    flat_grad.add_(params, alpha=decay)
                direction = vadjust(params, flat_grad, ctx) if batched else vadjust(params[0], flat_grad[0], ctx).unsqueeze(0)
                _update(params, lr, direction.to(params.dtype), keep, velocity, beta)
            else:
                # plain SGD: update each parameter's view in place (no flat gradient copy)
                for s in segments:
                    g = grads[s.name] if not decay else grads[s.name].add(views[s.name], alpha=decay)
                    buffer = None if velocity is None else velocity[:, s.start : s.stop].view(n, *s.shape)
                    _update(views[s.name], lr.view(n, *([1] * (g.dim() - 1))), g, keep, buffer, beta)
            loss = loss.to(losses.dtype)
            losses.add_(loss if keep is None else torch.where(keep, loss, torch.zeros_like(loss)))

        self._step_fns[key] = step
        return step


def _update(target: torch.Tensor, lr: torch.Tensor, direction: torch.Tensor, keep: torch.Tensor | None,
            velocity: torch.Tensor | None = None, beta: float = 0.0) -> None:
    """``target -= lr * direction`` in place; rows where ``keep`` is False stay exactly as they are.
    With a momentum buffer ``velocity`` (``--local_momentum β``, the sequential ``Client.sgd``'s rule):
    ``velocity = β·velocity + direction``, then ``target -= lr * velocity``, on the kept rows only."""
    if velocity is not None:
        if keep is None:  # every row moves: the buffer in place
            direction = velocity.mul_(beta).add_(direction)
        else:
            moved = velocity.mul(beta).add_(direction)
            velocity.copy_(torch.where(keep.view(-1, *([1] * (velocity.dim() - 1))), moved, velocity))
            direction = moved
    if keep is None:
        target.addcmul_(lr, direction, value=-1)
        return
    moved = torch.addcmul(target, lr, direction, value=-1)
    target.copy_(torch.where(keep.view(-1, *([1] * (target.dim() - 1))), moved, target))
