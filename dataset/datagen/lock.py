"""The marker a generator holds while it writes a dataset folder.

``<folder>/.writing.lock`` holds the writer's pid, and the writer holds an exclusive ``flock`` on
it from the moment it starts replacing files until ``config.json`` (written last) is in place;
then the marker is removed. The simulator's loader (``system/fldata/loading.py``,
``check_not_being_written``) refuses a folder whose marker is locked ("being written by a
generator (pid N)"), and, as the kernel drops the lock of a process however it ends, tells a
marker left by a killed generator (lock free, no ``config.json``) from a live one. A generator
that fails or is interrupted leaves its marker the same way. A second generator on the same
folder is refused.
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import DatasetError

#: the marker's name (``system/fldata/loading.py`` looks for the same name)
LOCK_NAME = ".writing.lock"
#: a reader checks the marker by taking a shared lock for an instant: retry that long before
#: concluding that another generator holds it
_BUSY_RETRY_S = 0.5


def _take(path: Path) -> int:
    """An open descriptor of the marker at ``path`` with our exclusive lock on it."""
    deadline = time.monotonic() + _BUSY_RETRY_S
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            if time.monotonic() > deadline:
                raise DatasetError(f"{path.parent} is being written by another generator (pid {pid}); "
                                   f"wait for it to finish") from None
            time.sleep(0.05)
            continue
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        # The previous holder removed the marker between our open and our lock: take the new one.
        os.close(fd)


@contextmanager
def writing(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s writer marker (creating the folder) while the block writes it."""
    path = folder / LOCK_NAME
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = _take(path)
    except OSError as exc:  # a file in the way, a read-only or virtual file system
        raise DatasetError(f"cannot write {exc.filename or folder} ({exc.strerror or exc}); "
                           f"pass another --out-dir") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    except BaseException:
        # A failed or interrupted write leaves the marker, unlocked, as a kill does: the loader
        # then tells an incomplete folder (no config.json) from a live writer, and the next
        # generator recognises its client files as a generator's (out_dir.py).
        os.close(fd)
        raise
    # Removed while still locked, so no other writer can take this inode after us.
    path.unlink(missing_ok=True)
    os.close(fd)
