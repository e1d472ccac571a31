"""The batched cohort engine (``--engine batched``): K clients' local SGD in one vectorised step.

Every local step of every selected client is one ``torch.func.vmap`` of ``grad_and_value`` over
the ``[K, D]`` tensor of stacked client models (passed as named ``[K, *shape]`` views) and a
``[B, K, ...]`` tensor of their minibatches, then one SGD update of the ``[K, D]`` tensor. Per
client it runs exactly the sequential engine's procedure (``Client.local_train``)::

    seed_round(t); plan = batch_plan(t)                  # the same minibatches as sequentially
    ctx = begin_round(package, len(plan)); w = start_point(package); lr = learning_rate()
    for idx in plan: w -= lr * adjust_grad(w, grad CE(w; idx), ctx)
    check_loss(...); participations += 1; end_round(w, package, ctx, len(plan), loss)

Design (what a reader should know before changing it):

* **Ragged clients.** Clients are sorted by their number of local steps (descending, stable), so
  at step ``s`` the clients that still have a batch are a *prefix* of the stacked tensor; the step
  is computed for that prefix only and the other rows are not touched. This is the padded-and-
  masked scheme with the mask folded into a slice: a client with fewer batches takes exact no-op
  steps (its row, optimizer state included, is bit-for-bit unchanged) and no FLOPs are spent on
  padding. Batch indices come from each client's own ``batch_plan`` and are turned into one
  ``[K, T_max, B]`` tensor of row indices into the concatenated training data (the server's
  evaluation cache when it exists, else a per-chunk concatenation), so a step gathers all
  clients' minibatches with one indexing op. Partial batches (``--drop_last False``) are padded
  and masked out of the loss (sum of per-sample losses / valid count = the mean the sequential
  engine takes).
* **Chunks.** ``--cohort_chunk N`` trains at most N clients at once (0 = the whole cohort); the
  chunks are consecutive in the sorted order, so each chunk holds clients of similar length.
  ``begin_round``/``end_round`` are called chunk by chunk, so per-client context tensors of only
  one chunk are alive at a time; within a chunk both are called in cohort order.
* **Context.** The tensors of ``begin_round`` are stacked per key and vmapped with ``in_dims=0``,
  except a key whose value is *the same object* for every client of the chunk (``is``; e.g.
  FedProx's anchor ``package.global_params`` or a server-wide control): it is passed unbatched.
  Non-tensor values that are equal (``==``) for all clients are passed unbatched too.
* **adjust_grad.** The first client's bound ``adjust_grad`` is vmapped for all clients of its
  class (a pure function of ``(w, g, ctx)`` and of run-wide hyperparameters on ``self``); it is
  skipped when the class keeps the base identity. With an ``adjust_grad`` the per-name gradients
  are concatenated into one ``[K, P]`` tensor and the update is one fused op on ``[K, P]``; plain
  SGD updates each parameter's ``[K, *shape]`` view in place instead, which saves a full copy of
  the gradient per step (measured: the concatenation was ~12% of a CPU step). Learning rates are
  per client (``-ld`` decays them with each client's own participations); equal rates use a
  scalar ``add_`` (the sequential arithmetic), different ones an ``addcmul_`` with a ``[K, 1]``
  rate tensor. When one client is left (the tail of a ragged cohort) the same function runs
  without vmap, which only adds overhead for K = 1.
* **Speed.** On a GPU the sequential engine is launch-bound (batch 10) and batching K clients
  multiplies the work per kernel. On a CPU the CNNs are compute-bound at batch 10 already, so
  batching has nothing to win and functorch's batched convolution loses: it folds the clients
  into a grouped convolution (``groups=K``) with layout copies around it and cannot use oneDNN's
  channels-last kernels. Measured on the project's 2-core EPYC (torch 2.13, idle), one step of
  the CIFAR-shaped CNN at batch 10 per client: 3.9 ms sequentially (channels-last, 2 threads),
  8.1-8.4 ms per client under vmap over 50 clients, 5.7 ms for a hand-written channels-last
  grouped convolution. P2's round (250 client steps) therefore has a floor of about 0.98 s on
  this CPU; the sequential engine takes 1.22 s and the threaded one 1.04 s, so no batched engine
  can be 1.2x faster than the sequential one there. ``auto`` uses the threaded engine on CPUs.
* **Memory.** ``--cohort_chunk`` bounds how many clients are trained at once. When the device
  runs out of memory anyway, the chunk is halved and retried from its start points (a warning
  says so), so ``auto``, which trains whole cohorts on a GPU, does not fail on a large cohort.
* **Who is batched.** A client is batched when its class says ``vectorisable = True`` and keeps
  the base ``local_train``, ``sgd`` and ``compute_gradient`` (the batched step re-implements
  exactly those three); other clients are trained by their own ``local_train`` on the server's
  working model, i.e. by the sequential engine, in cohort order before the batched groups.
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
  it sees under the sequential engine.
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
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from flcore.clients.clientbase import Client, ClientUpdate, RoundPackage
from flcore.registry import register_engine
from flcore.trainmodel.layout import plain_convolutions
from utils.cli import add_flag
from utils.data_utils import decode_inputs
from utils.mem_utils import OUT_OF_MEMORY

if TYPE_CHECKING:
    from flcore.servers.serverbase import Server

log = logging.getLogger("fl")


def client_is_vectorisable(client: Client) -> bool:
    """True when the batched step reproduces ``client.local_train`` exactly."""
    cls = type(client)
    return (
        bool(getattr(cls, "vectorisable", False))
        and cls.local_train is Client.local_train
        and cls.sgd is Client.sgd
        and cls.compute_gradient is Client.compute_gradient
    )


def _rng_state(device: torch.device) -> tuple:
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state: tuple, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _has_dropout(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and float(m.p) > 0 for m in module.modules())


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


@register_engine("batched")
class BatchedEngine:
    """Train the vectorisable part of the cohort with ``torch.func``; the rest sequentially."""

    #: how the fallback notice is logged (``auto`` only informs, ``batched`` warns)
    notice_level = logging.WARNING

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--cohort_chunk", type=int, default=0,
                 help="batched engine: train at most this many clients at once (0 = the whole cohort); "
                      "bounds memory to chunk x (model + context + activations)")

    def __init__(self, server: "Server"):
        self.server = server
        self.flat = server.model
        self.chunk = int(getattr(server.args, "cohort_chunk", 0) or 0)
        if self.chunk < 0:
            from utils.errors import FLError

            raise FLError(f"--cohort_chunk must be >= 0, got {self.chunk}")
        self._model_reason: str | None | bool = False  # False = not checked yet, None = qualifies
        self._noticed: set[str] = set()
        self._offsets: list[int] | None = None
        self._step_fns: dict[tuple[bool, bool], Callable] = {}
        self._finals: dict[int, torch.Tensor] = {}
        self._rng_after: dict[int, tuple] = {}
        self.stats = {"batched_clients": 0, "sequential_clients": 0}

    # ------------------------------------------------------------ qualification
    def _notice(self, key: str, message: str) -> None:
        if key not in self._noticed:
            self._noticed.add(key)
            log.log(self.notice_level, "%s", message)

    def model_fallback_reason(self) -> str | None:
        """Why this model cannot be batched (None when it can); checked once per engine."""
        if self._model_reason is False:
            self._model_reason = self._check_model()
        return self._model_reason  # type: ignore[return-value]

    def _probe_input(self) -> torch.Tensor:
        for client in self.server.clients:
            if client.num_train:
                return client.data.inputs("train", slice(0, 2))
        # zeros in the inputs' dtype (integer token ids for text models)
        return self.server.dataset.sample_inputs(2).to(self.flat.device)

    def _check_model(self) -> str | None:
        flat, module = self.flat, self.flat.module
        if flat.num_total > flat.num_params:
            return "the model has float buffers (BatchNorm running statistics), which the batched step cannot update per client"
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()):
            # also without running statistics: a sample's output depends on its batch, and the
            # batched step pads partial batches with repeated rows
            return "the model has BatchNorm, whose batch statistics the batched step's padded batches would change"
        if _has_dropout(module):
            return "the model has dropout, whose per-client random masks only the sequential engine reproduces"
        if not flat.vector.is_floating_point():
            return "the model is not floating point"
        x = self._probe_input()
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
            y = torch.zeros(2, len(x), dtype=torch.long, device=x.device)
            rows = flat.params.detach().unsqueeze(0).repeat(2, 1)
            with plain_convolutions():
                self._step(False)(self._param_views(rows), x.unsqueeze(1).expand(len(x), 2, *x.shape[1:]), y)
        except Exception as exc:  # noqa: BLE001 - any failure means: train it sequentially
            return f"the model cannot run under torch.func.vmap ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        finally:
            flat.vector.copy_(saved)
            module.train(was_training)
        return None

    # ------------------------------------------------------------ the vmapped step
    def _step(self, masked: bool, batched: bool = True) -> Callable:
        """vmap(grad_and_value(CE)) over (params {name: [K, ...]}, x [B, K, ...], y [K, B][, mask [K, B]]);
        with ``batched=False`` the same function for one client without vmap (the tail of a
        ragged cohort, where a vmap over one client only adds overhead).

        The parameters go in as named views of the ``[K, D]`` tensor and the gradients come back
        per name, so the plain SGD update needs no flat copy of the gradient. The inputs carry the
        client axis second: functorch's batched convolution folds it into the channel axis
        (``groups=K``), which is then a free view instead of a transposing copy per layer."""
        fn = self._step_fns.get((masked, batched))
        if fn is not None:
            return fn
        module = self.flat.module

        if masked:
            def loss_fn(params, x, y, m):
                per_sample = F.cross_entropy(functional_call(module, params, (x,)), y, reduction="none")
                return (per_sample * m).sum() / m.sum()

            in_dims: tuple = (0, 1, 0, 0)
        else:
            def loss_fn(params, x, y):
                return F.cross_entropy(functional_call(module, params, (x,)), y)

            in_dims = (0, 1, 0)
        fn = vmap(grad_and_value(loss_fn), in_dims=in_dims) if batched else grad_and_value(loss_fn)
        self._step_fns[(masked, batched)] = fn
        return fn

    def _param_views(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named ``[K, *shape]`` views of the trainable part of ``rows`` ([K, D])."""
        count = rows.shape[0]
        return {s.name: rows[:, s.start : s.stop].view(count, *s.shape) for s in self.flat.param_segments()}

    # ------------------------------------------------------------ data
    def _client_offsets(self) -> list[int]:
        if self._offsets is None:
            offsets, total = [], 0
            for client in self.server.clients:
                offsets.append(total)
                total += client.num_train
            self._offsets = offsets
        return self._offsets

    def _data_for(self, clients: list[Client]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """(x, y, row offset of each client) covering ``clients``' training data.

        The server's concatenated training data (built for the train-loss evaluation anyway) is
        shared when it exists; otherwise the chunk's data is concatenated for this round only."""
        server = self.server
        cached = getattr(server, "_train_cat", None)
        concatenated = getattr(server, "_concatenated", None)
        merged = bool(getattr(getattr(server, "dataset", None), "merged", None))
        if cached is None and concatenated is not None and (merged or getattr(server.args, "eval_train_loss", False)):
            cached = concatenated("train")
        if cached is not None and all(server.clients[c.index] is c for c in clients):
            offsets = self._client_offsets()
            return cached[0], cached[1], [offsets[c.index] for c in clients]
        xs = [c.data.train_x for c in clients]
        ys = [c.data.train_y for c in clients]
        offsets, total = [], 0
        for y in ys:
            offsets.append(total)
            total += len(y)
        return torch.cat(xs), torch.cat(ys), offsets

    # ------------------------------------------------------------ training
    def train(self, clients: list[Client], package: RoundPackage) -> list[ClientUpdate]:
        updates: list[ClientUpdate | None] = [None] * len(clients)
        reason = self.model_fallback_reason() if clients else None
        groups: dict[type, list[int]] = {}
        for pos, client in enumerate(clients):
            if reason is None and client_is_vectorisable(client):
                groups.setdefault(type(client), []).append(pos)
            else:
                if reason is not None:
                    self._notice("model", f"engine {self.registered_name}: {reason}; training sequentially")
                else:
                    self._notice(
                        f"client:{type(client).__qualname__}",
                        f"engine {self.registered_name}: {type(client).__name__} is not vectorisable; "
                        "its clients are trained sequentially",
                    )
                self.stats["sequential_clients"] += 1
                updates[pos] = client.local_train(self.flat, package)
                self._rng_after[client.index] = _rng_state(self.flat.device)
        self._finals = {}
        for positions in groups.values():
            group = [clients[p] for p in positions]
            for pos, update in zip(positions, self._train_group(group, package)):
                updates[pos] = update
            self.stats["batched_clients"] += len(group)
        if clients and clients[-1].index in self._finals:
            # leave the working model where the sequential engine leaves it: the last client's model
            self.flat.vector.copy_(self._finals[clients[-1].index])
        if clients and clients[-1].index in self._rng_after:
            # and the global RNG where the last client's end_round left it
            _set_rng_state(self._rng_after[clients[-1].index], self.flat.device)
        self._finals, self._rng_after = {}, {}
        return updates  # type: ignore[return-value]

    def _train_group(self, clients: list[Client], package: RoundPackage) -> list[ClientUpdate]:
        """Batched local training of clients of one class; updates in the given order."""
        rnd = package.round
        plans = []
        for client in clients:
            client.seed_round(rnd)
            plans.append(client.batch_plan(rnd))
        order = sorted(range(len(clients)), key=lambda k: -len(plans[k]))
        size = self.chunk if self.chunk > 0 else len(clients)
        updates: list[ClientUpdate | None] = [None] * len(clients)
        for start in range(0, len(order), size):
            members = order[start : start + size]
            for k, update in self._train_chunk([clients[k] for k in members], [plans[k] for k in members], package):
                updates[members[k]] = update
        return updates  # type: ignore[return-value]

    def _train_chunk(
        self, clients: list[Client], plans: list[list[torch.Tensor]], package: RoundPackage
    ) -> list[tuple[int, ClientUpdate]]:
        """Train one chunk (sorted by steps, descending); returns (chunk position, update) pairs."""
        flat, rnd = self.flat, package.round
        device = flat.device
        count = len(clients)
        steps = [len(p) for p in plans]
        cohort_order = sorted(range(count), key=lambda j: clients[j].index)
        ctxs: list[dict[str, Any]] = [None] * count  # type: ignore[list-item]
        starts: list[torch.Tensor] = [None] * count  # type: ignore[list-item]
        lrs: list[float] = [0.0] * count
        rng: list[tuple] = [()] * count
        for j in cohort_order:
            client = clients[j]
            client.seed_round(rnd)
            ctxs[j] = client.begin_round(package, steps[j])
            starts[j] = client.start_point(package)
            lrs[j] = client.learning_rate()
            rng[j] = _rng_state(device)  # training draws nothing: end_round resumes from here

        weights = torch.stack([s.to(device=device, dtype=flat.vector.dtype) for s in starts])  # [K, D], fresh
        losses = torch.zeros(count, dtype=weights.dtype, device=device)
        max_steps = max(steps) if steps else 0
        if max_steps:
            self._run_steps_fitting(clients, plans, steps, ctxs, lrs, weights, losses, starts)

        out = []
        for j in cohort_order:
            client = clients[j]
            _set_rng_state(rng[j], device)
            loss = client.check_loss(losses[j], steps[j], rnd)
            client.participations += 1
            self._finals[client.index] = weights[j]
            out.append((j, client.end_round(weights[j], package, ctxs[j], steps[j], loss)))
            self._rng_after[client.index] = _rng_state(device)
        return out

    def _run_steps_fitting(
        self,
        clients: list[Client],
        plans: list[list[torch.Tensor]],
        steps: list[int],
        ctxs: list[dict[str, Any]],
        lrs: list[float],
        weights: torch.Tensor,
        losses: torch.Tensor,
        starts: list[torch.Tensor],
    ) -> None:
        """``_run_steps``, in halves when the device runs out of memory (and with half the chunk
        from then on), so that ``auto`` on a GPU never fails for a cohort too large to train at once.
        Each half restarts from its clients' start points, so the result is that of a smaller
        ``--cohort_chunk``. The halves are contiguous, hence still sorted by step count."""
        try:
            self._run_steps(clients, plans, steps, ctxs, lrs, weights, losses)
            return
        except OUT_OF_MEMORY:
            if len(clients) == 1:
                raise
        if weights.device.type == "cuda":
            torch.cuda.empty_cache()
        half = (len(clients) + 1) // 2
        self.chunk = half if self.chunk <= 0 else min(self.chunk, half)
        log.warning("engine %s: out of memory training %d clients at once; continuing with --cohort_chunk %d",
                    self.registered_name, len(clients), self.chunk)
        for part in (slice(0, half), slice(half, len(clients))):
            rows = weights[part]
            for row, start in zip(rows, starts[part]):
                row.copy_(start)
            losses[part] = 0
            self._run_steps_fitting(clients[part], plans[part], steps[part], ctxs[part], lrs[part], rows,
                                    losses[part], starts[part])

    def _run_steps(
        self,
        clients: list[Client],
        plans: list[list[torch.Tensor]],
        steps: list[int],
        ctxs: list[dict[str, Any]],
        lrs: list[float],
        weights: torch.Tensor,
        losses: torch.Tensor,
    ) -> None:
        flat = self.flat
        device = weights.device
        count, max_steps = len(clients), max(steps)
        bs = max(len(b) for p in plans for b in p)
        x_all, y_all, offsets = self._data_for(clients)
        table = clients[0].data.table  # uint8 input codes are decoded after the gather

        # [K, T_max, B] rows into x_all; a mask only where some batch is partial (--drop_last False)
        index = torch.zeros(count, max_steps, bs, dtype=torch.long, device=device)
        mask: torch.Tensor | None = None
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
                mask[j, t, len(b) :] = 0
        active = [sum(1 for s in steps if s > t) for t in range(max_steps)]  # a prefix (sorted by steps)

        num_params = flat.num_params
        params = weights[:, :num_params]
        views = self._param_views(params)
        names = list(views)
        owner = clients[0]
        adjust = None if type(owner).adjust_grad is Client.adjust_grad else owner.adjust_grad
        ctx_values, ctx_dims = stack_contexts(ctxs, device)
        vadjust = vmap(adjust, in_dims=(0, 0, ctx_dims)) if adjust is not None else None
        same_lr = all(lr == lrs[0] for lr in lrs)
        lr_col = torch.tensor(lrs, dtype=weights.dtype, device=device).unsqueeze(1)

        module = flat.module
        module.train()
        step_plain, step_masked = self._step(False), (self._step(True) if mask is not None else None)
        single_plain, single_masked = self._step(False, False), (self._step(True, False) if mask is not None else None)
        with torch.no_grad(), plain_convolutions():  # vmap has no channels-last batched weights
            for t in range(max_steps):
                a = active[t]
                w = views if a == count else {n: v[:a] for n, v in views.items()}
                rows = index[:a, t]
                masked = mask is not None and not bool(mask[:a, t].all())
                if a == 1:
                    # one client left: the same function without vmap
                    one = {n: v[0] for n, v in w.items()}
                    if masked:
                        grads, loss = single_masked(one, decode_inputs(x_all[rows[0]], table), y_all[rows[0]], mask[0, t])
                    else:
                        grads, loss = single_plain(one, decode_inputs(x_all[rows[0]], table), y_all[rows[0]])
                    grads, loss = {n: g.unsqueeze(0) for n, g in grads.items()}, loss.unsqueeze(0)
                else:
                    x, y = decode_inputs(x_all[rows.t()], table), y_all[rows]  # x: [B, a, ...] (client axis second)
                    if masked:
                        grads, loss = step_masked(w, x, y, mask[:a, t])
                    else:
                        grads, loss = step_plain(w, x, y)
                if vadjust is not None:
                    # the algorithm's term works on flat vectors: one [a, P] gradient, one fused update
                    ctx_a = ctx_values if a == count else {
                        k: (v[:a] if ctx_dims[k] == 0 else v) for k, v in ctx_values.items()
                    }
                    flat_grad = torch.cat([grads[n].reshape(a, -1) for n in names], dim=1)
                    del grads  # peak memory: the per-name gradients are no longer needed
                    direction = vadjust(params[:a], flat_grad, ctx_a)
                    if same_lr:
                        params[:a].add_(direction, alpha=-lrs[0])
                    else:
                        params[:a].addcmul_(lr_col[:a], direction, value=-1)
                else:
                    # plain SGD: update each parameter's view in place (no flat gradient copy)
                    for n in names:
                        if same_lr:
                            w[n].add_(grads[n], alpha=-lrs[0])
                        else:
                            g = grads[n]
                            w[n].addcmul_(lr_col[:a].view(a, *([1] * (g.dim() - 1))), g, value=-1)
                losses[:a] += loss
