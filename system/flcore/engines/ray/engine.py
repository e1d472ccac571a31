"""The driver of the Ray engine (:class:`RayEngine`): actors, sticky assignment, rounds, and the
replacement of actors that fail (the package docstring says how)."""
from __future__ import annotations

import copy
import dataclasses
import logging
import time
from argparse import ArgumentParser

import torch

from flcore.clients.clientbase import Client
from flcore.engines.base import Engine
from flcore.engines.precision import check_precision
from flcore.engines.ray.cluster import (actor_path_env, check_ray_installed, first_line, import_ray, ray_init,
                                       start_local_ray, use_loopback)
from flcore.engines.ray.transfer import DriverStateStore, update_on
from flcore.engines.ray.warm import WARM, kill
from flcore.engines.ray.worker import TrainingWorker
from flcore.engines.threaded import available_cores
from flcore.protocol import ClientUpdate, RoundPackage, Runtime, Task
from flcore.registry import register_engine
from flcore.state import STATE_DTYPES
from cli.flags import add_flag, hyperparameters
from utils.errors import Diverged, FLError

log = logging.getLogger("fl")


class WorkersLost(Diverged):
    """More actors failed in one round than ``--ray_max_restarts`` allows. As with a diverged run,
    the rounds before ``round`` are complete: ``main`` writes them (marked unfinished) and the run
    can be resumed from its last checkpoint (``--checkpoint_every``)."""


def assign_by_samples(sizes: list[int], workers: int) -> list[list[int]]:
    """Clients (by position) per worker: longest first, each to the worker with the fewest samples
    so far (ties: the lower worker); each worker's list in ascending order."""
    loads = [0] * workers
    members: list[list[int]] = [[] for _ in range(workers)]
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        worker = min(range(workers), key=lambda w: (loads[w], w))
        members[worker].append(index)
        loads[worker] += sizes[index]
    return [sorted(m) for m in members]


