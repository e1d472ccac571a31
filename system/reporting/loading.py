"""Reading result files (``.h5``) in either layout into :class:`RunResult`.

* PFLlib's own files hold only ``rs_test_acc``, ``rs_test_auc`` and ``rs_train_loss`` (one entry
  per evaluation, no attributes); their evaluation rounds are taken as ``index * 1``.
* Files written by this platform add ``rs_eval_rounds``, ``rs_round_time``, ``rs_test_acc_std``,
  ``rs_client_acc``, ``rs_bytes_up``/``rs_bytes_down`` and the attributes ``algorithm``,
  ``dataset``, ``goal``, ``run``, ``seed``, ``config`` (JSON of all flags), ``personalized``
  and ``peak_rss_mb``. The attributes are preferred over what the file name says.

Nothing here prints: problems are raised as :class:`PlotError` (one line, for the CLI to show)
and what is left out is handed to a ``note`` callback, one line per reason.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import h5py
import numpy as np

from reporting.names import find_runs, parse_result_name
from utils.errors import FLError

Note = Callable[[str], None]

#: 1-D datasets read from a result file (``rs_client_acc`` is 2-D: only its last row is kept).
SERIES_KEYS: tuple[str, ...] = (
    "rs_test_acc", "rs_test_auc", "rs_train_loss", "rs_eval_rounds", "rs_round_time",
    "rs_test_acc_std", "rs_bytes_up", "rs_bytes_down", "rs_clients_per_round",
    "rs_test_acc_global", "rs_test_auc_global",
)
#: Series other features add (differential privacy, the virtual clock, new clients); read when
#: they are 1-D, ignored otherwise (their shape is their owners' business).
OPTIONAL_SERIES_KEYS: tuple[str, ...] = ("rs_dp_epsilon", "rs_virtual_time", "rs_new_client_acc", "rs_backdoor_asr",
                                         "rs_bytes_up_arrived")
#: Series with one entry per evaluation (must all have the length of ``rs_test_acc``).
PER_EVAL_KEYS: tuple[str, ...] = ("rs_test_acc", "rs_test_auc", "rs_train_loss", "rs_test_acc_std",
                                  "rs_test_acc_global", "rs_test_auc_global")
#: Attributes that identify a run; when present they win over the file name.
ID_ATTRS: tuple[str, ...] = ("dataset", "algorithm", "goal")


class PlotError(FLError):
    """A problem the user can fix (no results, unreadable file, ...); printed as one line."""


class ResultFileError(PlotError):
    """A result file that cannot be read or does not look like a result file."""


@dataclass(eq=False)
class RunResult:
    """One result file, loaded.

    Attributes:
        path: The file.
        dataset, algorithm, goal, run: Identity of the run (attributes if present, else the name).
        series: The 1-D datasets found, as float arrays, keyed by h5 name.
        eval_rounds: Round index of every evaluation (``rs_eval_rounds``, else ``index * eval_gap``).
        attrs: The file's attributes (strings decoded; ``config`` left as the raw string).
        config: ``attrs["config"]`` parsed from JSON, ``{}`` when absent or unreadable.
        final_client_acc: The last row of ``rs_client_acc`` (each client's accuracy), if stored.
    """

    path: Path
    dataset: str
    algorithm: str
    goal: str
    run: int
    series: dict[str, np.ndarray]
    eval_rounds: np.ndarray
    attrs: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    final_client_acc: np.ndarray | None = None

    @property
    def diverged(self) -> bool:
        """Whether the run's model collapsed (NaN/inf) as the run measured (under an attack it faced,
        or with ``--record_divergence``): its file records the round (``diverged_round``) and its
        accuracies are those before it."""
        return "diverged_round" in self.attrs

    @property
    def finished(self) -> bool:
        """False only for a run whose file says ``finished = False`` (an interrupted run's
        results so far); PFLlib's files and older ones are written at the end of a run."""
        return bool(self.attrs.get("finished", True))

    @property
    def personalized(self) -> bool | None:
        """Whether ``rs_test_acc`` is each client's own model on its own data: the attribute
        main.py writes; for older files True when they record the shared model apart
        (``rs_test_acc_global``, which only personalised runs write), else None (unknown:
        a personalised algorithm without a shared model, such as FedPer, records none)."""
        if "personalized" in self.attrs:
            return bool(self.attrs["personalized"])
        return True if self.get("rs_test_acc_global") is not None else None

    @property
    def metric(self) -> str:
        """What ``rs_test_acc`` measures: the file's ``metric`` attribute (a multi-label dataset's
        ``recall@5``), accuracy for files without one."""
        return str(self.attrs.get("metric", "accuracy"))

    @property
    def is_pfllib_format(self) -> bool:
        """True for files with no attributes, as PFLlib itself writes them."""
        return not self.attrs

    @property
    def n_evals(self) -> int:
        """Number of evaluations recorded."""
        return int(self.series["rs_test_acc"].shape[0])

    def get(self, key: str) -> np.ndarray | None:
        """The series ``key`` or None when the file does not have it."""
        return self.series.get(key)

    def elapsed_at_evals(self) -> np.ndarray | None:
        """Wall-clock seconds spent before each evaluation, or None without ``rs_round_time``.

        Evaluation at round ``r`` happens at the start of round ``r`` (PFLlib's loop), so the
        elapsed time is the sum of the durations of rounds ``0 .. r-1``.
        """
        return self.cumulative_at_evals("rs_round_time")

    def cumulative_at_evals(self, key: str) -> np.ndarray | None:
        """Sum of the per-round series ``key`` over the rounds before each evaluation (rounds
        ``0 .. r-1`` for the evaluation at round ``r``), or None without that series."""
        values = self.get(key)
        if values is None:
            return None
        cumulative = np.concatenate([[0.0], np.cumsum(values)])
        return cumulative[np.clip(self.eval_rounds.astype(int), 0, len(values))]

    def x_at_evals(self, x_mode: str) -> np.ndarray | None:
        """The x value of each evaluation for ``x_mode`` (``rounds``, ``time``, ``bytes`` in MB,
        ``virtual``); None when the series it needs is missing."""
        if x_mode == "rounds":
            return self.eval_rounds.astype(float)
        if x_mode == "time":
            return self.cumulative_at_evals("rs_round_time")
        if x_mode == "virtual":  # already a clock: its reading after training rounds 0..r-1
            clock = self.get("rs_virtual_time")
            if clock is None:
                return None
            return np.concatenate([[0.0], clock])[np.clip(self.eval_rounds.astype(int), 0, len(clock))]
        uploaded = self.cumulative_at_evals("rs_bytes_up")
        return None if uploaded is None else uploaded / 1e6


