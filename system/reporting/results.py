"""Result files: ``results/<data>_<algo>_<goal>_<run>.h5``, written atomically.

The datasets ``rs_test_acc``, ``rs_test_auc`` and ``rs_train_loss`` are those PFLlib writes, so
its plotting code reads our files; the rest add what a benchmark needs (per-round time and
bytes, per-client accuracy) and the full configuration as attributes.
"""
from __future__ import annotations

import errno
import functools
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from utils.errors import FLError

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "results"


@dataclass
class RunHistory:
    """Everything recorded during one run, appended round by round."""

    eval_rounds: list[int] = field(default_factory=list)
    test_acc: list[float] = field(default_factory=list)
    test_auc: list[float] = field(default_factory=list)
    test_acc_std: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    client_acc: list[np.ndarray] = field(default_factory=list)
    round_time: list[float] = field(default_factory=list)
    bytes_up: list[int] = field(default_factory=list)
    bytes_down: list[int] = field(default_factory=list)
    clients_per_round: list[int] = field(default_factory=list)
    extra_series: dict[str, list[Any]] = field(default_factory=dict)
    #: why the run stopped before -gr rounds (``Server.stop_early``); None: it ran them all
    stop_reason: str | None = None

    def add_series(self, name: str, value: Any) -> None:
        """Record an algorithm-specific per-round value (stored as ``rs_<name>``)."""
        self.extra_series.setdefault(name, []).append(value)


def result_path(dataset: str, algorithm: str, goal: str, run: int, results_dir: str | Path | None = None) -> Path:
    folder = Path(results_dir) if results_dir else RESULTS_DIR
    return folder / f"{Path(dataset).name}_{algorithm}_{goal}_{run}.h5"


def _as_array(values: list[Any]) -> np.ndarray:
    try:
        return np.asarray(values)
    except ValueError:  # ragged rows, e.g. cohorts of different sizes
        width = max(len(v) for v in values)
        out = np.full((len(values), width), np.nan)
        for i, row in enumerate(values):
            out[i, : len(row)] = row
        return out


def _os_errors_as_user_errors(write):
    """A results folder that is read-only, full or gone ends the run as one FLError line naming the
    file (the writer has removed its temporary file by then), not as an OSError traceback: for
    results, checkpoints and saved models alike. ``flag`` is the option that chose the path."""

    @functools.wraps(write)
    def checked(path: Path, *args: Any, flag: str = "--results_dir", **kwargs: Any) -> Any:
        try:
            return write(path, *args, **kwargs)
        except Exception as exc:
            # h5py reports the C library's errno inside a multi-line message ("errno = 28"), safetensors
            # as "os error 28"; torch.save's zip writer reports a short write as "unexpected pos"
            found = re.search(r"(?:errno = |os error )(\d+)", str(exc))
            code = exc.errno if isinstance(exc, OSError) and isinstance(exc.errno, int) else found and int(found[1])
            if code:
                reason = os.strerror(code)
            elif isinstance(exc, OSError):
                reason = " ".join(str(exc).split())
            elif "unexpected pos" in str(exc):
                reason, code = "the write stopped short: is the disk full?", errno.ENOSPC
            else:
                raise
            advice = ("it is read-only: " if code in (errno.EROFS, errno.EACCES, errno.EPERM)
                      else "free some space or ")
            raise FLError(f"cannot write {path} ({reason}); {advice}pass another {flag}") from exc

    return checked