@register_engine("ray")
class RayEngine(Engine):
    """Ray actors, each owning a share of the clients (data and state), train the cohort; the driver
    aggregates as the sequential engine does."""

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--ray_address", type=str, default="local",
                 help="ray engine: 'local' starts a Ray instance on this machine (127.0.0.1 only); 'auto' or "
                      "ray://host:port attaches to a running cluster")
        add_flag(parser, "--ray_workers", type=int, default=0,
                 help="ray engine: actors, each with one working model (0 = the cluster's CPUs / --ray_cpus_per_worker; "
                      "on a local instance at most --num_threads CPUs' worth when that is set)")
        add_flag(parser, "--ray_cpus_per_worker", type=float, default=1.0,
                 help="ray engine: CPUs per actor; 2 and more train that many clients at a time inside it")
        add_flag(parser, "--ray_gpus_per_worker", type=float, default=0.0,
                 help="ray engine: GPUs per actor (fractions share a GPU; > 0 trains on the GPU)")
        add_flag(parser, "--ray_max_restarts", type=int, default=3,
                 help="ray engine: actor failures tolerated in one round (each is replaced and its jobs rerun)")

    #: the class of the actors' body (the tests substitute one that fails mid-round)
    worker_cls: type = TrainingWorker

    def __init__(self, runtime: Runtime):
        super().__init__(runtime)
        args = runtime.args
        hp = hyperparameters(args, RayEngine)  # typed: the flags this engine declares
        self.address = hp.ray_address or "local"
        self.requested_workers, self.max_restarts = hp.ray_workers, hp.ray_max_restarts
        self.cpus, self.gpus = hp.ray_cpus_per_worker, hp.ray_gpus_per_worker
        for flag, value, low in (("--ray_workers", self.requested_workers, 0), ("--ray_max_restarts", self.max_restarts, 0),
                                 ("--ray_gpus_per_worker", self.gpus, 0)):
            if value < low:
                raise FLError(f"{flag} must be >= {low}, got {value}")
        if self.cpus <= 0:
            raise FLError(f"--ray_cpus_per_worker must be > 0, got {self.cpus}")
        # the actors' engines apply --precision; what their device cannot run is refused here, before
        # Ray starts (an actor's GPU that this driver cannot see is checked by the actor)
        actor_device = torch.device("cuda" if self.gpus > 0 else "cpu")
        self.precision = str(args.precision)
        if actor_device.type == "cpu" or torch.cuda.is_available():
            self.precision = check_precision(args, actor_device)
        check_ray_installed()
        # server.state becomes the driver's file-backed copy; the actors hold the working state
        runtime.state.close()
        self.store = DriverStateStore(runtime.device, STATE_DTYPES[args.state_dtype], args.state_dir)
        runtime.state = self.store
        for client in runtime.clients:
            client.state = self.store
        self.actors: list | None = None
        self.members: list[list[int]] = []
        self.owner: dict[int, int] = {}
        self.nodes: list[str] = []
        self._module_ref = None
        self._started_ray = False
        self.startup_seconds = 0.0
        self.stats = {"ray_clients": 0, "restarts": 0}

    # ------------------------------------------------------------ cluster
    def _connect(self) -> None:
        if self.address == "local":
            use_loopback()
        ray = import_ray()
        if ray.is_initialized():
            return  # a Ray instance this process (a test, a notebook) already runs
        if self.address == "local":
            data_bytes = sum(t.numel() * t.element_size() for c in self.runtime.clients
                             for t in (c.data.train_x, c.data.train_y, c.data.test_x, c.data.test_y))
            start_local_ray(available_cores(), data_bytes + 64 * 1024**2,
                            num_gpus=torch.cuda.device_count() if self.gpus > 0 else None)
        else:
            try:
                ray_init(address=self.address, runtime_env=actor_path_env(), logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise FLError(f"--ray_address {self.address}: cannot attach to a Ray cluster ({first_line(exc)})") from None
        self._started_ray = True

    def _worker_count(self) -> int:
        resources = import_ray().cluster_resources()
        cpus, gpus = resources.get("CPU", 0), resources.get("GPU", 0)
        count = self.requested_workers or self._default_workers(cpus, gpus)
        count = max(1, min(count, len(self.runtime.clients)))
        # actors that do not fit would wait for resources forever: a local instance never grows
        if self.address == "local" and (count * self.cpus > cpus + 1e-9 or count * self.gpus > gpus + 1e-9):
            raise FLError(f"engine ray: {count} actors x {self.cpus:g} CPUs, {self.gpus:g} GPUs do not fit the local "
                          f"Ray instance ({cpus:g} CPUs, {gpus:g} GPUs); lower --ray_workers or the per-worker resources")
        return count

    def _default_workers(self, cpus: float, gpus: float) -> int:
        """``--ray_workers 0``: as many actors as the cluster's CPUs (and GPUs) hold. A local instance
        runs on this machine, so there ``--num_threads N`` bounds the CPUs the actors train on, as it
        bounds the threaded engine's workers (``threaded.worker_count``); a cluster's own CPUs are not
        this process's threads, so attached to one the flag does not change the count."""
        limit = int(self.runtime.args.num_threads)
        if self.address == "local" and limit > 0:
            cpus = min(cpus, limit)
        count = int(cpus // self.cpus)
        if self.gpus > 0:
            count = min(count, int(gpus // self.gpus))
        return count

    def _start(self) -> None:
        started = time.perf_counter()
        self._connect()
        ray = import_ray()
        workers = self._worker_count()
        self.members = assign_by_samples([c.num_train for c in self.runtime.clients], workers)
        self.owner = {i: slot for slot, members in enumerate(self.members) for i in members}
        module = copy.deepcopy(self.flat.module).to("cpu")
        self._module_ref = ray.put(module)
        self._remote_cls = ray.remote(self.worker_cls)
        self.actors = [None] * workers
        self.nodes = [""] * workers
        self.store.pushes.clear()  # new actors load every entry of their clients
        self.store.reload = False
        loading = {slot: self._spawn(slot) for slot in range(workers)}
        from ray.exceptions import RayError

        for slot, ref in loading.items():
            try:
                self.nodes[slot] = ray.get(ref)
            except RayError as exc:
                raise FLError(f"engine ray: actor {slot} failed while loading its clients: {first_line(exc)}") from None
        self.startup_seconds = time.perf_counter() - started
        log.info("engine ray: %d actors on %d node(s), started in %.1f s", workers, len(set(self.nodes)),
                 self.startup_seconds)

    def _warm_key(self) -> tuple:
        """The kind of actor this run builds (:mod:`flcore.engines.ray.warm`): the Ray instance,
        the actor class, CPUs and GPUs per actor."""
        return import_ray().get_runtime_context().get_node_id(), self.worker_cls, self.cpus, self.gpus

    def _actor(self):
        """An actor built with this run's model and flags: a kept idle one rebuilt in place when
        :func:`~flcore.engines.ray.warm.keep_actors_warm` is on and one is alive, else a new one."""
        from ray.exceptions import RayError

        built = (self._module_ref, self.runtime.args, self.gpus > 0, max(1, int(self.cpus)))
        while (actor := WARM.take(self._warm_key())) is not None:
            try:
                import_ray().get(actor.reset.remote(*built))
                return actor
            except RayError:
                kill(actor)  # it died while idle
        return self._remote_cls.options(
            num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=0, scheduling_strategy="SPREAD",
        ).remote(*built)

    def _spawn(self, slot: int):
        """An actor for ``slot`` holding its clients (data, settings, carried state and state as
        the driver has them); returns the reference of its loading call."""
        actor = self._actor()
        self.actors[slot] = actor
        members = self.members[slot]
        clients = self.runtime.clients
        contract = {i: (type(clients[i]), clients[i].settings(), clients[i].carried_state()) for i in members}
        task = Task(self.runtime.num_classes, self.flat.num_params, self.runtime.objective)
        # the data go through the object store once per actor; the reference is dropped once loaded
        # (a replacement puts them again from the driver's dataset, which holds them anyway)
        data = import_ray().put([(i, clients[i].data.owned()) for i in members])
        return actor.load.remote(data, task, contract, self.store.entries_of(members))

    def _replace(self, slot: int) -> None:
        ray = import_ray()
        kill(self.actors[slot])
        self.stats["restarts"] += 1
        self.nodes[slot] = ray.get(self._spawn(slot))

    # ------------------------------------------------------------ training
    def train(self, clients: list[Client], package: RoundPackage) -> list[ClientUpdate]:
        if not clients:
            return []
        if self.actors is None:
            self._start()
        ray = import_ray()
        from ray.exceptions import (ActorDiedError, ActorUnavailableError, OutOfMemoryError, RayActorError,
                                    WorkerCrashedError)

        lost = (RayActorError, ActorDiedError, ActorUnavailableError, WorkerCrashedError, OutOfMemoryError)
        jobs: dict[int, list[int]] = {}
        for client in clients:
            jobs.setdefault(self.owner[client.index], []).append(client.index)
        keys = {(n, i) for n in self.store.names() for i in self.store.indices(n)} if self.store.reload else self.store.pushes
        self.store.pushes, self.store.reload = set(), False
        pushes: dict[int, dict] = {}
        for name, index in keys:
            pushes.setdefault(self.owner[index], {}).setdefault(name, {})[index] = self.store.get(name, index)
        last_slot = self.owner[clients[-1].index]
        base = ray.put(dataclasses.replace(package, payloads={}))

        def send(slot: int, fresh: bool):
            mine = jobs.get(slot, [])
            carried = {i: self.runtime.clients[i].carried_state() for i in mine}
            return self.actors[slot].train_round.remote(
                base, {i: package.payloads[i] for i in mine if i in package.payloads}, mine, carried,
                {} if fresh else pushes.get(slot, {}), slot == last_slot)

        pending = {send(slot, False): slot for slot in sorted(set(jobs) | set(pushes))}
        failures = 0

        def count_failure(slot: int, exc: BaseException) -> None:
            nonlocal failures
            failures += 1
            if failures > self.max_restarts:
                raise WorkersLost(
                    f"engine ray: {failures} actor failures in round {package.round} (--ray_max_restarts "
                    f"{self.max_restarts}); the run stops after {package.round} complete rounds "
                    f"(last: {type(exc).__name__})", package.round) from None
            log.warning("warning: engine ray: actor %d failed in round %d (%s); replacing it and rerunning its "
                        "%d jobs", slot, package.round, type(exc).__name__, len(jobs.get(slot, [])))

        answers: dict[int, dict] = {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            slot = pending.pop(ready[0])
            try:
                answer = ray.get(ready[0])
            except lost as exc:
                count_failure(slot, exc)
                while True:
                    try:
                        self._replace(slot)
                        break
                    except lost as again:
                        count_failure(slot, again)
                pending[send(slot, True)] = slot  # the new actor has the driver's state and attributes
                continue
            if "error" in answer:
                cls, args, values = answer["error"]
                error = cls.__new__(cls)
                error.args = args
                error.__dict__.update(values)
                raise error
            self._absorb(answer)
            answers[slot] = answer
        final = answers[last_slot]
        if final.get("rng") is not None and final["rng"][2].type == self.flat.device.type:
            self.end_like_sequential(final["params"].to(self.flat.device), final["rng"])
        else:
            self.end_like_sequential(final["params"].to(self.flat.device), None)
        updates = {u.index: update_on(u, self.flat.device) for a in answers.values() for u in a["updates"]}
        self.stats["ray_clients"] += len(updates)
        return [updates[c.index] for c in clients]

    def _absorb(self, answer: dict) -> None:
        """An actor's answer: its clients' carried state onto the driver's clients, their changed
        state into the driver's copy."""
        for index, values in answer["carried"].items():
            self.runtime.clients[index].restore_carried_state(values)
        for name, table in answer["states"].items():
            for index, value in table.items():
                self.store.record(name, index, value)

    def actor_state_nbytes(self) -> list[int]:
        """Bytes of per-client state each actor holds in memory."""
        ray = import_ray()
        return ray.get([a.resident_state_nbytes.remote() for a in self.actors]) if self.actors else []

    def actor_peak_rss_mb(self) -> list[float]:
        """Each actor process's peak resident memory (MiB)."""
        ray = import_ray()
        return ray.get([a.peak_rss_mb.remote() for a in self.actors]) if self.actors else []

    def close(self) -> None:
        if self.actors is None:
            return
        ray = import_ray()
        from ray.exceptions import RayError

        keep = WARM.enabled and not self._started_ray
        for actor in self.actors:
            if keep:
                try:
                    ray.get(actor.release.remote())
                    WARM.give(self._warm_key(), actor)
                    continue
                except RayError:
                    pass
            kill(actor)
        self.actors = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False