def _decode(value: Any) -> Any:
    """An h5 attribute as a plain Python value (bytes -> str, numpy scalar -> item)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _one_line(exc: BaseException) -> str:
    """An exception message squeezed onto one line."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _read(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray], np.ndarray | None]:
    """The attributes, the 1-D series and the last row of ``rs_client_acc`` of one h5 file."""
    series: dict[str, np.ndarray] = {}
    final_client_acc = None
    try:
        with h5py.File(path, "r") as handle:
            attrs = {key: _decode(value) for key, value in handle.attrs.items()}
            for key in SERIES_KEYS:
                obj = handle.get(key)
                if obj is None:
                    continue
                if not isinstance(obj, h5py.Dataset) or obj.ndim != 1:
                    raise ResultFileError(f"{path}: '{key}' is not a 1-D array")
                series[key] = np.asarray(obj[()], dtype=float)
            for key in OPTIONAL_SERIES_KEYS:
                obj = handle.get(key)
                if isinstance(obj, h5py.Dataset) and obj.ndim == 1 and obj.shape[0] > 0:
                    series[key] = np.asarray(obj[()], dtype=float)
            client_acc = handle.get("rs_client_acc")
            if isinstance(client_acc, h5py.Dataset) and client_acc.ndim == 2 and client_acc.shape[0] > 0:
                final_client_acc = np.asarray(client_acc[-1], dtype=float)
    except ResultFileError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise ResultFileError(f"{path}: not a readable HDF5 result file ({_one_line(exc)})") from exc
    return attrs, series, final_client_acc


def measured_metric(runs: Sequence[RunResult]) -> str:
    """What the accuracies of ``runs`` measure (:attr:`RunResult.metric`); runs that measure
    different things cannot be averaged or drawn on one axis: refused in one line."""
    names = sorted({r.metric for r in runs})
    if len(names) > 1:
        raise PlotError(f"the runs' rs_test_acc measure different things ({', '.join(names)}); "
                        "summarise or plot them apart")
    return names[0] if names else "accuracy"


