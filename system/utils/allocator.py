"""glibc's allocator keeps freed memory in the process (``--malloc_keep_freed``).

By default glibc gives large freed blocks back to the system: a block over the mmap threshold
(dynamic, at most 32 MiB) is unmapped when freed, and free memory at the top of the heap beyond
the trim threshold is released. The next block of that size then starts from fresh pages, and the
kernel zeroes and maps each 4 KiB page on its first touch (a page fault). PyTorch's CPU tensors
come straight from malloc, so an algorithm that makes large temporaries every local step pays
these faults every step: a 93 MB float64 copy of 20 MNIST CNNs took 53 ms with the faults and 9 ms
without.

:func:`keep_freed_memory` raises both thresholds once, at the start of a run (``mallopt``
through ctypes), so freed blocks stay in the heap and are reused without faults. It only changes
where freed memory waits: the numbers a run computes are the same. On another C library (macOS,
musl) it does nothing and says so in one debug line. Imports no torch (a child process can test it
cheaply).

Why on by default (``--malloc_keep_freed``; 2-core CPU shared with other jobs, one thread,
docs/results/performance.md "glibc's freed memory..."): APPLE -dlr 0.01, whose DR gradient makes a 93 MB
float64 temporary each step, took 11.4 CPU s a round against 13.4 (-15%); FedAvg, pFedMe, APPLE, FedAS,
FedKD and Ditto, whose per-step temporaries are model-sized (2.3 MB, under glibc's own adaptive
threshold) or already in reused buffers, moved within the machine's noise (±6%). The peak RSS it
could raise, by keeping memory that would have been returned, rose 0.2% on a P1 FedAvg run (498 to
499 MB) and 0.4% on benchmark.py's P3 (4,800 to 4,817 MB, sequential; threaded 4,902 to 4,876 MB).
"""
from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("fl")

#: mallopt's parameter numbers (glibc's <malloc.h>)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: blocks up to this size come from the heap, not from mmap (glibc's own threshold grows to 32 MiB at
#: most: a 93 MB float64 copy of 20 CNN models was mapped and faulted in afresh every time)
MMAP_THRESHOLD = 1024**3
#: free memory at the top of the heap kept before glibc returns any of it
TRIM_THRESHOLD = 1024**3

MODES = ("on", "off")


def glibc_version() -> str | None:
    """'2.36' on glibc, None on another C library."""
    try:
        name = os.confstr("CS_GNU_LIBC_VERSION")  # 'glibc 2.36'; absent (ValueError) or None elsewhere
    except (ValueError, OSError, AttributeError):
        return None
    if not name or not name.startswith("glibc "):
        return None
    return name.split()[1]


def keep_freed_memory(mode: str, mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Apply ``--malloc_keep_freed mode`` to this process; True when glibc took both settings.

    ``off`` leaves glibc's defaults; ``on`` (the default) sets the mmap and trim thresholds. The
    settings apply to blocks allocated from then on, and last for the process."""
    if mode not in MODES:
        raise ValueError(f"--malloc_keep_freed {mode!r}: use one of {', '.join(MODES)}")
    if mode == "off":
        return False
    version = glibc_version()
    if version is None:
        log.debug("--malloc_keep_freed %s: not glibc, the allocator is left as it is", mode)
        return False
    libc = ctypes.CDLL(None)
    taken = [libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(mmap_threshold)),
             libc.mallopt(M_TRIM_THRESHOLD, ctypes.c_int(trim_threshold))]
    if not all(taken):
        log.debug("--malloc_keep_freed %s: glibc %s refused mallopt (%s)", mode, version, taken)
        return False
    return True