@_os_errors_as_user_errors
def write_atomically(path: Path, write) -> None:
    """``write(temporary_path)``, then rename onto ``path``: readers see the old file or the new
    one, never a partial one. The file gets the permissions of a normally created one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600 (and writers may recreate the file)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def machine_record() -> dict[str, Any]:
    """The machine and library versions a run is made on: stored in every result file (attribute
    ``machine``), so a page that sets runs from several machines side by side says which ran where."""
    import platform

    import torch

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    record = {"cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(), "python": platform.python_version(),
              "torch": torch.__version__, "numpy": np.__version__}
    if torch.cuda.is_available():
        record["gpu"] = torch.cuda.get_device_name(0)
    return record


def save_results(path: Path, history: RunHistory, attrs: dict[str, Any], summary: dict[str, Any]) -> Path:
    """Write the h5 file to a temporary name, then rename: readers never see a partial file."""

    def write(tmp: str) -> None:
        with h5py.File(tmp, "w") as f:
            f.create_dataset("rs_test_acc", data=np.asarray(history.test_acc, dtype=np.float64))
            f.create_dataset("rs_test_auc", data=np.asarray(history.test_auc, dtype=np.float64))
            f.create_dataset("rs_train_loss", data=np.asarray(history.train_loss, dtype=np.float64))
            f.create_dataset("rs_test_acc_std", data=np.asarray(history.test_acc_std, dtype=np.float64))
            f.create_dataset("rs_eval_rounds", data=np.asarray(history.eval_rounds, dtype=np.int64))
            f.create_dataset("rs_round_time", data=np.asarray(history.round_time, dtype=np.float64))
            f.create_dataset("rs_bytes_up", data=np.asarray(history.bytes_up, dtype=np.int64))
            f.create_dataset("rs_bytes_down", data=np.asarray(history.bytes_down, dtype=np.int64))
            f.create_dataset("rs_clients_per_round", data=np.asarray(history.clients_per_round, dtype=np.int64))
            if history.client_acc:
                f.create_dataset("rs_client_acc", data=np.stack(history.client_acc).astype(np.float64))
            for name, values in history.extra_series.items():
                f.create_dataset(f"rs_{name}", data=_as_array(values))
            for key, value in attrs.items():
                if isinstance(value, (dict, list)):
                    value = json.dumps(value)
                elif isinstance(value, str):
                    value = str(value)  # str subclasses (torch's version string) are not HDF5 types
                f.attrs[key] = value
            for key, value in summary.items():
                f.attrs[key] = np.nan if value is None else value

    write_atomically(path, write)
    return path


def read_results(path: str | Path) -> dict[str, Any]:
    """All datasets and attributes of a result file (ours or PFLlib's) as NumPy values."""
    with h5py.File(path, "r") as f:
        out: dict[str, Any] = {key: f[key][()] for key in f.keys()}
        out["attrs"] = {key: f.attrs[key] for key in f.attrs.keys()}
    return out


def trained_evaluations(acc: np.ndarray, eval_rounds: np.ndarray) -> np.ndarray:
    """The accuracies of trained models: the evaluation at round 0 (the untrained initial
    model) is left out whenever a later evaluation exists, so a tail mean over few evaluations
    never averages in chance accuracy."""
    acc = np.asarray(acc, dtype=np.float64)
    rounds = np.asarray(eval_rounds)
    if acc.size > 1 and rounds.size == acc.size:
        return acc[rounds > 0] if (rounds > 0).any() else acc
    return acc


def tail_means(acc: np.ndarray, eval_rounds: np.ndarray, avg_last: int) -> tuple[float, float | None]:
    """(mean over the last 10% of the trained evaluations, rounded up to at least one,
    mean over the last ``avg_last`` of them, or all when fewer; None when ``avg_last`` <= 0)."""
    trained = trained_evaluations(acc, eval_rounds)
    tail = max(1, int(np.ceil(0.1 * trained.size)))
    last_n = float(trained[-min(avg_last, trained.size):].mean()) if avg_last > 0 else None
    return float(trained[-tail:].mean()), last_n


def tail_gain(acc: np.ndarray, eval_rounds: np.ndarray, n: int) -> float | None:
    """The mean over the last ``n`` evaluations of trained models minus the mean over the ``n``
    before them: about 0 for a run that had converged when it stopped, a gain for one still
    learning; None when the run has fewer than ``2 n`` such evaluations (or ``n`` <= 0)."""
    trained = trained_evaluations(acc, eval_rounds)
    if n <= 0 or trained.size < 2 * n:
        return None
    return float(trained[-n:].mean() - trained[-2 * n:-n].mean())


def reach_target(acc: np.ndarray, eval_rounds: np.ndarray, bytes_up: np.ndarray | list,
                 target_acc: float) -> tuple[int, int] | None:
    """(first evaluated round whose accuracy is >= ``target_acc``, bytes uploaded by the training
    rounds before it, i.e. rounds 0..r-1), or None when no evaluation reaches it."""
    hit = np.flatnonzero(np.asarray(acc, dtype=np.float64) >= target_acc)
    if not hit.size:
        return None
    reached = int(np.asarray(eval_rounds)[hit[0]])
    return reached, int(np.sum(np.asarray(bytes_up, dtype=np.int64)[:reached]))


def summarize(history: RunHistory, avg_last: int, target_acc: float | None, model_bytes: int) -> dict[str, Any]:
    """Headline figures of a run: best accuracy, tail means, rounds and traffic to a target (the
    features add the figures they read off their own series: ``flcore.features.run_summary``).

    The tail means leave out the evaluation of the untrained model at round 0
    (:func:`trained_evaluations`)."""
    acc = np.asarray(history.test_acc, dtype=np.float64)
    if acc.size == 0:
        return {}
    last_10pct, last_n = tail_means(acc, np.asarray(history.eval_rounds), avg_last)
    summary: dict[str, Any] = {
        "best_acc": float(acc.max()),
        "final_acc": float(acc[-1]),
        "mean_acc_last_10pct": last_10pct,
        "avg_last": int(avg_last),
        "mean_acc_last_n": last_n,
        "total_bytes_up": int(sum(history.bytes_up)),
        # what reached the server (stragglers' uploads in the round they arrive; not -cdr's drop-outs)
        "total_bytes_up_arrived": int(sum(history.extra_series.get("bytes_up_arrived", history.bytes_up))),
        "total_bytes_down": int(sum(history.bytes_down)),
        "mean_round_time": float(np.mean(history.round_time)) if history.round_time else None,
    }
    if "uploads_aggregated" in history.extra_series:  # an algorithm that puts only some uploads into the model
        summary["uploads_arrived"] = int(sum(history.clients_per_round))
        summary["uploads_aggregated"] = int(sum(history.extra_series["uploads_aggregated"]))
    if history.stop_reason:  # an early stop (-ab, FLChain's rule): the last evaluation is of the model it stopped with
        summary["early_stop"] = history.stop_reason
    if "eval_clients" in history.extra_series:  # --eval_clients: a sample of clients, not all of them
        summary["evaluated_clients"] = int(len(history.extra_series["eval_clients"][0]))
    if target_acc is not None:
        summary["target_acc"] = float(target_acc)
        reached = rounds_to_target(history, target_acc)
        if reached is not None:
            rounds, up = reached
            summary.update(
                rounds_to_target=rounds,
                bytes_up_to_target=up,
                uploads_to_target=float(up / model_bytes) if model_bytes else None,
            )
        else:
            summary.update(rounds_to_target=None, bytes_up_to_target=None, uploads_to_target=None)
    return summary


def rounds_to_target(history: RunHistory, target_acc: float) -> tuple[int, int] | None:
    """:func:`reach_target` of the run ``history`` recorded."""
    return reach_target(np.asarray(history.test_acc, dtype=np.float64), np.asarray(history.eval_rounds),
                        history.bytes_up, target_acc)


def mean_std_of_best(paths: list[Path]) -> tuple[float, float]:
    """PFLlib's ``average_data``: mean and population std of each run's best accuracy."""
    best = [float(np.max(read_results(p)["rs_test_acc"])) for p in paths]
    return float(np.mean(best)), float(np.std(best))