def load_run(path: Path | str) -> RunResult:
    """Read one result file in either layout; identity from the attributes when present, else
    from the file name.

    Raises:
        ResultFileError: The file is not readable HDF5, lacks a non-empty 1-D ``rs_test_acc``,
            or its per-evaluation series have inconsistent lengths.
    """
    path = Path(path)
    attrs, series, final_client_acc = _read(path)
    acc = series.get("rs_test_acc")
    if acc is None:
        raise ResultFileError(f"{path}: no 'rs_test_acc' dataset, not a result file")
    if acc.size == 0:
        raise ResultFileError(f"{path}: 'rs_test_acc' is empty (the run recorded no evaluation)")
    for key in PER_EVAL_KEYS + ("rs_eval_rounds",):
        if key in series and series[key].shape[0] != acc.shape[0]:
            raise ResultFileError(f"{path}: '{key}' has {series[key].shape[0]} entries but "
                                  f"'rs_test_acc' has {acc.shape[0]}")
    try:
        config = json.loads(attrs["config"]) if isinstance(attrs.get("config"), str) else {}
    except ValueError:
        config = {}
    config = config if isinstance(config, dict) else {}

    if "rs_eval_rounds" in series:
        eval_rounds = series["rs_eval_rounds"].astype(int)
    else:
        try:
            gap = max(int(config.get("eval_gap", config.get("eg", 1))), 1)
        except (TypeError, ValueError):
            gap = 1
        eval_rounds = np.arange(acc.shape[0], dtype=int) * gap

    dataset, algorithm, goal, run = parse_result_name(path.name) or ("?", "?", "?", 0)
    try:
        run = int(attrs.get("run", run))
    except (TypeError, ValueError):
        pass
    return RunResult(path=path, dataset=str(attrs.get("dataset", dataset)),
                     algorithm=str(attrs.get("algorithm", algorithm)), goal=str(attrs.get("goal", goal)),
                     run=run, series=series, eval_rounds=eval_rounds, attrs=attrs, config=config,
                     final_client_acc=final_client_acc)


def load_algorithm_runs(results_dir: Path | str, dataset: str, algorithm: str, goal: str,
                        note: Note | None = None) -> list[RunResult]:
    """Every run of one algorithm, in run order (empty when no file matches). A file whose
    attributes name another dataset, algorithm or goal than its file name is left out with a
    note: the attributes are trusted over the name. An unreadable file (a corrupt or truncated
    repeat) is left out with a note too, as :func:`find_all_runs` does, so one broken repeat does
    not hide the others.

    Raises:
        ResultFileError: A matching file is unreadable and there is no ``note`` to tell it to.
    """
    wanted = {"dataset": dataset, "algorithm": algorithm, "goal": goal}
    runs: list[RunResult] = []
    for path in find_runs(results_dir, dataset, algorithm, goal):
        if not path.is_file():
            if note is not None:
                note(f"{path}: not a file; left out of {algorithm}")
            continue
        try:
            run = load_run(path)
        except ResultFileError as exc:
            if note is None:
                raise
            note(f"{exc}; left out of {algorithm}")
            continue
        clash = [f"{key}={run.attrs[key]!r}" for key in ID_ATTRS
                 if key in run.attrs and str(run.attrs[key]) != wanted[key]]
        if clash:
            if note is not None:
                note(f"{path}: attributes say {', '.join(clash)}; file left out of {algorithm}")
            continue
        runs.append(run)
    return sorted(runs, key=lambda r: r.run)


def find_all_runs(results_dir: Path | str, datasets: Sequence[str] | None = None,
                  algorithms: Sequence[str] | None = None, goals: Sequence[str] | None = None,
                  note: Note | None = None) -> dict[str, dict[tuple[str, str], list[RunResult]]]:
    """Every result file of a folder, loaded and grouped: dataset -> (algorithm, goal) -> runs.

    Files are found by name (``*.h5``) and identified by their attributes where they have them;
    the filters keep the listed names only (None: all). Files left out for another reason than
    the filters are told to ``note``: one line for all names that are not
    ``<dataset>_<algorithm>_<goal>_<run>.h5``, one per folder of such a name and per file that
    cannot be read, so one broken file does not hide the others and none is skipped unsaid.
    """
    folder = Path(results_dir)
    if not folder.is_dir():
        raise PlotError(f"results folder {folder} does not exist; pass --results_dir")
    say = note if note is not None else (lambda _message: None)
    grouped: dict[str, dict[tuple[str, str], list[RunResult]]] = {}
    misnamed: list[str] = []
    for path in sorted(folder.glob("*.h5")):
        if parse_result_name(path.name) is None:
            misnamed.append(path.name)
            continue
        if not path.is_file():
            say(f"{path}: not a file; left out")
            continue
        try:
            run = load_run(path)
        except ResultFileError as exc:
            say(f"{exc}; left out")
            continue
        if ((datasets and run.dataset not in datasets) or (algorithms and run.algorithm not in algorithms)
                or (goals and run.goal not in goals)):
            continue
        grouped.setdefault(run.dataset, {}).setdefault((run.algorithm, run.goal), []).append(run)
    if misnamed:
        say(f"left out {len(misnamed)} file(s) of {folder} whose name is not "
            f"<dataset>_<algorithm>_<goal>_<run>.h5 (a part is empty or missing): {', '.join(misnamed)}")
    for table in grouped.values():
        for runs in table.values():
            runs.sort(key=lambda r: r.run)
    return dict(sorted(grouped.items()))
