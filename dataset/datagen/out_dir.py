"""The output folder of a generator or of the converter, checked before anything is read or written.

A generator replaces the client files of its folder (``train/<i>.npz``, ``test/<i>.npz``) and its
``config.json``; so it writes only into a folder that is new, empty, or holds nothing but what a
generator writes there. An empty ``--out-dir ""`` (an unset shell variable) would otherwise mean
the current folder, and ``--out-dir .`` run from ``dataset/`` would scatter a dataset among the
scripts. A path that cannot become a folder (a file, a file's child, a read-only or virtual file
system) is refused with one line as well, rather than failing in ``mkdir`` with a traceback.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import DatasetError
from .lock import LOCK_NAME

#: what a generator (or the converter) writes at the top of its folder: ``rawdata/`` is the download
#: cache, ``tokenizer.json`` the text datasets' tokenizer (text.py); the writer marker is hidden
GENERATED_FILES = frozenset({"config.json", "partition.png", "tokenizer.json"})
GENERATED_FOLDERS = frozenset({"train", "test", "rawdata"})
#: client files (npz layout) or a split's packed files (layout.py), and their temporary names
_CLIENT_FILE = re.compile(r"(\d+\.npz|x\.npy|y\.npy|offsets\.npy)(\.tmp)?")


def _is_generated_entry(entry: Path) -> bool:
    """Whether a generator writes ``entry`` (one name inside the output folder), or a file
    manager's hidden litter (``.DS_Store``), which no generator touches."""
    name = entry.name
    if name.startswith("."):  # the writer marker among them
        return True
    if name in GENERATED_FOLDERS:
        if not entry.is_dir():
            return False
        if name == "rawdata":
            return True  # downloads, whatever the source's file names
        return all(_CLIENT_FILE.fullmatch(f.name) and f.is_file() for f in entry.iterdir())
    # a temporary name of a killed run: config.json.tmp, partition.png.tmp.png ...
    stem = name.split(".tmp")[0] if ".tmp" in name else name
    return stem in GENERATED_FILES and not entry.is_dir()


def _marked_as_generated(folder: Path) -> bool:
    """Client files in ``folder`` come with the ``config.json`` written last or with the marker a
    stopped generator leaves (lock.py); else they are someone else's, whatever their names."""
    has_clients = any(any((folder / part).iterdir()) for part in ("train", "test")
                      if (folder / part).is_dir())
    return not has_clients or any((folder / name).is_file()
                                  for name in ("config.json", "config.json.tmp", LOCK_NAME))


def _check_can_hold_folder(folder: Path, flag: str) -> None:
    """``folder`` is, or can be made, a writable folder (its nearest existing ancestor is a
    writable folder); else one line saying why not."""
    existing = folder
    while not existing.exists() and not existing.is_symlink() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == folder else f"is inside {existing}, which is a file"
        raise DatasetError(f"{flag} {folder} {where}; pass a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise DatasetError(f"{flag} {folder}: {existing} is read-only (no write permission or a "
                           f"read-only file system); pass a writable folder")


def _check_dedicated(folder: Path, flag: str) -> None:
    """``folder`` holds nothing but a generator's files, client files only with the
    ``config.json`` or the marker that a generator leaves beside them."""
    try:
        strangers = sorted(e.name for e in folder.iterdir() if not _is_generated_entry(e))
        marked = _marked_as_generated(folder)
    except OSError as exc:
        raise DatasetError(f"{flag} {folder}: cannot list it ({exc.strerror or exc})") from None
    if strangers:
        shown = ", ".join(strangers[:3]) + (f" and {len(strangers) - 3} more"
                                            if len(strangers) > 3 else "")
        raise DatasetError(f"{flag} {folder} holds files no generator wrote ({shown}); a "
                           f"generator replaces its folder's contents: pass a new or empty folder")
    if not marked:
        raise DatasetError(f"{flag} {folder} holds client files (train/, test/) without the "
                           f"config.json or marker a generator leaves, so they are not a "
                           f"generator's; a generator replaces them: pass a new or empty folder")


def output_folder(value: str | Path | None, default: Path | None = None, *,
                  flag: str = "--out-dir") -> Path:
    """The absolute output folder: ``value`` (the user's ``--out-dir``) or ``default``, refused
    with a :class:`DatasetError` when empty, not writable or holding files no generator wrote."""
    if isinstance(value, str) and not value.strip():
        hint = f", or leave {flag} out for {default}" if default is not None else ""
        raise DatasetError(f"{flag} is empty (an unset shell variable?); pass the folder to "
                           f"write{hint}")
    folder = Path(default if value is None else value).resolve()
    _check_can_hold_folder(folder, flag)
    if folder.is_dir():
        _check_dedicated(folder, flag)
    return folder
