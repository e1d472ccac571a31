"""The threaded cohort engine (``--engine threaded``): the CPU's cores train different clients.

At PFLlib's batch size of 10 a CNN step is too small for PyTorch's intra-op threads to keep two
cores busy (measured on the project's 2-core CPU: one client on 2 intra-op threads ~3,200 samples/s,
two clients at once on one thread each ~3,800-3,900). This engine gives every worker thread its own
working model (one model per worker, never one per client) and lets each worker train whole clients
with one intra-op thread. PyTorch releases the GIL inside its kernels and the autograd engine, so
the workers run in parallel.

Per client it runs exactly the sequential engine's procedure (``Client.local_train``)::

    seed_round(t); plan = batch_plan(t); ctx = begin_round(package, len(plan))   # main thread
    start = start_point(package); lr = learning_rate()                           # main thread
    loss = sgd(worker_model <- start, package, ctx, plan, lr)                     # a worker
    end_round(worker_model.snapshot(), package, ctx, len(plan), loss)            # main thread

* **Who runs in a worker.** Only the SGD loop of clients whose class keeps the base
  ``local_train``/``sgd``/``compute_gradient`` and says ``vectorisable = True`` (their hooks touch
  only the client's own state and ``adjust_grad`` is pure, the contract of the batched engine).
  The hooks run on the main thread. Other clients, and every client of a model whose forward pass
  draws random numbers (dropout: torch's global generator is shared by all threads), are trained on
  the main thread as the sequential engine does, in cohort order, with a one-line notice.
* **Scheduling.** The longest clients are handed out first, so no worker is left alone with a long
  client at the end of the round, and ``end_round`` runs as soon as a client is done. Only
  ``2 x workers`` clients hold a context at a time, so hooks that copy a model-sized vector into it
  (SCAFFOLD's controls, IGFL-C's offset) cost a few such vectors, not one per cohort client (for
  P3 that was 50 x 7 MB). Hooks therefore run in schedule order, not cohort order; each starts from
  the global RNG state it has under the sequential engine (``seed_round`` and the plan before
  ``begin_round``, that state again before ``end_round``), the round ends with the state the last
  cohort client's ``end_round`` left, and a client that fails raises the error of the first failing
  client in cohort order, as sequentially.
* **Same numbers.** A client's result depends only on its start point, batch plan and context,
  never on which worker trains it or when. Each worker uses one intra-op thread, so the numbers are
  those of ``--engine sequential --num_threads 1`` to the last bit, and do not depend on how many
  workers or cores there are. (The sequential engine on several intra-op threads may round
  differently, as any change of thread count can.)
* **Threads.** ``--workers`` (default: one per CPU core this process may use). During training
  the intra-op thread count is 1 in every worker and on the main thread, whose hooks run while the
  workers train (with its own team on top, the cores were oversubscribed: SCAFFOLD's P3 rounds took
  2.16 s threaded vs 1.94 s sequential, and 1.47 s vs 1.90 s with one thread here). Evaluation and
  aggregation keep the process's setting (``--num_threads``): large evaluation batches do use it.
"""
from __future__ import annotations

import copy
import logging
import os
import threading
from argparse import ArgumentParser
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

import torch

from flcore.clients.clientbase import Client, ClientUpdate, RoundPackage
from flcore.engines.batched import _has_dropout, _rng_state, _set_rng_state, client_is_vectorisable
from flcore.flat import FlatModel
from flcore.registry import register_engine
from utils.cli import add_flag
from utils.errors import FLError

if TYPE_CHECKING:
    from flcore.servers.serverbase import Server

