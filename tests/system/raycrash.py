"""A Ray actor body that fails mid-round, once: the fault the Ray engine's tests inject.

``crashing_worker(round, client, marker)`` is a :class:`TrainingWorker` whose actor, in ``round``,
trains the clients of its job that come before ``client`` and then exits the process
(``os._exit``), unless ``marker`` exists; it creates ``marker`` first, so the replacement actor
trains normally. Tests put it in place with ``monkeypatch.setattr(RayEngine, "worker_cls", ...)``;
this module sits on the actors' import path (``tests/system``).
"""
from __future__ import annotations

import os

from flcore.engines.ray.worker import TrainingWorker


class CrashingWorker(TrainingWorker):
    crash_round: int = -1
    crash_client: int = -1
    marker: str = ""

    def run_jobs(self, clients, package):
        positions = [c.index for c in clients]
        if package.round == self.crash_round and self.crash_client in positions:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return super().run_jobs(clients, package)  # it happened already: this is the replacement
            super().run_jobs(clients[:positions.index(self.crash_client)], package)  # the clients before it
            os._exit(3)
        return super().run_jobs(clients, package)


def crashing_worker(rnd: int, client: int, marker) -> type:
    """A subclass of :class:`CrashingWorker` that fails in round ``rnd`` at client ``client``."""
    return type("CrashingWorkerAt", (CrashingWorker,), {"crash_round": rnd, "crash_client": client,
                                                         "marker": str(marker), "__module__": __name__})
