"""What the reporting tools (plot.py, summarize.py, report.py) share on the command line:
the results folder flag in both spellings, remarks on stderr, one-line errors, safe outputs."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

from reporting.loading import PlotError
from utils.errors import FLError
from reporting.results import write_atomically


def default_results_dir() -> str:
    """``<repo>/results`` relative to the working directory (``../results`` from ``system/``)."""
    results = Path(__file__).resolve().parents[2] / "results"
    try:
        return os.path.relpath(results)
    except ValueError:  # another drive on Windows
        return str(results)


def add_results_dir_flag(parser: argparse.ArgumentParser) -> None:
    """``--results_dir`` (main.py's spelling) and ``--results-dir``, one option."""
    parser.add_argument("--results_dir", "--results-dir", default=default_results_dir(),
                        help="folder with the .h5 files (default: %(default)s)")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


class NotePrinter:
    """Prints remarks (not errors) on stderr as ``note: ...``, each distinct one once."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, message: str | None) -> None:
        if message and message not in self._seen:
            self._seen.add(message)
            print(f"note: {message}", file=sys.stderr)


def one_line_errors(prog: str, body: Callable[[], None]) -> int:
    """Run ``body``; every error becomes one line on stderr and exit status 2, never a traceback
    (the promise of plot.py, summarize.py and report.py). Returns the exit status."""
    try:
        body()
    except (FLError, OSError) as exc:
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the CLI promises one line, never a traceback
        print(f"{prog}: error: unexpected {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


def write_output(path: Path, text: str, flag: str) -> None:
    """Write an output file atomically (never half-written); an error names ``flag``, the
    option that chose the path (``--out``, ``--csv``, or ``--results_dir`` for the defaults)."""
    if path.is_dir():
        raise PlotError(f"cannot write {path}: it is a folder; pass {flag} with a file name")
    write_atomically(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), flag=flag)
