"""The one exception type that reaches the user as a single line.

Anything the user can fix (a missing dataset, a wrong flag, a diverging run) raises
:class:`FLError` with a message that says what to do; ``main.py`` prints it as one line
and exits with status 2 instead of showing a traceback.
"""


class FLError(Exception):
    """A user-facing error: the message is printed as is, on one line."""


class Diverged(FLError):
    """Training produced NaN/inf (a client's loss or the aggregated model) in round ``round``;
    the results up to the round before are still worth keeping. ``collapse``: why the collapse is
    the run's measured outcome rather than a setting to fix (an attack it faces; None: a setting).
    ``what`` is what happened and ``advice`` what to change; the message is both."""

    def __init__(self, what: str, round: int, collapse: str | None = None, advice: str | None = None):
        super().__init__(f"{what}; {advice}" if advice else what)
        self.what = what
        self.round = round
        self.collapse = collapse
