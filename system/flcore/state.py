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
"""
from __future__ import annotations

from typing import Callable

import torch


#: ``--state_dtype`` choices: the storage dtype of float32 state vectors
STATE_DTYPES: dict[str, torch.dtype | None] = {"float32": None, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ClientStateStore:
    """``store.get(name, index, init)`` / ``store.set(name, index, tensor)`` with lazy creation."""

    def __init__(self, device: torch.device | str = "cpu", dtype: torch.dtype | None = None):
        self.device = torch.device(device)
        #: storage dtype of float32 vectors (None: kept as they are)
        self.dtype = dtype
        self._data: dict[str, dict[int, torch.Tensor]] = {}
        self._dtypes: dict[str, torch.dtype] = {}  # the dtype callers gave and get back, per name

    def _stored(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """A new storage copy of ``value`` for ``name``."""
        self._dtypes.setdefault(name, value.dtype)
        dtype = self.dtype if self.dtype is not None and value.dtype == torch.float32 else value.dtype
        return value.to(self.device, dtype=dtype, copy=True)

    def _returned(self, name: str, stored: torch.Tensor) -> torch.Tensor:
        dtype = self._dtypes.get(name, stored.dtype)
        return stored if stored.dtype == dtype else stored.to(dtype)

    def has(self, name: str, index: int) -> bool:
        return index in self._data.get(name, {})

    def get(self, name: str, index: int, init: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """The stored tensor, or ``init()`` stored and returned on first use (None without init)."""
        table = self._data.setdefault(name, {})
        if index not in table:
            if init is None:
                return None
            table[index] = self._stored(name, init().detach())
        return self._returned(name, table[index])

    def set(self, name: str, index: int, value: torch.Tensor) -> None:
        table = self._data.setdefault(name, {})
        value = value.detach()
        if index in table and table[index].shape == value.shape and self._dtypes.get(name) == value.dtype:
            table[index].copy_(value)  # reuse the allocation (rounds to the storage dtype)
        else:
            table[index] = self._stored(name, value)

    def indices(self, name: str) -> list[int]:
        return sorted(self._data.get(name, {}))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for table in self._data.values() for t in table.values())
