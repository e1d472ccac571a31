"""The Ray engine (``--engine ray``): the cohort trained by Ray actors, on this machine or a cluster,
with the sequential engine's numbers.

It is one more engine on the local-training protocol: every client still runs the sequence of
:mod:`flcore.clients.clientbase` (``plan_job``, ``open_job``, ``train_job``, ``finish_job``), only
inside an actor instead of the driver. Per round, the driver sends each actor one message and gets
one back; aggregation stays on the driver, in client-id order, so results are bit-identical to the
sequential engine's on the CPU (``tests/engines/test_ray.py`` compares every array of the h5).

* **Actors** (``--ray_workers``, default: one per ``--ray_cpus_per_worker`` CPUs of the cluster)
  each hold one working model and the clients assigned to them: the clients' data are put into
  Ray's object store once, when the actor is built, never per round. Inside an actor the clients
  are trained by the threaded engine when it has several CPUs (``--ray_cpus_per_worker 2`` and up),
  else sequentially; an actor with a GPU (``--ray_gpus_per_worker``, fractions allowed) trains
  sequentially on it (the batched engine needs the whole dataset).
* **Assignment** is sticky and balanced by samples: clients, longest first, each go to the actor
  with the fewest samples so far (longest processing time first, as pfl-research balances its
  workers). It is computed once from the clients' sizes, so a client always trains on the same
  actor, and a replaced actor takes over its predecessor's clients.
* **Per-client state** (control variates, personal models, private parts) lives in the store of
  the actor that owns the client; algorithm code calls ``self.state.get/set`` unchanged. The
  driver's ``server.state`` is a :class:`DriverStateStore`: the last completed round's copy of
  every client's state, kept in anonymous files (a :class:`~flcore.state.DiskStateStore`), so the
  driver's memory does not grow with the number of stateful clients. Each actor's round message
  carries the entries its clients changed; what the server itself sets (FedALA's local models,
  IGFL's stored updates, ``setup``'s initial personal models) is pushed to the owning actor with
  the next round's message. The server reads state (evaluating personal models) from that copy,
  and a checkpoint's ``state_dict``/``load_state_dict`` of ``server.state`` gathers and scatters
  the whole cluster's state through it.
* **Client attributes** (``participations``, anything an algorithm keeps on the client object)
  are the driver's: each round's message carries the attributes the server rebound since the
  last one, and the answer those the client's sequence rebound, which are set on the driver's
  client objects, so server code that reads them sees what it sees sequentially. Attributes are
  compared by identity: one changed in place (a tensor modified without rebinding) is not seen,
  which the state store's rule already asks of algorithms.
* **Same numbers.** A client's result depends only on its start point, batch plan, context and
  state, all of which derive from (seed, round, client) and the package; the driver orders the
  updates by cohort position, leaves its working model and global RNG where the sequential engine
  leaves them (the last cohort client's final model and RNG), and aggregates as usual. Actors use
  one intra-op thread per training thread, so the numbers are those of ``--engine sequential
  --num_threads 1``, as the threaded engine's are. An actor does not pre-sum its uploads: a
  weighted sum formed on the actor would add in another order than the driver's client-id order
  and round differently.
* **Faults.** An actor that dies mid-round (killed, out of memory, its node lost) is replaced: the
  new actor gets the same clients, their state from the driver's copy of the last round and their
  attributes from the driver, and reruns the round's jobs with the same (seed, round, client)
  randomness, so the run's results equal an undisturbed run's. More than ``--ray_max_restarts``
  failures in one round stop the run with one line (:class:`WorkersLost`, a ``Diverged``: ``main``
  writes the rounds recorded so far, marked unfinished, and ``--resume`` continues from the last
  checkpoint).
* **Network.** With the default ``--ray_address local`` the engine starts a Ray instance bound to
  127.0.0.1 only (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` before ``ray.init``: measured with ray
  2.60.0, ``_node_ip_address`` alone did not move the GCS), without the dashboard, with an object
  store sized to the data. ``auto`` or ``ray://host:port`` attach to a running cluster
  (``docs/scale-out.md``); the code must be at the same path on every node.
* **Testing faults.** ``FEDCOHORT_RAY_CRASH=<round>:<client>:<marker file>`` in the driver's
  environment makes the actor owning ``<client>`` exit (``os._exit``) in ``<round>`` after
  training the clients before it, once: the marker file records that it happened.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib.util
import logging
import os
import re
import sys
import time
from argparse import ArgumentParser
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

from flcore.clients.clientbase import Client, ClientUpdate, RoundPackage
from flcore.engines.base import Engine
from flcore.engines.sequential import SequentialEngine
from flcore.engines.threaded import ThreadedEngine, available_cores
from flcore.flat import FlatModel
from flcore.registry import register_engine
from flcore.state import STATE_DTYPES, DiskStateStore, make_state_store
from utils.cli import add_flag, hyperparameters
from utils.errors import Diverged, FLError
from utils.seeding import rng_state, set_rng_state

if TYPE_CHECKING:
    from flcore.servers.serverbase import Server

log = logging.getLogger("fl")

#: the import root the actors need on their path (``system/``)
SYSTEM_DIR = Path(__file__).resolve().parents[2]
#: test-only fault injection: ``<round>:<client>:<marker file>`` (see the module docstring)
CRASH_ENV = "FEDCOHORT_RAY_CRASH"
#: client attributes that say how a client is built, not what it learns: each process has its own
BUILT_ATTRS = frozenset({"data", "state", "args", "hp"})
#: the smallest object store Ray accepts is 75 MB; a little more leaves room for packages
MIN_OBJECT_STORE = 96 * 1024**2


class WorkersLost(Diverged):
    """More actors failed in one round than ``--ray_max_restarts`` allows. As with a diverged run,
    the rounds before ``round`` are complete: ``main`` writes them (marked unfinished) and the run
    can be resumed from its last checkpoint (``--checkpoint_every``)."""


MISSING_RAY = "--engine ray needs the ray package: run ./prepare.sh --ray (or pip install -r requirements-ray.txt)"


def check_ray_installed() -> None:
    """One clear line when ray is missing, without importing it (importing fixes the addresses
    its local node will use; :func:`use_loopback` comes first)."""
    if importlib.util.find_spec("ray") is None:
        raise FLError(MISSING_RAY)


def import_ray():
    """The ray module, or one clear line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise FLError(MISSING_RAY) from None
    return ray


