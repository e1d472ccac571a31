"""The threaded cohort engine (``--engine threaded``): the CPU's cores train different clients.

At PFLlib's batch size of 10 a CNN step is too small for PyTorch's intra-op threads to keep two
cores busy (measured on the project's 2-core CPU: one client on 2 intra-op threads ~3,200 samples/s,
two clients at once on one thread each ~3,800-3,900). This engine gives every worker thread its own
working model (one model per worker, never one per client) and lets each worker train whole clients
with one intra-op thread. PyTorch releases the GIL inside its kernels and the autograd engine, so
the workers run in parallel.

Per client it runs the one local sequence of ``clientbase``::

    job = client.plan_job(package); client.open_job(job)      # main thread
    params, loss = client.train_job(job, worker_model)         # a worker
    client.finish_job(job, params, loss)                       # main thread

* **Who runs in a worker.** Only the SGD loop of clients whose class keeps the base
  ``train_job``/``sgd``/``compute_gradient`` and says ``vectorisable = True`` (their hooks touch
  only the client's own state; a ``local_loss`` hook, ``pre_training`` and ``post_training`` run
  in the worker too).
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
* **Threads.** ``--workers`` (default: one per CPU core this process may use, at most
  ``--num_threads`` when that is given, so ``--num_threads 1`` trains on one thread). During training
  the intra-op thread count is 1 in every worker and on the main thread, whose hooks run while the
  workers train (with its own team on top, the cores were oversubscribed: SCAFFOLD's P3 rounds took
  2.16 s threaded vs 1.94 s sequential, and 1.47 s vs 1.90 s with one thread here). The clients it
  trains on the main thread (a class that is not vectorisable, a cohort of one) are trained on one
  intra-op thread too, so their numbers are also those of ``--engine sequential --num_threads 1``
  (not of whether the round had workers to start), and a busy core cannot stall an OpenMP team at
  every operation (Ditto, trained entirely there, was several times slower on two intra-op threads of
  a busy 2-core machine than on one: ``docs/results/performance.md``, the soak section). Aggregation keeps
  the process's setting (``--num_threads``), and evaluation spreads a pass's batches over that many
  workers (``flcore/evaluation.py``).
"""
from __future__ import annotations

import copy
import os
import threading
from argparse import ArgumentParser
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, LocalJob, RoundPackage
from flcore.engines.base import Engine, has_dropout
from flcore.engines.precision import check_precision, precision_context
from flcore.flat import FlatModel
from flcore.registry import register_engine
from cli.flags import add_flag, hyperparameters
from utils.errors import FLError

if TYPE_CHECKING:
    from flcore.protocol import Runtime


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_count(args) -> int:
    """The threaded engine's workers: ``--workers`` when given; else one per core this process may
    use, but at most ``--num_threads`` when that is set, so that ``--num_threads N`` bounds the CPU
    threads the run trains on (each worker trains on one intra-op thread)."""
    requested = hyperparameters(args, ThreadedEngine).workers
    if requested:
        return requested
    cores = available_cores()
    limit = int(args.num_threads)
    return min(cores, limit) if limit > 0 else cores


