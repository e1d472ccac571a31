"""Randomness that depends on what is being simulated, never on processing order.

Every random stream is derived from ``(seed, purpose, round, client)`` with NumPy's
``SeedSequence``: client c in round t draws the same batches whichever engine trains it and
whichever clients were trained before it.
"""
from __future__ import annotations

import random
import zlib

import numpy as np
import torch

_PURPOSES: dict[str, int] = {}


def _purpose_key(purpose: str) -> int:
    # crc32 is stable across processes, unlike hash() of a str.
    if purpose not in _PURPOSES:
        _PURPOSES[purpose] = zlib.crc32(purpose.encode())
    return _PURPOSES[purpose]


def derive_seed(seed: int, purpose: str, *keys: int) -> int:
    """A 63-bit seed that depends only on ``seed``, ``purpose`` and ``keys``."""
    entropy = [int(seed) & 0xFFFFFFFF, _purpose_key(purpose), *(int(k) & 0xFFFFFFFF for k in keys)]
    state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def numpy_rng(seed: int, purpose: str, *keys: int) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, purpose, *keys))


def torch_generator(seed: int, purpose: str, *keys: int, device: str | torch.device = "cpu") -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(derive_seed(seed, purpose, *keys))
    return generator


def seed_global_rng(seed: int, purpose: str, *keys: int) -> None:
    """Seed torch's global generators (what dropout draws from) from (seed, purpose, keys).

    ``torch.manual_seed`` would do, but while CUDA is not initialised (every CPU run) it also
    defers a CUDA seeding and records the caller's stack trace for it on each call: 0.1-0.5 ms,
    about 100 times the seeding itself, paid once per client and round. This seeds the CPU
    generator, and the GPUs' when CUDA is in use (then torch seeds them at once, without a trace)."""
    value = derive_seed(seed, purpose, *keys)
    torch.default_generator.manual_seed(value)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(value)


def seed_everything(seed: int) -> None:
    """Seed the global generators (model initialisation and anything outside our streams)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state(device: torch.device | str = "cpu") -> tuple:
    """The global torch RNG state (and the CUDA generator's when ``device`` is a GPU), so that an
    engine can resume a client's hooks from exactly where the sequential order leaves the RNG."""
    device = torch.device(device)
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda, device


def set_rng_state(state: tuple) -> None:
    cpu, cuda, device = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)
