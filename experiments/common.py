"""What the experiment scripts share: the import path of the simulator, where outputs go, generating
a partition with a ``dataset/generate_*.py`` script, one table row's repeated runs through
``main.main`` and the mean ± std of a number over those repeats."""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, NamedTuple, Sequence

import h5py
import numpy as np

REPO = Path(__file__).resolve().parents[1]
# ``system/`` is the simulator's import root, as when PFLlib runs ``python main.py`` from there.
sys.path.insert(0, str(REPO / "system"))

import main  # noqa: E402
from flcore.registry import ALGORITHMS  # noqa: E402
from reporting.results import result_path  # noqa: E402
from runner.run_control import is_finished  # noqa: E402

OUT = REPO / "experiments" / "out"
#: MNIST's four IDX files for the scripts that generate an MNIST partition: where
#: ``dataset/generate_MNIST.py`` downloads them (run it once), or the folder named by $MNIST_RAW
MNIST_RAW = Path(os.environ.get("MNIST_RAW", REPO / "dataset" / "MNIST" / "rawdata"))


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
    """A row's runs: the results files of the seeds that finished (seed order), when the row started
    (``time.perf_counter``), and the seeds that diverged, each as its results file (the curve up to
    the divergence: under an attack ``main`` records the collapse as the run's outcome, ``diverged_round``;
    otherwise it keeps the results marked unfinished) and the round it diverged in, counted from 1 as
    the evaluation after round r is (``main``'s messages count training rounds from 0): a seed
    that diverged in round r holds r evaluations, those after rounds 0..r-1."""

    paths: list[Path]
    started: float
    diverged: Mapping[Path, int] = MappingProxyType({})

    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def every_seed(self) -> list[Path]:
        """The results file of every seed, finished or diverged, in seed order."""
        return sorted([*self.paths, *self.diverged], key=run_index)

    def note(self) -> str:
        """``diverged at round r in k/n seeds`` (rounds listed when they differ); empty when none diverged."""
        if not self.diverged:
            return ""
        rounds = sorted(set(self.diverged.values()))
        where = f"round {rounds[0]}" if len(rounds) == 1 else "rounds " + ", ".join(map(str, rounds))
        return f"diverged at {where} in {len(self.diverged)}/{len(self.paths) + len(self.diverged)} seeds"


def run_index(path: Path) -> int:
    """The run (repeat) index ``i`` of a results file ``<dataset>_<algorithm>_<goal>_<i>.h5``."""
    return int(path.stem.rsplit("_", 1)[1])


def diverged_round(path: Path) -> int | None:
    """The round a run diverged in, counted from 1, when ``path`` holds a diverged run's results: a
    collapse under an attack (``diverged_round``) or the unfinished results ``main`` keeps of another
    divergence (None: no such file, a run that did not diverge, or one stopped for another reason)."""
    try:
        with h5py.File(path, "r") as f:
            if "diverged_round" in f.attrs:
                return int(f.attrs["diverged_round"]) + 1  # main's training round index, from 0
            if bool(f.attrs.get("finished", True)) or "stopped_at_round" not in f.attrs:
                return None
            return int(f.attrs["stopped_at_round"]) + 1
    except OSError:
        return None


def results_folder(experiment: str, label: str) -> Path:
    """Where :func:`run_variant` puts a row's results files: ``out/results/<experiment>/<tag>``, the
    tag being the label with every character other than a letter or digit replaced by ``_``."""
    return OUT / "results" / experiment / "".join(ch if ch.isalnum() else "_" for ch in label)


def run_variant(experiment: str, label: str, algo: str, flags: list[str], data: Path, args: argparse.Namespace,
                model: str, rounds: int, extra: Sequence[str] = (), quiet: bool = False,
                diverged_is_result: bool = False) -> Run | str:
    """One table row through ``main.main`` with the script's ``args`` (lr, batch size, epochs, device,
    seed, ``-t`` repeats), ``extra`` main flags and the row's own ``flags``; its results go to a freshly emptied
    ``out/results/<experiment>/<tag>`` (an interrupted run's checkpoint goes too, so a rerun starts afresh).

    Every seed runs, whatever the others did: a seed whose training diverges (``main`` exits 2 and
    keeps its curve up to the divergence) does not stop the row; the seeds after it run on (``-pv``).
    With ``diverged_is_result`` (attack experiments, where collapsing is the outcome measured) the
    row is a :class:`Run` whose ``diverged`` holds those seeds; otherwise any diverged seed makes the
    row a note, ``diverged at round r in k/n seeds``. Returns the run, or a note on why there are no
    results. ``quiet`` swallows what ``main`` prints, for scripts that print only their table."""
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
    name = ALGORITHMS.get(algo).registered_name  # the name main writes into the file names
    files = [result_path(str(data), name, tag, i, results) for i in range(args.times)]
    started = time.perf_counter()
    diverged: dict[Path, int] = {}
    first = 0  # the first seed (run index) not run yet: run i has seed args.seed + i, as in one main call
    while first < args.times:
        try:
            with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
                code = main.main([*argv, "-pv", str(first)])
        except SystemExit as exc:  # argparse rejects a flag the algorithm does not (yet) declare
            return f"failed: command line rejected (exit {exc.code})"
        if code == 0:  # seeds that collapsed under an attack are finished results that say so
            diverged.update({f: r for f in files[first:] if (r := diverged_round(f)) is not None})
            break
        failed = next((i for i in range(first, args.times) if not is_finished(files[i])), None)
        stopped = diverged_round(files[failed]) if code == 2 and failed is not None else None
        if stopped is None:
            return f"failed: main.main exited with {code}"
        diverged[files[failed]] = stopped
        first = failed + 1
    run = Run([f for f in files if f not in diverged], started, MappingProxyType(diverged))
    if diverged and not diverged_is_result:
        return run.note()
    return run