@register_engine("threaded")
class ThreadedEngine(Engine):
    """Worker threads, each with its own working model, train the cohort's clients in parallel."""

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--workers", type=int, default=0, low=0,
                 help="threaded engine: worker threads, each training whole clients on one intra-op "
                      "thread (0 = one per CPU core, at most --num_threads when that is set)")

    def __init__(self, runtime: "Runtime"):
        super().__init__(runtime)
        requested = hyperparameters(runtime.args, ThreadedEngine).workers
        if requested < 0:
            raise FLError(f"--workers must be >= 0, got {requested}")
        self.num_workers = worker_count(runtime.args)
        self.precision = check_precision(runtime.args, self.flat.device)
        self._models: list[FlatModel] = []
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self.stats = {"threaded_clients": 0, "sequential_clients": 0}

    def check_model(self) -> str | None:
        if self.flat.device.type != "cpu":
            return "the threaded engine is for CPUs (use --engine batched on a GPU)"
        if has_dropout(self.flat.module):
            return "the model has dropout, whose random masks come from the one global generator all threads share"
        return None

    # ------------------------------------------------------------ workers
    def _worker_model(self) -> FlatModel:
        """This thread's working model (created on first use; one per worker, reused every round)."""
        model = getattr(self._local, "model", None)
        if model is None:
            torch.set_num_threads(1)  # OpenMP's thread count is per thread: set it in each worker once
            model = FlatModel(copy.deepcopy(self.flat.module), self.flat.device)
            self._local.model = model
            self._models.append(model)
        return model

    def _train_one(self, job: LocalJob) -> tuple[torch.Tensor, float]:
        with precision_context(self.precision, self.flat.device):  # autocast is per thread: entered here
            return job.client.train_job(job, self._worker_model())

    def train_sequentially(self, client: Client, package: RoundPackage) -> ClientUpdate:
        with precision_context(self.precision, self.flat.device):
            return super().train_sequentially(client, package)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="fl-worker")
        return self._pool

    # ------------------------------------------------------------ training
    def train(self, clients: list[Client], package: RoundPackage) -> list[ClientUpdate]:
        if not clients:
            return []
        parallel = [c for c in clients if self.qualifies(c)] if self.num_workers > 1 and len(clients) > 1 else []
        # the hooks run here while the workers train, and the clients no worker takes are trained
        # here: on one thread, or the cores are oversubscribed (and a client's numbers would depend
        # on whether its cohort had workers to start)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            if len(parallel) < 2:
                return [self.train_sequentially(c, package) for c in clients]
            return self._train(clients, parallel, package)
        finally:
            torch.set_num_threads(threads)

    def _train(self, clients: list[Client], parallel: list[Client], package: RoundPackage) -> list[ClientUpdate]:
        jobs = {id(c): c.plan_job(package) for c in parallel}  # plans first, in cohort order, to schedule
        # longest clients first, so no worker is left with a long client at the end of the round
        waiting = deque(sorted(parallel, key=lambda c: -jobs[id(c)].steps))
        running: dict[Future, LocalJob] = {}
        pool = self._executor()

        def start_next() -> None:
            """Open the next waiting client's job and hand its training to a worker. Only
            ``window`` clients hold a context at a time, so contexts that copy a model-sized vector
            (SCAFFOLD's controls) cost a few vectors, not a cohort's."""
            job = jobs.pop(id(waiting.popleft()))
            job.client.open_job(job)
            running[pool.submit(self._train_one, job)] = job

        done: dict[int, tuple] = {}  # id(client) -> (update, final params or None, RNG after finish_job)
        failed: dict[int, BaseException] = {}
        window = 2 * self.num_workers
        while waiting and len(running) < window:
            start_next()
        in_workers = {id(c) for c in parallel}
        for client in clients:  # the clients this engine cannot parallelise, in cohort order
            if id(client) not in in_workers:
                done[id(client)] = (self.train_sequentially(client, package), None,
                                    self.rng_now() if client is clients[-1] else None)
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                job = running.pop(future)
                client = job.client
                try:
                    params, loss = future.result()
                except FLError as error:  # e.g. a NaN loss: raised below for the first such client
                    failed[id(client)] = error
                else:
                    self.stats["threaded_clients"] += 1
                    update = client.finish_job(job, params, loss)
                    # the final model and RNG are kept only where the working model must end up
                    last = client is clients[-1]
                    done[id(client)] = (update, params if last else None, self.rng_now() if last else None)
                if waiting:
                    start_next()
        for client in clients:  # the sequential engine's error: that of the first failing client
            if id(client) in failed:
                raise failed[id(client)]
        _, last_params, last_rng = done[id(clients[-1])]
        self.end_like_sequential(last_params, last_rng)
        return [done[id(client)][0] for client in clients]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
