"""The body of one Ray actor (:class:`TrainingWorker`)."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch

from flcore.clients.clientbase import Client
from flcore.clients.localstep import local_step_for
from flcore.engines.ray.transfer import TrackedStore, package_on
from flcore.engines.sequential import SequentialEngine
from flcore.engines.threaded import ThreadedEngine
from flcore.flat import FlatModel
from flcore.protocol import ClientUpdate, RoundPackage, Task
from flcore.state import make_state_store
from utils.errors import FLError
from utils.seeding import rng_state


class TrainingWorker:
    """The body of one Ray actor: a working model, the clients assigned to it and their state."""

    def __init__(self, module: torch.nn.Module, args, use_gpu: bool, threads: int):
        torch.set_num_threads(1)  # one intra-op thread per training thread: the sequential numbers
        self.device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")
        self.args = args
        self.model = FlatModel(module, self.device)
        self.state = TrackedStore(make_state_store(args, self.device))
        self.clients: dict[int, Client] = {}
        shim = SimpleNamespace(model=self.model, args=SimpleNamespace(**{**vars(args), "workers": threads}))
        self.engine = ThreadedEngine(shim) if threads > 1 and not use_gpu else SequentialEngine(shim)

    def reset(self, module: torch.nn.Module, args, use_gpu: bool, threads: int) -> None:
        """Rebuild this actor in place for another run, as a new actor is built (a kept actor:
        :mod:`flcore.engines.ray.warm`)."""
        self.release()
        self.__init__(module, args, use_gpu, threads)

    def release(self) -> None:
        """Drop the clients, their data and state, and the working model (the run has ended)."""
        state = getattr(self, "state", None)
        if state is not None:
            state.inner.close()
        self.clients, self.state, self.model, self.engine = {}, None, None, None

    def load(self, data: list, task: Task, clients: dict[int, tuple[type, dict, dict]], states: dict) -> str:
        """Build this actor's clients from their data (from the object store), the task, and the
        driver's ``(class, settings, carried state)`` of each (the client-state contract), and
        their state from the driver's copy; returns the node's id."""
        local_step = local_step_for(self.args)
        for index, client_data in data:
            cls, settings, carried = clients[index]
            client_data = dataclasses.replace(client_data, **{k: getattr(client_data, k).to(self.device)
                                                              for k in ("train_x", "train_y", "test_x", "test_y")})
            client = cls(index, client_data, self.args, self.state, task, local_step)
            client.configure(**settings)
            client.restore_carried_state(carried)
            self.clients[index] = client
        self._store(states)
        import ray

        return ray.get_runtime_context().get_node_id()

    def _store(self, states: dict) -> None:
        for name, table in states.items():
            for index, value in table.items():
                self.state.inner.set(name, index, value)

    def train_round(self, package: RoundPackage, payloads: dict, jobs: list[int], carried: dict, pushes: dict,
                    final: bool) -> dict:
        """Train ``jobs`` (client positions, cohort order) on ``package``, each client with its
        ``carried`` state from the driver; returns the uploads, the carried state and the state
        entries the clients changed, and with ``final`` the working model and RNG."""
        self._store(pushes)
        for index, values in carried.items():
            self.clients[index].restore_carried_state(values)
        package = package_on(dataclasses.replace(package, payloads=payloads), self.device)
        clients = [self.clients[i] for i in jobs]
        self.state.dirty.clear()
        try:
            updates = self.run_jobs(clients, package)
        except FLError as error:
            return {"error": (type(error), error.args, vars(error))}
        states: dict[str, dict[int, torch.Tensor]] = {}
        for name, index in self.state.dirty:
            states.setdefault(name, {})[index] = self.state.inner.get(name, index)
        answer = {"updates": updates, "carried": {c.index: c.carried_state() for c in clients}, "states": states}
        if final and clients:
            answer["params"] = self.model.vector.clone()
            answer["rng"] = rng_state(self.device)
        return answer

    def run_jobs(self, clients: list[Client], package: RoundPackage) -> list[ClientUpdate]:
        """The round's local training of ``clients`` (the tests' crashing worker overrides it)."""
        return self.engine.train(clients, package)

    def resident_state_nbytes(self) -> int:
        return self.state.inner.resident_nbytes()

    def peak_rss_mb(self) -> float:
        from utils.mem_utils import peak_rss_mb

        return peak_rss_mb()