def actor_path_env(extra_paths: tuple[str, ...] = ()) -> dict:
    """The runtime environment that lets actors import the simulator (``system/`` on their path,
    then ``extra_paths``, e.g. the tests' helpers, then the driver's ``PYTHONPATH``)."""
    paths = [str(SYSTEM_DIR), *map(str, extra_paths), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}}


def use_loopback() -> None:
    """Make Ray's local node use 127.0.0.1: ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` for the processes
    Ray starts, and the constant Ray read from it at import when ray is imported already."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


def start_local_ray(num_cpus: int, object_store_bytes: int = MIN_OBJECT_STORE, num_gpus: int | None = None,
                    extra_paths: tuple[str, ...] = (), **init_kwargs) -> None:
    """A Ray instance on this machine, bound to 127.0.0.1 only, without the dashboard.

    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is what makes Ray 2.60 bind its services (GCS, raylet,
    object manager) to loopback instead of the machine's interface address."""
    use_loopback()
    ray = import_ray()
    ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
             object_store_memory=max(int(object_store_bytes), MIN_OBJECT_STORE), runtime_env=actor_path_env(extra_paths),
             logging_level=logging.WARNING, **init_kwargs)


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


def standalone_data(data):
    """A copy of a client's data that owns its tensors: the clients' tensors are views of the merged
    splits, and serialising a view would send the whole merged split."""
    return dataclasses.replace(data, **{k: getattr(data, k).clone() for k in ("train_x", "train_y", "test_x", "test_y")})


def movable_attrs(client: Client) -> dict[str, Any]:
    """The client's attributes that travel between driver and actor (all but how it is built)."""
    return {k: v for k, v in vars(client).items() if k not in BUILT_ATTRS}


def package_on(package: RoundPackage, device: torch.device) -> RoundPackage:
    """``package`` with its tensors on ``device`` (the package itself when they are there)."""
    if package.global_params.device == device:
        return package
    move = lambda t: t.to(device)  # noqa: E731
    return dataclasses.replace(
        package, global_params=move(package.global_params),
        extras={k: move(v) for k, v in package.extras.items()},
        payloads={i: {k: move(v) for k, v in p.items()} for i, p in package.payloads.items()},
        shared=None if package.shared is None else move(package.shared))


