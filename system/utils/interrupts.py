"""SIGINT and SIGTERM outside a run's training (``runner.run_control.StopOnSignal`` handles them during
it): start-up (imports, the dataset, the model), between the ``-t`` repeats, and while the results
are written.

There the run stops at once with ``KeyboardInterrupt``, as Python's own SIGINT handler does, and
the signal is also recorded, for two cases where an exception raised at once goes astray:

* Python swallows an exception raised inside a finalizer or a weakref callback that the garbage
  collector happens to run at that moment (it prints ``Exception ignored in ...`` and goes on): a
  Ctrl-C that landed there was lost and the run went on to its last round, exit status 0.
  :meth:`Interrupts.check` raises a recorded signal again where it cannot be lost (when training
  starts, and after a deferred section).
* A signal mask does not keep a few statements whole (renaming a run's files into place): the
  kernel hands the signal to another thread (the engine's workers) and Python runs its handler in
  the main thread all the same. Inside :meth:`Interrupts.deferred` a signal is only recorded, and
  raised when the section ends.

SIGTERM stops the same way (``Interrupted.exit_status`` 143) instead of killing the process where
it stands, so no temporary file is left behind. This module imports only the standard library: main.py installs
it before its seconds of imports.
"""
from __future__ import annotations

import contextlib
import signal
from typing import Iterator

#: exit status of a run stopped by each signal (128 + signal number, the shell's convention)
EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Interrupted(KeyboardInterrupt):
    """A signal stopped the run outside training."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS[self.signum]


class Interrupts:
    """The process's SIGINT/SIGTERM handler outside training (see the module docstring). Used as a
    context manager around a whole ``main()``; nested uses share the outermost one's record."""

    def __init__(self) -> None:
        self.pending: int | None = None  # a signal received and not yet acted on by a check
        self._deferring = 0
        self._depth = 0
        self._previous: dict[int, object] = {}

    def handle(self, signum: int, frame) -> None:
        self.pending = signum
        if not self._deferring:
            raise Interrupted(signum)

    def check(self) -> None:
        """Raise :class:`Interrupted` for a signal received since the last check (its first
        raising may have been swallowed)."""
        if self.pending is not None:
            signum, self.pending = self.pending, None
            raise Interrupted(signum)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A section no signal splits: one received meanwhile is raised when it ends."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        self.check()

    def install(self) -> None:
        """Handle the signals from now until the process ends (main.py, before its imports)."""
        self.__enter__()

    def __enter__(self) -> "Interrupts":
        if self._depth == 0:
            self.pending = None
            for signum in EXIT_STATUS:
                try:
                    self._previous[signum] = signal.signal(signum, self.handle)
                except ValueError:  # not the main thread: keep the default behaviour
                    pass
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
            self._previous.clear()
            self.pending = None


#: the one instance: main.py's, and the one StopOnSignal checks when training starts
INTERRUPTS = Interrupts()
