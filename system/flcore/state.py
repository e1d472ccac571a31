"""Per-client persistent state as flat tensors, owned by the simulation rather than by clients.

A client has no model object of its own: what an algorithm must remember about a client between
its participations (SCAFFOLD's control variate, IGFL's previous update, a personal model) is one
vector per client and name. Vectors are created on first use, so memory grows with the number of
clients that have actually participated, and can live on the CPU when the accelerator is full.

With a storage dtype (``--state_dtype float16``) float32 vectors are kept in that dtype, which
halves the memory of a run whose state dominates it (SCAFFOLD's control variates over 1,000
clients: 3.4 GB in float32 for the CIFAR CNN). ``get`` then returns a float32 copy of what is
stored, so computations keep their precision and only what persists between participations is
rounded (float16 keeps 11 significant bits; values below 6e-8 in magnitude become 0). Callers
must therefore always ``set`` what they change, never rely on modifying the tensor ``get``
returned; that is already required when the state lives on another device than the model.

With ``--state_device auto`` (the default) on a GPU the vectors live on the GPU while it has room:
once a new vector would leave less than a quarter of the GPU's memory for training and evaluation,
or its allocation fails, it and every later new vector are kept on the CPU instead (one notice
says so), and ``get`` copies them to the GPU when a client trains. ``cpu`` keeps them all on the
CPU from the start; ``cuda`` keeps them on the GPU and fails when it is full.

``--state_device disk`` (:class:`DiskStateStore`) keeps the vectors in files instead, so the
process holds only the vectors of the clients being trained: memory no longer grows with the
number of clients, whatever the dtype, and values are stored exactly. The files are anonymous
(unlinked at creation), so they vanish when the run ends, even if it is killed.
"""
from __future__ import annotations

import logging
import math
import os
import tempfile
from argparse import Namespace
from typing import IO, Callable

import torch

from utils.mem_utils import OUT_OF_MEMORY, device_room

log = logging.getLogger("fl")