def update_on(update: ClientUpdate, device: torch.device) -> ClientUpdate:
    if update.params.device == device:
        return update
    return dataclasses.replace(update, params=update.params.to(device),
                               extras={k: v.to(device) for k, v in update.extras.items()})


class DriverStateStore(DiskStateStore):
    """``server.state`` under ``--engine ray``: the last completed round's copy of every client's
    state, in anonymous files, so the driver's resident memory stays flat however many clients
    hold state (``resident_nbytes`` is 0). The owning actors hold the working copies.

    ``set`` (the server's own writes) also marks the entry to be pushed to the owning actor with
    the next round's message; ``record`` stores what an actor reported (it has it already)."""

    def __init__(self, device: torch.device, dtype: torch.dtype | None, directory: str | None):
        super().__init__(device, dtype, directory)
        #: (name, client) entries the server set since the last round's messages
        self.pushes: set[tuple[str, int]] = set()
        #: every entry must be sent to the actors again (a checkpoint was loaded)
        self.reload = False

    def set(self, name: str, index: int, value: torch.Tensor) -> None:
        super().set(name, index, value)
        self.pushes.add((name, index))

    def record(self, name: str, index: int, value: torch.Tensor) -> None:
        super().set(name, index, value)

    def load_state_dict(self, saved: dict) -> None:
        super().load_state_dict(saved)  # type: ignore[misc]  (ClientStateStore's, for checkpoints)
        self.reload = True

    def entries_of(self, clients: set[int] | list[int], keys: set[tuple[str, int]] | None = None) -> dict:
        """{name: {client: tensor}} of ``clients`` (only ``keys`` when given), read from the files."""
        wanted = set(clients)
        out: dict[str, dict[int, torch.Tensor]] = {}
        for name in self.names():
            for index in self.indices(name):
                if index in wanted and (keys is None or (name, index) in keys):
                    out.setdefault(name, {})[index] = self.get(name, index)
        return out


class TrackedStore:
    """An actor's state store that remembers which entries were set, so the round's answer carries
    exactly the state its clients changed. Everything else is the wrapped store's."""

    def __init__(self, inner):
        self.inner = inner
        self.dirty: set[tuple[str, int]] = set()

    def set(self, name: str, index: int, value: torch.Tensor) -> None:
        self.inner.set(name, index, value)
        self.dirty.add((name, index))

    def get(self, name: str, index: int, init=None):
        if init is not None and not self.inner.has(name, index):
            self.dirty.add((name, index))  # created here: the driver must learn of it
        return self.inner.get(name, index, init)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


class TrainingWorker:
    """The body of one Ray actor: a working model, the clients assigned to it and their state."""

    def __init__(self, module: torch.nn.Module, args, use_gpu: bool, threads: int, crash: tuple | None):
        torch.set_num_threads(1)  # one intra-op thread per training thread: the sequential numbers
        self.device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")
        self.args = args
        self.model = FlatModel(module, self.device)
        self.state = TrackedStore(make_state_store(args, self.device))
        self.clients: dict[int, Client] = {}
        shim = SimpleNamespace(model=self.model, args=SimpleNamespace(**{**vars(args), "workers": threads}))
        self.engine = ThreadedEngine(shim) if threads > 1 and not use_gpu else SequentialEngine(shim)
        self.crash = crash

    def load(self, data: list, attrs: dict[int, tuple[type, dict]], states: dict) -> str:
        """Build this actor's clients from their data (from the object store) and the driver's
        attributes, and their state from the driver's copy; returns the node's id."""
        for item in data:
            index = item[0]
            cls, values = attrs[index]
            client = cls.__new__(cls)
            client.__dict__.update(values)
            client.data = dataclasses.replace(item[1], **{k: getattr(item[1], k).to(self.device)
                                                          for k in ("train_x", "train_y", "test_x", "test_y")})
            client.args, client.hp, client.state = self.args, hyperparameters(self.args, cls), self.state
            self.clients[index] = client
        self._store(states)
        import ray

        return ray.get_runtime_context().get_node_id()

    def _store(self, states: dict) -> None:
        for name, table in states.items():
            for index, value in table.items():
                self.state.inner.set(name, index, value)

    def train_round(self, package: RoundPackage, payloads: dict, jobs: list[int], attrs: dict, pushes: dict,
                    final: bool) -> dict:
        """Train ``jobs`` (client positions, cohort order) on ``package``; returns the uploads, the
        attributes and state the clients changed, and with ``final`` the working model and RNG."""
        self._store(pushes)
        for index, values in attrs.items():
            self.clients[index].__dict__.update(values)
        package = package_on(dataclasses.replace(package, payloads=payloads), self.device)
        clients = [self.clients[i] for i in jobs]
        before = {c.index: dict(vars(c)) for c in clients}
        self.state.dirty.clear()
        try:
            self._maybe_crash(package.round, clients, package)
            updates = self.engine.train(clients, package)
        except FLError as error:
            return {"error": (type(error), error.args, vars(error))}
        changed = {c.index: {k: v for k, v in movable_attrs(c).items()
                             if k not in before[c.index] or before[c.index][k] is not v} for c in clients}
        states: dict[str, dict[int, torch.Tensor]] = {}
        for name, index in self.state.dirty:
            states.setdefault(name, {})[index] = self.state.inner.get(name, index)
        answer = {"updates": updates, "attrs": changed, "states": states}
        if final and clients:
            answer["params"] = self.model.vector.clone()
            answer["rng"] = rng_state(self.device)
        return answer

    def _maybe_crash(self, rnd: int, clients: list[Client], package: RoundPackage) -> None:
        """Test-only: exit this process in the middle of the round, once (see ``CRASH_ENV``)."""
        if self.crash is None:
            return
        crash_round, crash_client, marker = self.crash
        positions = [c.index for c in clients]
        if rnd != crash_round or crash_client not in positions:
            return
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # it happened already: this is the replacement
        self.engine.train(clients[:positions.index(crash_client)], package)  # the clients before it train
        os._exit(3)

    def resident_state_nbytes(self) -> int:
        return self.state.inner.resident_nbytes()

    def peak_rss_mb(self) -> float:
        from utils.mem_utils import peak_rss_mb

        return peak_rss_mb()


