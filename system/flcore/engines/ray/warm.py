"""Actors kept warm between runs of one process, on a Ray instance the caller started.

Building an actor starts a Python process that imports torch and the platform: seconds a run,
where two rounds of a toy model take a fraction of one. A process that runs many short runs on
one Ray instance it started itself (a notebook's sweep, the test suite) can keep the actors of a
finished run for the next: :func:`keep_actors_warm` turns this on. A kept actor is emptied when
its run closes (its clients, their data and state dropped) and rebuilt in place for the next run
(:meth:`~flcore.engines.ray.worker.TrainingWorker.reset`: the same constructor a new actor runs),
so a run's numbers do not depend on whether its actors were new. Off by default: idle actors hold
the CPUs (and GPUs) they were created with, which the caller's own Ray work would then wait for;
:func:`release_warm_actors` ends them. An engine that started Ray itself shuts it down at its end
and keeps nothing.

Actors are kept for one kind at a time (the Ray instance, the actor class, CPUs and GPUs per
actor); a run of another kind ends the kept ones first, so idle actors never hold resources a new
run's actors wait for. An actor that died while idle is replaced by a new one.
"""
from __future__ import annotations

from flcore.engines.ray.cluster import import_ray


class WarmActors:
    """The idle actors of one kind (``key``) and whether keeping them is on."""

    def __init__(self) -> None:
        self.enabled = False
        self.key: tuple | None = None
        self.idle: list = []

    def take(self, key: tuple):
        """An idle actor of ``key`` (None when there is none); idle actors of another kind end."""
        if key != self.key:
            self.release()
            self.key = key
        return self.idle.pop() if self.idle else None

    def give(self, key: tuple, actor) -> None:
        if self.enabled and key == self.key:
            self.idle.append(actor)
        else:
            kill(actor)

    def release(self) -> None:
        while self.idle:
            kill(self.idle.pop())
        self.key = None


def kill(actor) -> None:
    try:
        import_ray().kill(actor)
    except Exception:  # noqa: BLE001 - a dead actor needs no killing
        pass


WARM = WarmActors()


def keep_actors_warm(enabled: bool = True) -> None:
    """Keep (or stop keeping) the actors of finished runs for the next run in this process."""
    WARM.enabled = enabled
    if not enabled:
        WARM.release()


def release_warm_actors() -> None:
    """End the idle actors kept so far (before ``ray.shutdown`` or the caller's own Ray work)."""
    WARM.release()
