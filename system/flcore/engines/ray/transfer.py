"""What travels between the driver and the actors, and where per-client state lives: the driver's
file-backed copy of the last round (:class:`DriverStateStore`) and an actor's store that remembers
what its clients changed (:class:`TrackedStore`)."""
from __future__ import annotations

import dataclasses

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.state import DiskStateStore


def package_on(package: RoundPackage, device: torch.device) -> RoundPackage:
    """``package`` with its tensors on ``device`` (the package itself when they are there)."""
    if package.global_params.device == device:
        return package
    move = lambda t: t.to(device)  # noqa: E731
    return dataclasses.replace(
        package, global_params=move(package.global_params),
        extras={k: move(v) for k, v in package.extras.items()},
        static={k: move(v) for k, v in package.static.items()},
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
