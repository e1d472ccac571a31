"""What a run may do with its result file, and how it stops when asked to.

**Claims.** Before anything is loaded, each run of ``-t`` claims its result file
``results/<data>_<algo>_<goal>_<run>.h5``: it takes an exclusive lock (``flock`` on a hidden
``.<name>.lock`` next to it, released by the kernel if the process dies) and decides what to do:

==========================================  ===========================================
found                                       without flags / ``--overwrite`` / ``--resume``
==========================================  ===========================================
nothing                                     run / run / run (nothing to resume)
a checkpoint (an interrupted run)           refuse / run from scratch / continue it
finished results                            refuse / run, replace at the end / skip
unfinished results, no checkpoint           refuse / run from scratch / refuse
another process holds the lock              refuse, naming its pid (every mode)
==========================================  ===========================================

so two runs started at once with the same ``-go`` cannot both write the same file, and no
result is ever replaced without ``--overwrite``. Even then finished results are replaced only by
finished ones: ``main.py`` writes the new model and results under temporary names and renames them
into place (models first) when the run completes, so an interrupted or diverged ``--overwrite``
leaves the old results and model byte for byte (its checkpoint continues it with ``--resume``).
A file at the result's path that is not a readable result file is called corrupt, a folder there
is refused in every mode.

**Stopping.** :class:`StopOnSignal` turns the first Ctrl-C (SIGINT) or SIGTERM into a request
that the round loop honours at the end of the current round (checkpoint and results so far are
written, :class:`RunInterrupted` carries the exit status 130/143); a second signal interrupts
at once (``KeyboardInterrupt``), leaving no partial file because every file is written under a
temporary name and renamed.
"""
from __future__ import annotations

import errno
import fcntl
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import h5py

from runner.checkpoint import checkpoint_path
from utils.errors import FLError
from utils.interrupts import EXIT_STATUS, INTERRUPTS



class RunInterrupted(Exception):
    """The run stopped at a signal's request after a complete round."""

    def __init__(self, signum: int, next_round: int):
        super().__init__(f"{signal.Signals(signum).name} after round {next_round - 1}")
        self.signum = signum
        self.next_round = next_round

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS.get(self.signum, 128 + int(self.signum))


@dataclass
class Claim:
    """One run's result file, locked by this process, and what the run does with it."""

    result: Path
    action: str  # "run" (from scratch), "resume" (from the checkpoint) or "skip" (already finished)
    lock: IO | None = field(default=None, repr=False)

    @property
    def checkpoint(self) -> Path:
        return checkpoint_path(self.result)

    def release(self) -> None:
        if self.lock is None:
            return
        try:
            Path(self.lock.name).unlink(missing_ok=True)  # still ours: unlink before the lock goes
        finally:
            self.lock.close()
            self.lock = None


def _lock(result: Path) -> IO:
    """An exclusive lock on ``.<name>.lock`` beside ``result``, or a one-line refusal."""
    result.parent.mkdir(parents=True, exist_ok=True)
    path = result.parent / f".{result.name}.lock"
    while True:
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            handle.close()
            raise FLError(
                f"another run (pid {owner}) is writing {result}; wait for it, or pick another name with -go"
            ) from None
        # the holder we waited on may have unlinked the file it locked: lock the one that is there now
        try:
            same = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            try:
                handle.seek(0)
                handle.truncate()
                handle.write(str(os.getpid()))
                handle.flush()
            except OSError:  # a full disk: the lock holds without the pid, but leave no file behind
                path.unlink(missing_ok=True)
                handle.close()
                raise
            return handle
        handle.close()


def is_finished(result: Path) -> bool:
    """Whether a result file holds a complete run (files without the mark, like PFLlib's, do)."""
    try:
        with h5py.File(result, "r") as f:
            return bool(f.attrs.get("finished", True))
    except OSError:
        return False  # unreadable: treat as unfinished, never as a result to keep


