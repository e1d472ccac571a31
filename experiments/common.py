"""What the experiment scripts share: the import path of the simulator, where outputs go, generating
a partition with a ``dataset/generate_*.py`` script, one table row's repeated runs through
``main.main`` and the mean ± std of a number over those repeats."""
from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
# ``system/`` is the simulator's import root, as when PFLlib runs ``python main.py`` from there.
sys.path.insert(0, str(REPO / "system"))

import main  # noqa: E402
from flcore.registry import ALGORITHMS  # noqa: E402

OUT = REPO / "experiments" / "out"
MNIST_RAW = REPO.parent / "shared" / "data" / "MNIST" / "raw"


def add_training_flags(parser: argparse.ArgumentParser, *, lr: float, lr_help: str, batch_size: int) -> None:
    """--lr, --batch_size, --local_epochs, --device, --seed and --times, which :func:`run_variant` hands
    to ``main``."""
    parser.add_argument("--lr", type=float, default=lr, help=lr_help)
    parser.add_argument("--batch_size", type=int, default=batch_size, help="local batch size B")
    parser.add_argument("--local_epochs", type=int, default=1, help="local epochs E")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--seed", type=int, default=0, help="seed of the first repeat")
    parser.add_argument("--times", type=int, default=3,
                        help="repeats of every row, with seeds seed..seed+times-1 (-t); tables show mean ± std")


def add_only_and_data_flags(parser: argparse.ArgumentParser, only_help: str) -> None:
    """--only (the table rows to run) and --data (a dataset folder to use instead of generating one)."""
    parser.add_argument("--only", nargs="*", default=None, help=only_help)
    parser.add_argument("--data", type=Path, default=None, help="dataset folder (default: generated under out/)")


def generate_data(generator: str, options: list[str]) -> None:
    """Run ``dataset/<generator>`` with ``options`` (each generator skips a folder that already holds
    the same partition, so a second call costs nothing)."""
    if not (REPO / "dataset" / generator).is_file():
        raise SystemExit(f"dataset/{generator} is missing; generate the data first or pass --data")
    subprocess.run([sys.executable, generator, *options], cwd=REPO / "dataset", check=True, stdout=subprocess.DEVNULL)


class Run(NamedTuple):
    """A finished run: its results files and when it started (``time.perf_counter``)."""

    paths: list[Path]
    started: float

    def seconds(self) -> float:
        return time.perf_counter() - self.started


def results_folder(experiment: str, label: str) -> Path:
    """Where :func:`run_variant` puts a row's results files: ``out/results/<experiment>/<tag>``, the
    tag being the label with every character other than a letter or digit replaced by ``_``."""
    return OUT / "results" / experiment / "".join(ch if ch.isalnum() else "_" for ch in label)


def run_variant(experiment: str, label: str, algo: str, flags: list[str], data: Path, args: argparse.Namespace,
                model: str, rounds: int, extra: Sequence[str] = (), quiet: bool = False) -> Run | str:
    """One table row through ``main.main`` with the script's ``args`` (lr, batch size, epochs, device,
    seed, ``-t`` repeats), ``extra`` main flags and the row's own ``flags``; its results go to a freshly emptied
    ``out/results/<experiment>/<tag>`` (an interrupted run's checkpoint goes too, so a rerun starts afresh).
    Returns the run, or a note on why there are no results.
    ``quiet`` swallows what ``main`` prints, for scripts that print only their table."""
    if algo not in ALGORITHMS:
        return f"skipped: algorithm {algo!r} is not registered"
    results = results_folder(experiment, label)
    tag = results.name
    # results, checkpoints and models of an earlier (or interrupted) run; a live run's lock file stays
    for old in results.glob("*"):
        if old.is_file() and not old.name.startswith("."):
            old.unlink()
    argv = ["-data", str(data), "-algo", algo, "-m", model, "-dev", args.device, "-gr", str(rounds),
            "-lr", str(args.lr), "-lbs", str(args.batch_size), "-ls", str(args.local_epochs),
            "--seed", str(args.seed), "-t", str(args.times), "-go", tag, "--results_dir", str(results), "--save_model", "False",
            "--eval_auc", "False", "--eval_train_loss", "False", "--progress", "False", "-q", "True", *extra, *flags]
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
            code = main.main(argv)
    except SystemExit as exc:  # argparse rejects a flag the algorithm does not (yet) declare
        return f"failed: command line rejected (exit {exc.code})"
    if code != 0:
        return f"failed: main.main exited with {code}"
    return Run(sorted(results.glob("*.h5")), started)


def mean_std(values: Sequence[float | None], scale: float = 100.0, digits: int = 2) -> str:
    """``mean ± std`` over the repeats (population std, as PFLlib's ``average_data``), scaled (100:
    percent); repeats without a value (None or NaN: a target never reached) are left out and
    counted, e.g. ``41.50 ± 3.50 (2/3)``; ``–`` when none has one."""
    present = [float(v) for v in values if v is not None and np.isfinite(v)]
    if not present:
        return "–"
    text = f"{scale * np.mean(present):.{digits}f} ± {scale * np.std(present):.{digits}f}"
    return text if len(present) == len(values) else f"{text} ({len(present)}/{len(values)})"


def write_table(name: str, lines: list[str]) -> None:
    """The table as ``out/<name>.md``, and on stdout."""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