log = logging.getLogger("fl")


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@register_engine("threaded")
class ThreadedEngine:
    """Worker threads, each with its own working model, train the cohort's clients in parallel."""

    #: how the fallback notice is logged (``auto`` only informs, ``threaded`` warns)
    notice_level = logging.WARNING

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--workers", type=int, default=0,
                 help="threaded engine: worker threads, each training whole clients on one intra-op "
                      "thread (0 = one per CPU core)")

    def __init__(self, server: "Server"):
        self.server = server
        requested = int(getattr(server.args, "workers", 0) or 0)
        if requested < 0:
            raise FLError(f"--workers must be >= 0, got {requested}")
        self.num_workers = requested or available_cores()
        self._models: list[FlatModel] = []
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self._random_forward: bool | None = None
        self._noticed: set[str] = set()
        self.stats = {"threaded_clients": 0, "sequential_clients": 0}

    # ------------------------------------------------------------ qualification
    def _notice(self, key: str, message: str) -> None:
        if key not in self._noticed:
            self._noticed.add(key)
            log.log(self.notice_level, "%s", message)

    def model_fallback_reason(self) -> str | None:
        if self.server.model.device.type != "cpu":
            return "the threaded engine is for CPUs (use --engine batched on a GPU)"
        if self._random_forward is None:
            self._random_forward = _has_dropout(self.server.model.module)
        if self._random_forward:
            return "the model has dropout, whose random masks come from the one global generator all threads share"
        return None

    def _qualifies(self, client: Client) -> bool:
        reason = self.model_fallback_reason()
        if reason is not None:
            self._notice("model", f"engine {self.registered_name}: {reason}; training sequentially")
            return False
        if not client_is_vectorisable(client):
            self._notice(f"client:{type(client).__qualname__}",
                         f"engine {self.registered_name}: {type(client).__name__} is not vectorisable; "
                         "its clients are trained sequentially")
            return False
        return True

    # ------------------------------------------------------------ workers
    def _worker_model(self) -> FlatModel:
        """This thread's working model (created on first use; one per worker, reused every round)."""
        model = getattr(self._local, "model", None)
        if model is None:
            torch.set_num_threads(1)  # OpenMP's thread count is per thread: set it in each worker once
            source = self.server.model
            model = FlatModel(copy.deepcopy(source.module), source.device)
            self._local.model = model
            self._models.append(model)
        return model

    def _train_one(self, client: Client, package: RoundPackage, ctx, start: torch.Tensor, plan, lr: float):
        model = self._worker_model()
        model.load(start)
        loss = client.sgd(model, package, ctx, plan, lr)
        return model.snapshot(), loss

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="fl-worker")
        return self._pool

    # ------------------------------------------------------------ training
    def train(self, clients: list[Client], package: RoundPackage) -> list[ClientUpdate]:
        if not clients:
            return []
        parallel = [c for c in clients if self._qualifies(c)] if self.num_workers > 1 and len(clients) > 1 else []
        if len(parallel) < 2:
            return self._train(clients, [], package)
        # the hooks run here while the workers train: on one thread, or the cores are oversubscribed
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._train(clients, parallel, package)
        finally:
            torch.set_num_threads(threads)

    def _train(self, clients: list[Client], parallel: list[Client], package: RoundPackage) -> list[ClientUpdate]:
        device = self.server.model.device
        rnd = package.round
        plans = {}
        for client in parallel:  # the plans first, in cohort order, to schedule by length
            client.seed_round(rnd)
            plans[id(client)] = (client.batch_plan(rnd), _rng_state(device))
        # longest clients first, so no worker is left with a long client at the end of the round
        waiting = deque(sorted(parallel, key=lambda c: -len(plans[id(c)][0])))
        running: dict[Future, tuple] = {}
        pool = self._executor()

        def start_next() -> None:
            """begin_round of the next waiting client (with the RNG state its plan left) and its SGD
            handed to a worker. Only ``window`` clients hold a context at a time, so contexts that
            copy a model-sized vector (SCAFFOLD's controls) cost a few vectors, not a cohort's."""
            client = waiting.popleft()
            plan, rng = plans.pop(id(client))
            _set_rng_state(rng, device)
            ctx = client.begin_round(package, len(plan))
            start, lr = client.start_point(package), client.learning_rate()
            job = pool.submit(self._train_one, client, package, ctx, start, plan, lr)
            running[job] = (client, plan, ctx, _rng_state(device))

        done: dict[int, tuple] = {}  # id(client) -> (update, final params or None, RNG after end_round)
        failed: dict[int, BaseException] = {}
        window = 2 * self.num_workers
        while waiting and len(running) < window:
            start_next()
        in_workers = {id(c) for c in parallel}
        for client in clients:  # the clients this engine cannot parallelise, in cohort order
            if id(client) not in in_workers:
                self.stats["sequential_clients"] += 1
                done[id(client)] = (client.local_train(self.server.model, package), None, _rng_state(device))
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for job in finished:
                client, plan, ctx, rng = running.pop(job)
                try:
                    final, loss = job.result()
                except FLError as error:  # e.g. a NaN loss: raised below for the first such client
                    failed[id(client)] = error
                else:
                    _set_rng_state(rng, device)
                    client.participations += 1
                    self.stats["threaded_clients"] += 1
                    update = client.end_round(final, package, ctx, len(plan), loss)
                    # the final model is kept only where the working model must end up
                    done[id(client)] = (update, final if client is clients[-1] else None, _rng_state(device))
                if waiting:
                    start_next()
        for client in clients:  # the sequential engine's error: that of the first failing client
            if id(client) in failed:
                raise failed[id(client)]
        # leave the RNG and the working model where the sequential engine leaves them: after the
        # last client's end_round, holding that client's model
        _, last_final, last_rng = done[id(clients[-1])]
        _set_rng_state(last_rng, device)
        if last_final is not None:
            self.server.model.load(last_final)
        return [done[id(client)][0] for client in clients]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