def claim(result: Path, overwrite: bool, resume: bool) -> Claim:
    """Lock ``result`` and decide the run's action (see the module's table)."""
    try:
        lock = _lock(result)
    except PermissionError:
        raise FLError(f"cannot write in {result.parent}: permission denied; pass a writable --results_dir") from None
    except OSError as exc:
        if exc.errno == errno.EROFS:
            raise FLError(f"cannot write in {result.parent}: it is read-only; pass a writable --results_dir") from None
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise FLError(f"cannot write in {result.parent}: {exc.strerror}; free space or pass another --results_dir") from None
        if exc.errno in (errno.ENOTDIR, errno.EEXIST):
            blocker = next((p for p in (result.parent, *result.parent.parents) if p.exists()), result.parent)
            raise FLError(f"cannot write in {result.parent}: {blocker} is a file, not a folder; "
                          "pass a folder as --results_dir") from None
        # anything else the OS refuses (a name too long, locks unsupported on a network share, ...)
        raise FLError(f"cannot write in {result.parent}: {exc.strerror or exc}; pass another --results_dir") from None
    checkpoint = checkpoint_path(result)
    found = Claim(result, "run", lock)
    name = result.name
    state = result_state(result)
    try:
        if state == "not a file" or (checkpoint.exists() and not checkpoint.is_file()):
            blocker = result if state == "not a file" else checkpoint
            raise FLError(f"{blocker} is a folder or other non-file where this run writes; move it away or pick "
                          "another -go")
        if resume and checkpoint.exists():
            found.action = "resume"
        elif resume and state == "finished":
            found.action = "skip"
        elif resume and state != "absent":
            what = "not a readable result file (corrupt or truncated)" if state == "corrupt" else \
                "an unfinished run without a checkpoint to resume"
            raise FLError(f"{name} is {what}; rerun it with --overwrite")
        elif not overwrite and not resume and state != "absent":
            what = {"finished": "already holds results of a finished run",
                    "unfinished": "already holds an unfinished run",
                    "corrupt": "is not a readable result file (corrupt or truncated)"}[state]
            resumable = f", or --resume to continue the interrupted run in {checkpoint.name}" if checkpoint.exists() else ""
            raise FLError(f"{result} {what}; pass --overwrite to replace it, or another -go to keep both{resumable}")
        elif not overwrite and not resume and checkpoint.exists():
            raise FLError(f"{checkpoint} holds the checkpoint of an interrupted run; pass --resume to continue it, "
                          "--overwrite to start again, or another -go to keep both")
    except FLError:
        found.release()
        raise
    return found


def result_state(result: Path) -> str:
    """What ``result`` holds: "absent", "finished", "unfinished", "corrupt" (not readable as a
    result file) or "not a file" (a folder, a device...)."""
    if not result.exists() and not result.is_symlink():
        return "absent"
    if not result.is_file():
        return "not a file"
    try:
        with h5py.File(result, "r") as f:
            return "finished" if bool(f.attrs.get("finished", True)) else "unfinished"
    except OSError:
        return "corrupt"


def claim_all(results: list[Path], overwrite: bool, resume: bool) -> list[Claim]:
    """Claims for every run, or none (a refusal releases those already taken)."""
    if overwrite and resume:
        raise FLError("--overwrite and --resume exclude each other: --resume continues a run, --overwrite restarts it")
    claims: list[Claim] = []
    try:
        for result in results:
            claims.append(claim(result, overwrite, resume))
    except BaseException:
        for taken in claims:
            taken.release()
        raise
    return claims


class StopOnSignal:
    """While active, the first SIGINT/SIGTERM sets ``requested`` (the loop stops after the round);
    a second one raises ``KeyboardInterrupt`` at once. Entering it first raises a signal that
    arrived before (start-up, the repeat before) and whose ``KeyboardInterrupt`` was swallowed
    (``utils.interrupts``): the run then stops before training instead of running to its end."""

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame) -> None:
        if self.requested is not None:
            self.forced = signum
            raise KeyboardInterrupt
        self.requested = signum
        print(f"\n{signal.Signals(signum).name}: stopping after this round (again to stop at once)", flush=True)

    def __enter__(self) -> "StopOnSignal":
        INTERRUPTS.check()
        self.forced: int | None = None
        for signum in EXIT_STATUS:
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread (e.g. a library call): keep the default behaviour
                pass
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


def file_identity(path: Path) -> tuple[int, int] | None:
    """(inode, modification time) of ``path``, None when absent: a result committed (renamed into
    place) or rewritten since has another."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def interrupted_message(exc: KeyboardInterrupt) -> str:
    """What an invocation stopped by a signal outside training leaves: nothing, the results of the
    runs that completed (and those so far of a run stopped at a round's end), or all of them."""
    written = getattr(exc, "written", [])
    if getattr(exc, "complete", False):  # every run's finished results are in place
        return "interrupted after the results were written: they are complete"
    finished = [str(path) for path, done in written if done]
    partial = [str(path) for path, done in written if not done]
    parts = [f"the finished results in {', '.join(finished)} were written"] if finished else []
    if partial:
        parts.append(f"the results so far of the unfinished run are in {', '.join(partial)}, marked unfinished")
    else:
        parts.append("no result file was written for the unfinished run")
    return "interrupted: " + "; ".join(parts)
