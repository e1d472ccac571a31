"""Randomness that depends on what is being simulated, never on processing order.

Every random stream is derived from ``(seed, purpose, round, client)`` with NumPy's
``SeedSequence``: client c in round t draws the same batches whichever engine trains it and
whichever clients were trained before it.
"""
from __future__ import annotations

import functools
import random
import threading
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
    """A 63-bit seed that depends only on ``seed``, ``purpose`` and ``keys``: the first two 32-bit
    words of ``np.random.SeedSequence([seed, purpose, *keys]).generate_state`` (each masked to 32
    bits) as ``(w0 << 31) ^ w1``.

    The per-client streams, keyed by (round, client), are derived once per client and round, and
    SeedSequence costs ~10 us (more on a loaded host) there; for them the same words are computed by
    ``_round_client_seed``, which mixes the words of (seed, purpose, round) once per round."""
    if len(keys) == 2:  # (round, client): the per-client streams, once per client and round
        return _round_client_seed(_round_part(int(seed) & _WORD, _purpose_key(purpose), int(keys[0]) & _WORD),
                                  int(keys[1]) & _WORD)
    words = [int(seed) & _WORD, _purpose_key(purpose), *(int(k) & _WORD for k in keys)]
    w0, w1 = (int(w) for w in np.random.SeedSequence(words).generate_state(2, dtype=np.uint32))
    return (w0 << 31) ^ w1


# NumPy's SeedSequence (numpy/random/bit_generator.pyx, after M. O'Neill's seed_seq_fe), written
# out for an entropy of exactly its pool size (4 words): seed, purpose, round, client. The test
# tests/system/test_seeding.py compares it with np.random.SeedSequence on random words.
_WORD = 0xFFFFFFFF
_POOL_SIZE = 4
_XSHIFT = 16
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715


def _hash_constants(init: int, mult: int, count: int) -> tuple[tuple[int, int], ...]:
    """The (xor, multiplier) pair of each successive hashmix call: SeedSequence's hash constant
    starts at ``init`` and is multiplied by ``mult`` before each use as a multiplier, whatever the
    values hashed, so call k's constants are fixed."""
    pairs, const = [], init
    for _ in range(count):
        nxt = (const * mult) & _WORD
        pairs.append((const, nxt))
        const = nxt
    return tuple(pairs)


_MIXING = _hash_constants(0x43B0D7E5, 0x931E8875, _POOL_SIZE * _POOL_SIZE)  # mix_entropy's 16 calls
_OUTPUT = _hash_constants(0x8B51F9DD, 0x58F38DED, 2)  # generate_state's first two words


def _hashmix(value: int, call: int, constants=_MIXING) -> int:
    xor, mult = constants[call]
    value = ((value ^ xor) * mult) & _WORD
    return value ^ (value >> _XSHIFT)


def _mix(x: int, y: int) -> int:
    value = (_MIX_MULT_L * x - _MIX_MULT_R * y) & _WORD
    return value ^ (value >> _XSHIFT)


@functools.lru_cache(maxsize=4096)
def _round_part(seed_word: int, purpose_word: int, round_word: int) -> tuple[int, int, tuple[int, int, int]]:
    """SeedSequence's mixing of [seed, purpose, round, client] up to where the client's word
    matters. The pool starts as hashmix(word i, call i); then, for each source word s in turn,
    every other pool word d becomes mix(pool[d], hashmix(pool[s], next call)). Pool words 0-2 never
    read word 3 before s = 3, so for a given (seed, purpose, round) the pool words 0 and 1 before
    s = 3, and the three hashes mixed into word 3 for s = 0, 1, 2, are the same for every client.
    Returns (pool[0], pool[1], those three hashes)."""
    m0, m1, m2 = _hashmix(seed_word, 0), _hashmix(purpose_word, 1), _hashmix(round_word, 2)
    into_client = [_hashmix(m0, 6)]  # s = 0: calls 4, 5, 6 for d = 1, 2, 3
    m1, m2 = _mix(m1, _hashmix(m0, 4)), _mix(m2, _hashmix(m0, 5))
    into_client.append(_hashmix(m1, 9))  # s = 1: calls 7, 8, 9 for d = 0, 2, 3
    m0, m2 = _mix(m0, _hashmix(m1, 7)), _mix(m2, _hashmix(m1, 8))
    into_client.append(_hashmix(m2, 12))  # s = 2: calls 10, 11, 12 for d = 0, 1, 3
    m0, m1 = _mix(m0, _hashmix(m2, 10)), _mix(m1, _hashmix(m2, 11))
    return m0, m1, tuple(into_client)


def _round_client_seed(part: tuple[int, int, tuple[int, int, int]], client_word: int, W=_WORD, L=_MIX_MULT_L,
                       R=_MIX_MULT_R, x3=_MIXING[3][0], k3=_MIXING[3][1], x13=_MIXING[13][0], k13=_MIXING[13][1],
                       x14=_MIXING[14][0], k14=_MIXING[14][1], xo0=_OUTPUT[0][0], ko0=_OUTPUT[0][1],
                       xo1=_OUTPUT[1][0], ko1=_OUTPUT[1][1]) -> int:
    """The rest of the mixing for one client's word, generate_state's first two words (which read
    pool words 0 and 1 only, so s = 3's mixing into word 2, call 15, is not needed) and the seed
    made of them. Written out as straight-line arithmetic on locals (constants bound as defaults):
    it runs once per client and round, where calling ``_hashmix`` and ``_mix`` eleven times cost
    more than the arithmetic (~3 us against ~1 us). In ``_hashmix``/``_mix`` terms::

        m3 = hashmix(client_word, 3); m3 = mix(m3, h) for h in the round's three hashes
        m0, m1 = mix(m0, hashmix(m3, 13)), mix(m1, hashmix(m3, 14))
        seed = (hashmix(m0, output 0) << 31) ^ hashmix(m1, output 1)
    """
    m0, m1, (a, b, c) = part
    m = ((client_word ^ x3) * k3) & W
    m ^= m >> 16
    for value in (a, b, c):
        m = (L * m - R * value) & W
        m ^= m >> 16
    h = ((m ^ x13) * k13) & W
    h ^= h >> 16
    m0 = (L * m0 - R * h) & W
    m0 ^= m0 >> 16
    h = ((m ^ x14) * k14) & W
    h ^= h >> 16
    m1 = (L * m1 - R * h) & W
    m1 ^= m1 >> 16
    w0 = ((m0 ^ xo0) * ko0) & W
    w1 = ((m1 ^ xo1) * ko1) & W
    return ((w0 ^ (w0 >> 16)) << 31) ^ w1 ^ (w1 >> 16)


def numpy_rng(seed: int, purpose: str, *keys: int) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, purpose, *keys))


def torch_generator(seed: int, purpose: str, *keys: int, device: str | torch.device = "cpu") -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(derive_seed(seed, purpose, *keys))
    return generator


_SCRATCH = threading.local()


def scratch_generator(seed: int, purpose: str, *keys: int) -> torch.Generator:
    """``torch_generator``'s stream (CPU), in a generator the calling thread reuses: valid until the
    thread's next call, for draws made at once (a client's batch permutations). Saves building a
    generator per client and round (~3 us); re-seeding resets all of its state."""
    generator = getattr(_SCRATCH, "generator", None)
    if generator is None:
        generator = _SCRATCH.generator = torch.Generator()
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