def mean_std(values: Sequence[float | None], scale: float = 100.0, digits: int = 2) -> str:
    """``mean ± std`` over the repeats (population std, as PFLlib's ``average_data``), scaled (100:
    percent); repeats without a value (None or NaN: a target never reached) are left out and
    counted, e.g. ``41.50 ± 3.50 (2/3)``; ``–`` when none has one."""
    present = [float(v) for v in values if v is not None and np.isfinite(v)]
    if not present:
        return "–"
    text = f"{scale * np.mean(present):.{digits}f} ± {scale * np.std(present):.{digits}f}"
    return text if len(present) == len(values) else f"{text} ({len(present)}/{len(values)})"


def _row_label(row: str) -> str:
    """A table row's first cell."""
    return row.split("|")[1].strip() if row.startswith("|") and row.count("|") >= 2 else ""


def _table_bodies(lines: list[str]) -> list[tuple[int, int]]:
    """(first, end) of each table's rows in ``lines``: the rows after a ``|---`` line, up to the first
    line that is not a table row."""
    bodies = []
    for i, line in enumerate(lines):
        if line.startswith("|---"):
            end = i + 1
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            bodies.append((i + 1, end))
    return bodies


def _table_key(lines: list[str], first: int) -> tuple[str, str]:
    """What names the table whose rows start at ``first``: its column line and the nearest heading
    (a ``#`` line) above it (the sparse table's three tables share their columns)."""
    heading = next((line for line in reversed(lines[: first - 2]) if line.startswith("#")), "")
    return heading, lines[first - 2] if first >= 2 else ""


def _merged_body(old: list[str], new: list[str], labels: Sequence[str]) -> list[str]:
    def rerun(row: str) -> str | None:
        cell = _row_label(row)
        return next((label for label in labels if cell == label or cell.startswith(label + " (")), None)

    fresh = {rerun(row): row for row in new if rerun(row) is not None}
    rows = [fresh.pop(rerun(row)) if rerun(row) in fresh else row for row in old
            if row.strip() and (rerun(row) is None or rerun(row) in fresh)]
    return rows + [row for row in new if row in fresh.values()]


def merged_rows(old: list[str], new: list[str], labels: Sequence[str]) -> list[str]:
    """``new`` (a header, then one or more tables) with the rows of ``old`` for labels not rerun now
    kept, where both files describe the same setting (the same lines up to the first table's
    ``|---``): rows run side by side with ``--only`` each keep the others'. Each table of ``new`` is
    merged with the table of ``old`` of the same columns under the same heading; a rerun label's old
    row (``label`` or ``label (note)``) is replaced by its new one in place; text between the tables
    is ``new``'s."""
    bodies = _table_bodies(new)
    if not bodies or old[: bodies[0][0]] != new[: bodies[0][0]]:
        return new  # another setting (seeds, rounds, columns): the old rows do not belong to this table
    old_bodies = {_table_key(old, first): (first, end) for first, end in _table_bodies(old)}
    merged, at = [], 0
    for first, end in bodies:
        merged += new[at:first]
        key = _table_key(new, first)
        if key in old_bodies:
            old_first, old_end = old_bodies[key]
            merged += _merged_body(old[old_first:old_end], new[first:end], labels)
        else:
            merged += new[first:end]
        at = end
    return merged + new[at:]


def write_table(name: str, lines: list[str], only: Sequence[str] = ()) -> None:
    """The table as ``out/<name>.md``, and on stdout. ``only``: the labels this call ran (a script's
    ``--only``); the file then keeps the other rows of an earlier call with the same header."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.md"
    if only and path.exists():
        lines = merged_rows(path.read_text().splitlines(), lines, only)
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