#: ``--state_dtype`` choices: the storage dtype of float32 state vectors
STATE_DTYPES: dict[str, torch.dtype | None] = {"float32": None, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: ``--state_device auto`` stops placing new vectors on a GPU that would keep less than this fraction
#: of its memory for training and evaluation
GPU_RESERVE = 0.25


class ClientStateStore:
    """``store.get(name, index, init)`` / ``store.set(name, index, tensor)`` with lazy creation.

    The bookkeeping (which client has which vector, the dtype callers get back) lives here once;
    a subclass only changes how one entry is kept: ``_save``, ``_load`` and ``_entry_nbytes``."""

    def __init__(self, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                 spill_to: torch.device | str | None = None):
        #: the compute device: ``get`` returns tensors there
        self.device = torch.device(device)
        #: storage dtype of float32 vectors (None: kept as they are)
        self.dtype = dtype
        #: where new vectors go once ``device`` is full (None: nowhere, a full device fails)
        self.spill_to = torch.device(spill_to) if spill_to is not None else None
        #: whether new vectors now go to ``spill_to`` (once set, stays set: no back and forth)
        self.spilling = False
        self._entries: dict[str, dict[int, object]] = {}
        self._dtypes: dict[str, torch.dtype] = {}  # the dtype callers gave and get back, per name

    # -- how an entry is kept: here, a tensor on ``device`` (or ``spill_to``) ---------------------
    def _save(self, name: str, current: object | None, value: torch.Tensor) -> object:
        """The entry that holds ``value`` from now on (``current``: the entry it replaces)."""
        storage = self._storage_dtype(value)
        if isinstance(current, torch.Tensor) and current.shape == value.shape and self._dtypes[name] == value.dtype:
            return current.copy_(value)  # reuse the allocation, wherever it is (rounds to the storage dtype)
        return self._allocate(value, storage)

    def _allocate(self, value: torch.Tensor, storage: torch.dtype) -> torch.Tensor:
        """A copy of ``value`` on ``device``, or on ``spill_to`` once ``device`` is full."""
        if self.spill_to is not None and not self.spilling and not self._device_has_room(value.numel() * storage.itemsize):
            self._spill(f"would keep less than {GPU_RESERVE:.0%} of its memory for training")
        if not self.spilling:
            try:
                return value.to(self.device, dtype=storage, copy=True)
            except OUT_OF_MEMORY:
                if self.spill_to is None:
                    raise
                self._spill("is full")
        return value.to(self.spill_to, dtype=storage, copy=True)

    def _device_has_room(self, nbytes: int) -> bool:
        room = device_room(self.device)
        return room is None or room[0] - nbytes >= GPU_RESERVE * room[1]

    def _spill(self, why: str) -> None:
        self.spilling = True
        log.info("state: %s %s; new per-client state vectors go to the %s (%.0f MB stay on the %s)",
                 self.device, why, self.spill_to, self.nbytes_on(self.device.type) / 1024**2, self.device)

    def _load(self, entry: object) -> torch.Tensor:
        return entry

    def _entry_nbytes(self, entry: object) -> int:
        return entry.numel() * entry.element_size()

    # -- the interface ---------------------------------------------------------------------------
    def _storage_dtype(self, value: torch.Tensor) -> torch.dtype:
        return self.dtype if self.dtype is not None and value.dtype == torch.float32 else value.dtype

    def names(self) -> list[str]:
        """The state names some client has a vector for."""
        return [name for name, table in self._entries.items() if table]

    def has(self, name: str, index: int) -> bool:
        return index in self._entries.get(name, {})

    def get(self, name: str, index: int, init: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """The stored tensor, or ``init()`` stored and returned on first use (None without init).

        The first get returns what was stored (already rounded to the storage dtype). Where the
        device and dtype match, the tensor returned is the store's own (no copy per client): a
        later ``set`` of the same entry overwrites it in place, so a caller that needs the old
        value after setting a new one clones it first."""
        table = self._entries.setdefault(name, {})
        if index not in table:
            if init is None:
                return None
            self.set(name, index, init())
        # .to returns the stored tensor itself when device and dtype already match
        return self._load(table[index]).to(self.device, dtype=self._dtypes[name])

    def set(self, name: str, index: int, value: torch.Tensor) -> None:
        value = value.detach()
        self._dtypes.setdefault(name, value.dtype)
        table = self._entries.setdefault(name, {})
        table[index] = self._save(name, table.get(index), value)

    def indices(self, name: str) -> list[int]:
        return sorted(self._entries.get(name, {}))

    def nbytes(self) -> int:
        """Bytes of state held (in memory here; on disk for :class:`DiskStateStore`)."""
        return sum(self._entry_nbytes(entry) for table in self._entries.values() for entry in table.values())

    def nbytes_on(self, device_type: str) -> int:
        """Bytes of state held in tensors on devices of this type (``"cuda"``, ``"cpu"``)."""
        return sum(self._entry_nbytes(entry) for table in self._entries.values() for entry in table.values()
                   if isinstance(entry, torch.Tensor) and entry.device.type == device_type)

    def resident_nbytes(self) -> int:
        """Bytes of state held in this process's memory (host and accelerator)."""
        return self.nbytes()

    def state_dict(self) -> dict:
        """Every vector as stored (storage dtype, on the CPU) and the dtype callers get back, for
        checkpoints: ``load_state_dict`` of a fresh store then returns exactly what ``get`` did."""
        return {
            "dtypes": {name: str(dtype).removeprefix("torch.") for name, dtype in self._dtypes.items()},
            "entries": {name: {int(i): self._load(entry).to("cpu", copy=True) for i, entry in table.items()}
                        for name, table in self._entries.items()},
        }

    def load_state_dict(self, saved: dict) -> None:
        """Replace the store's contents with ``saved`` (from ``state_dict``)."""
        self._entries.clear()
        self._dtypes = {name: getattr(torch, dtype) for name, dtype in saved["dtypes"].items()}
        for name, table in saved["entries"].items():
            entries = self._entries.setdefault(name, {})
            for index, value in table.items():
                # already in the storage dtype, so storing it again rounds nothing
                entries[int(index)] = self._save(name, None, value)

    def close(self) -> None:
        """Release what the store holds outside the process (nothing for the in-memory store)."""


class _SlotFile:
    """Fixed-size records (one vector each) in an anonymous file, read and written in place."""

    def __init__(self, shape: torch.Size, dtype: torch.dtype, directory: str | None):
        self.shape, self.dtype = shape, dtype
        self.record = math.prod(shape) * dtype.itemsize
        # unbuffered: records go straight between the tensors' memory and the file
        self.file: IO[bytes] = tempfile.TemporaryFile(prefix="fl-state-", dir=directory, buffering=0)
        self.slots = 0

    def write(self, slot: int, value: torch.Tensor) -> None:
        data = memoryview(value.contiguous().view(-1).view(torch.uint8).numpy())
        self.file.seek(slot * self.record)
        done = 0
        while done < len(data):  # a raw write may stop short of a large record
            done += self.file.write(data[done:])

    def read(self, slot: int) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=self.dtype)
        view = memoryview(out.view(-1).view(torch.uint8).numpy())
        self.file.seek(slot * self.record)
        done = 0
        while done < len(view):
            got = self.file.readinto(view[done:])
            if not got:
                raise OSError(f"state file ended early (slot {slot}, {done} of {len(view)} bytes read)")
            done += got
        return out


class DiskStateStore(ClientStateStore):
    """The same interface, with every vector in an anonymous file under ``directory``.

    One file per (name, shape, storage dtype) holds one fixed-size record per client, written in
    place by ``set``. ``get`` reads the record and returns a fresh tensor on ``device`` (the
    compute device). Reads and writes go through the operating system's page cache, which the
    kernel may drop under memory pressure, unlike the process's own memory."""

    def __init__(self, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                 directory: str | os.PathLike | None = None):
        super().__init__(device, dtype)
        self.directory = os.fspath(directory) if directory else None
        if self.directory and not os.path.isdir(self.directory):
            from utils.errors import FLError

            raise FLError(f"--state_dir {self.directory} is not a directory; create it or pick another")
        try:  # the files are created lazily, mid-run: find a folder that refuses them now
            tempfile.TemporaryFile(prefix="fl-state-", dir=self.directory).close()
        except OSError as exc:
            from utils.errors import FLError

            where = self.directory or tempfile.gettempdir()
            raise FLError(f"--state_dir {where}: cannot create the state files there ({exc.strerror or exc}); "
                          "pass --state_dir with a writable folder") from None
        self._files: dict[tuple, _SlotFile] = {}

    # an entry is (file, slot); a vector whose shape or dtype changes moves to another file
    def _save(self, name: str, current: object | None, value: torch.Tensor) -> object:
        storage = self._storage_dtype(value)
        key = (name, tuple(value.shape), storage)
        if current is None or current[0] is not self._files.get(key):
            file = self._files.get(key)
            if file is None:
                file = self._files[key] = _SlotFile(value.shape, storage, self.directory)
            current = (file, file.slots)
            file.slots += 1
        file, slot = current
        file.write(slot, value.to("cpu", dtype=storage))
        return current

    def _load(self, entry: object) -> torch.Tensor:
        file, slot = entry
        return file.read(slot)

    def _entry_nbytes(self, entry: object) -> int:
        return entry[0].record

    def resident_nbytes(self) -> int:
        return 0

    def close(self) -> None:
        for file in self._files.values():
            file.file.close()
        self._files.clear()
        self._entries.clear()


def make_state_store(args: Namespace, device: torch.device) -> ClientStateStore:
    """The store ``--state_device`` (auto | cpu | cuda... | disk) and ``--state_dtype`` ask for."""
    dtype = STATE_DTYPES[args.state_dtype]
    where = str(args.state_device)
    if where == "disk":
        return DiskStateStore(device, dtype, args.state_dir)
    if where == "auto":
        return ClientStateStore(device, dtype, spill_to="cpu" if device.type != "cpu" else None)
    try:
        return ClientStateStore(torch.device(where), dtype)
    except RuntimeError:
        from utils.errors import FLError

        raise FLError(f"--state_device {where!r} is not a device; use auto, cpu, cuda or disk") from None