def first_line(exc: BaseException) -> str:
    """One line for an error: Ray's errors carry the remote traceback, whose last ``...Error: ...``
    line names the cause (e.g. a module the actors cannot import); else the message's first line."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(exc).splitlines()]
    causes = [line for line in lines if re.match(r"^[\w.]*(Error|Exception): ", line)]
    if causes:
        return causes[-1]
    return next((line for line in lines if line), type(exc).__name__)


def parse_crash(value: str | None) -> tuple[int, int, str] | None:
    if not value:
        return None
    try:
        rnd, client, marker = value.split(":", 2)
        return int(rnd), int(client), marker
    except ValueError:
        raise FLError(f"{CRASH_ENV} must be <round>:<client>:<marker file>, got {value!r}") from None


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
                 help="ray engine: actors, each with one working model (0 = the cluster's CPUs / --ray_cpus_per_worker)")
        add_flag(parser, "--ray_cpus_per_worker", type=float, default=1.0,
                 help="ray engine: CPUs per actor; 2 and more train that many clients at a time inside it")
        add_flag(parser, "--ray_gpus_per_worker", type=float, default=0.0,
                 help="ray engine: GPUs per actor (fractions share a GPU; > 0 trains on the GPU)")
        add_flag(parser, "--ray_max_restarts", type=int, default=3,
                 help="ray engine: actor failures tolerated in one round (each is replaced and its jobs rerun)")

    def __init__(self, server: "Server"):
        super().__init__(server)
        args = server.args
        self.address = str(getattr(args, "ray_address", "local") or "local")
        self.requested_workers = int(getattr(args, "ray_workers", 0) or 0)
        self.cpus = float(getattr(args, "ray_cpus_per_worker", 1.0))
        self.gpus = float(getattr(args, "ray_gpus_per_worker", 0.0))
        self.max_restarts = int(getattr(args, "ray_max_restarts", 3))
        for flag, value, low in (("--ray_workers", self.requested_workers, 0), ("--ray_max_restarts", self.max_restarts, 0),
                                 ("--ray_gpus_per_worker", self.gpus, 0)):
            if value < low:
                raise FLError(f"{flag} must be >= {low}, got {value}")
        if self.cpus <= 0:
            raise FLError(f"--ray_cpus_per_worker must be > 0, got {self.cpus}")
        check_ray_installed()
        self.crash = parse_crash(os.environ.get(CRASH_ENV))
        # server.state becomes the driver's file-backed copy; the actors hold the working state
        server.state.close()
        self.store = DriverStateStore(server.device, STATE_DTYPES[args.state_dtype], getattr(args, "state_dir", None))
        server.state = self.store
        for client in server.clients:
            client.state = self.store
        self.actors: list | None = None
        self.members: list[list[int]] = []
        self.owner: dict[int, int] = {}
        self.nodes: list[str] = []
        self._synced: dict[int, dict] = {}  # client -> its attributes as the actors last saw them
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
            data_bytes = sum(t.numel() * t.element_size() for c in self.server.clients
                             for t in (c.data.train_x, c.data.train_y, c.data.test_x, c.data.test_y))
            start_local_ray(available_cores(), data_bytes + 64 * 1024**2,
                            num_gpus=torch.cuda.device_count() if self.gpus > 0 else None)
        else:
            try:
                ray.init(address=self.address, runtime_env=actor_path_env(), logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise FLError(f"--ray_address {self.address}: cannot attach to a Ray cluster ({first_line(exc)})") from None
        self._started_ray = True

    def _worker_count(self) -> int:
        resources = import_ray().cluster_resources()
        cpus, gpus = resources.get("CPU", 0), resources.get("GPU", 0)
        count = self.requested_workers or int(cpus // self.cpus)
        if self.gpus > 0 and not self.requested_workers:
            count = min(count, int(gpus // self.gpus))
        count = max(1, min(count, len(self.server.clients)))
        # actors that do not fit would wait for resources forever: a local instance never grows
        if self.address == "local" and (count * self.cpus > cpus + 1e-9 or count * self.gpus > gpus + 1e-9):
            raise FLError(f"engine ray: {count} actors x {self.cpus:g} CPUs, {self.gpus:g} GPUs do not fit the local "
                          f"Ray instance ({cpus:g} CPUs, {gpus:g} GPUs); lower --ray_workers or the per-worker resources")
        return count

    def _start(self) -> None:
        started = time.perf_counter()
        self._connect()
        ray = import_ray()
        workers = self._worker_count()
        self.members = assign_by_samples([c.num_train for c in self.server.clients], workers)
        self.owner = {i: slot for slot, members in enumerate(self.members) for i in members}
        module = copy.deepcopy(self.flat.module).to("cpu")
        self._module_ref = ray.put(module)
        self._remote_cls = ray.remote(TrainingWorker)
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

    def _spawn(self, slot: int):
        """A new actor for ``slot`` holding its clients (data, attributes, state as the driver has them);
        returns the reference of its loading call."""
        actor = self._remote_cls.options(
            num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=0, scheduling_strategy="SPREAD",
        ).remote(self._module_ref, self.server.args, self.gpus > 0, max(1, int(self.cpus)), self.crash)
        self.actors[slot] = actor
        members = self.members[slot]
        attrs = {}
        for i in members:
            client = self.server.clients[i]
            attrs[i] = (type(client), movable_attrs(client))
            self._synced[i] = dict(vars(client))
        # the data go through the object store once per actor; the reference is dropped once loaded
        # (a replacement puts them again from the driver's dataset, which holds them anyway)
        data = import_ray().put([(i, standalone_data(self.server.clients[i].data)) for i in members])
        return actor.load.remote(data, attrs, self.store.entries_of(members))

    def _replace(self, slot: int) -> None:
        ray = import_ray()
        try:
            ray.kill(self.actors[slot])
        except Exception:  # noqa: BLE001 - it is dead already
            pass
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
            attrs = {} if fresh else self._changed_attrs(mine)
            return self.actors[slot].train_round.remote(
                base, {i: package.payloads[i] for i in mine if i in package.payloads}, mine, attrs,
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

    def _changed_attrs(self, indices: list[int]) -> dict[int, dict]:
        """The attributes of these clients the driver rebound since the actor last saw them."""
        changed = {}
        for i in indices:
            current, seen = vars(self.server.clients[i]), self._synced[i]
            diff = {k: v for k, v in current.items() if k not in BUILT_ATTRS and (k not in seen or seen[k] is not v)}
            if diff:
                changed[i] = diff
            self._synced[i] = dict(current)
        return changed

    def _absorb(self, answer: dict) -> None:
        """An actor's answer: its clients' new attributes onto the driver's clients, their changed
        state into the driver's copy."""
        for index, values in answer["attrs"].items():
            client = self.server.clients[index]
            client.__dict__.update(values)
            self._synced[index].update(values)
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
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - a dead actor needs no killing
                pass
        self.actors = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False
