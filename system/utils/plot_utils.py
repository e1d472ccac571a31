"""Reading, grouping and plotting the ``.h5`` result files of federated-learning runs.

A run writes ``<results>/<dataset>_<algorithm>_<goal>_<run>.h5`` (PFLlib's naming; ``run`` is
the ``-t`` repeat index). Two layouts are understood:

* PFLlib's own files hold only ``rs_test_acc``, ``rs_test_auc`` and ``rs_train_loss`` (one entry
  per evaluation, no attributes); their evaluation rounds are taken as ``index * 1``.
* Files written by this platform add ``rs_eval_rounds``, ``rs_round_time``, ``rs_test_acc_std``,
  ``rs_client_acc``, ``rs_bytes_up``/``rs_bytes_down`` and the attributes ``algorithm``,
  ``dataset``, ``goal``, ``run``, ``seed``, ``config`` (JSON of all flags) and ``peak_rss_mb``.
  The attributes are preferred over what the file name says.

Repeated runs of one algorithm are combined into a mean curve with a population standard
deviation (``ddof=0``, as PFLlib's ``average_data``), truncated to the shortest run. The
"best accuracy" of a run is, as in PFLlib, the maximum of its ``rs_test_acc``.

Nothing here prints: problems are raised as :class:`PlotError` (one line, for the CLI to show)
and remarks such as "runs were truncated" are handed to a ``note`` callback.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import h5py
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from utils.errors import FLError

Note = Callable[[str], None]
MISSING = "–"  # a figure the files do not allow to compute (PFLlib's files lack most series)
REPO_ROOT = Path(__file__).resolve().parents[2]

#: 1-D datasets read from a result file (``rs_client_acc`` is 2-D: only its last row is kept).
SERIES_KEYS: tuple[str, ...] = (
    "rs_test_acc",
    "rs_test_auc",
    "rs_train_loss",
    "rs_eval_rounds",
    "rs_round_time",
    "rs_test_acc_std",
    "rs_bytes_up",
    "rs_bytes_down",
    "rs_clients_per_round",
    "rs_test_acc_global",
    "rs_test_auc_global",
)
#: Series other features add (differential privacy, the virtual clock, new clients); read when
#: they are 1-D, ignored otherwise (their shape is their owners' business).
OPTIONAL_SERIES_KEYS: tuple[str, ...] = ("rs_dp_epsilon", "rs_virtual_time", "rs_new_client_acc")
#: Series with one entry per evaluation (must all have the length of ``rs_test_acc``).
PER_EVAL_KEYS: tuple[str, ...] = ("rs_test_acc", "rs_test_auc", "rs_train_loss", "rs_test_acc_std",
                                  "rs_test_acc_global", "rs_test_auc_global")
#: Attributes that identify a run; when present they win over the file name.
ID_ATTRS: tuple[str, ...] = ("dataset", "algorithm", "goal")


class PlotError(FLError):
    """A problem the user can fix (no results, unreadable file, ...); printed as one line."""


class ResultFileError(PlotError):
    """A result file that cannot be read or does not look like a result file."""


@dataclass(frozen=True)
class MetricSpec:
    """How to plot one metric.

    Attributes:
        name: The ``--metric`` value (``acc``, ``loss``, ``auc``, ``time``).
        key: The h5 dataset holding it.
        label: The y-axis label.
        title: Words used in the plot title.
        scale: Factor applied before plotting (100 turns accuracy fractions into percent).
        per_round: True for series with one entry per training round (``rs_round_time``)
            rather than one per evaluation; entry ``i`` is plotted at round ``i + 1``, the
            number the accuracy curve gives the model that round produced.
        variant: Which model a curve measures when an algorithm has several ("global model"
            for ``rs_test_acc_global``); empty for the algorithm's own evaluation.
    """

    name: str
    key: str
    label: str
    title: str
    scale: float = 1.0
    per_round: bool = False
    variant: str = ""


METRICS: dict[str, MetricSpec] = {
    "acc": MetricSpec("acc", "rs_test_acc", "Test accuracy (%)", "test accuracy", scale=100.0),
    "loss": MetricSpec("loss", "rs_train_loss", "Training loss", "training loss"),
    "auc": MetricSpec("auc", "rs_test_auc", "Test AUC", "test AUC"),
    "time": MetricSpec("time", "rs_round_time", "Wall-clock time per round (s)",
                       "time per round", per_round=True),
}
#: The shared model's accuracy recorded by personalised algorithms that have one, drawn dashed
#: on the accuracy plot next to their personalised accuracy.
GLOBAL_ACC = MetricSpec("acc", "rs_test_acc_global", "Test accuracy (%)", "test accuracy",
                        scale=100.0, variant="global model")

#: x-axes of the per-evaluation curves: the round, the wall-clock seconds spent before the
#: evaluation, the megabytes uploaded before it, or the virtual clock's seconds (flcore/plugins/clock.py).
X_MODES: tuple[str, ...] = ("rounds", "time", "bytes", "virtual")
X_LABELS: dict[str, str] = {
    "rounds": "Communication round",
    "time": "Wall-clock time (s)",
    "bytes": "Uploaded traffic (MB)",
    "virtual": "Virtual time (s)",
}
#: The series each x-axis needs.
X_SERIES: dict[str, str] = {"time": "rs_round_time", "bytes": "rs_bytes_up", "virtual": "rs_virtual_time"}


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
    def finished(self) -> bool:
        """False only for a run whose file says ``finished = False`` (an interrupted run's
        results so far); PFLlib's files and older ones are written at the end of a run."""
        return bool(self.attrs.get("finished", True))

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
        index = np.clip(self.eval_rounds.astype(int), 0, len(values))
        return cumulative[index]

    def x_at_evals(self, x_mode: str) -> np.ndarray | None:
        """The x value of each evaluation for ``x_mode`` (:data:`X_MODES`); None when the
        series it needs is missing."""
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


@dataclass
class GroupedSeries:
    """Mean and standard deviation of one metric over the runs of one algorithm.

    Attributes:
        algorithm: The algorithm name.
        metric: The metric plotted.
        x: The x values (rounds or seconds), of the truncated length.
        mean, std: Per-point mean and population std over the runs (already scaled).
        lengths: Length of each run's series before truncation, in run order.
        runs: Run indices that contributed.
    """

    algorithm: str
    metric: MetricSpec
    x: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    lengths: list[int]
    runs: list[int]
    personalized: bool = False

    @property
    def n_runs(self) -> int:
        """Number of runs averaged."""
        return len(self.runs)

    @property
    def truncated(self) -> bool:
        """True when the runs had different lengths and were cut to the shortest."""
        return len(set(self.lengths)) > 1

    @property
    def label(self) -> str:
        """Legend text, e.g. ``FedAvg (3 runs)``; which model a pFL curve measures is named
        (``Ditto, personalised: own model, own data (3 runs)``, ``Ditto, global model ...``)."""
        if self.metric.variant:
            which = f", {self.metric.variant}"
        elif self.personalized and self.metric.key == "rs_test_acc":
            which = ", personalised: own model, own data"
        else:
            which = ""
        return f"{self.algorithm}{which} ({self.n_runs} run{'' if self.n_runs == 1 else 's'})"


# --------------------------------------------------------------------------------------------
# Finding and loading files
# --------------------------------------------------------------------------------------------

def result_file_name(dataset: str, algorithm: str, goal: str, run: int | str) -> str:
    """The file name PFLlib gives a run: ``<dataset>_<algorithm>_<goal>_<run>.h5``."""
    return f"{dataset}_{algorithm}_{goal}_{run}.h5"


def search_pattern(results_dir: Path | str, dataset: str, algorithm: str, goal: str) -> str:
    """Human-readable pattern of the files searched, e.g. ``../results/MNIST_FedAvg_test_<run>.h5``."""
    return str(Path(results_dir) / result_file_name(dataset, algorithm, goal, "<run>"))


def creation_command(dataset: str, algorithm: str, goal: str) -> str:
    """How to make such result files, naming only commands that exist: the ``main.py`` command
    (from ``system/``) when ``algorithm`` is registered, preceded by the dataset's generator
    when the dataset is not generated yet; otherwise what is missing."""
    try:
        from flcore.registry import ALGORITHMS, load_all
        load_all()
        known = ALGORITHMS.names()
    except ImportError:  # no torch: main.py could not run either
        known = None
    if known is not None and algorithm not in known:
        return (f"no algorithm {algorithm!r} in this platform, so main.py cannot make them "
                f"(algorithms: {', '.join(known)})")
    command = f"`python main.py -data {dataset} -algo {algorithm}{'' if goal == 'test' else f' -go {goal}'}`"
    datasets = REPO_ROOT / "dataset"
    if (datasets / dataset / "config.json").is_file() or Path(dataset).is_absolute():
        return f"create them with {command} (from system/)"
    generator = datasets / f"generate_{dataset}.py"
    if generator.is_file():
        return (f"create them with `python {generator.name} ...` (from dataset/, see dataset/README.md), "
                f"then {command} (from system/)")
    return (f"create them with {command} (from system/) once dataset/{dataset} exists (no "
            f"generate_{dataset}.py; generators: "
            f"{', '.join(sorted(p.stem[len('generate_'):] for p in datasets.glob('generate_*.py')))})")


def parse_result_name(name: str) -> tuple[str, str, str, int] | None:
    """Split a result file name into ``(dataset, algorithm, goal, run)``.

    Assumes dataset and algorithm contain no underscore (the algorithm may contain ``-``), the
    goal may contain underscores and the run is the trailing integer.

    Args:
        name: A file name such as ``MNIST_IGFL-S_test_x_2.h5``.

    Returns:
        The four parts, or None when the name does not have that shape.
    """
    match = re.fullmatch(r"([^_]+)_([^_]+)_(.+)_(\d+)\.h5", name)
    if match is None:
        return None
    return match.group(1), match.group(2), match.group(3), int(match.group(4))


def find_runs(results_dir: Path | str, dataset: str, algorithm: str, goal: str) -> list[Path]:
    """Result files of every run (``-t`` repeat) of one algorithm, by file name, in run order.

    The requested names are matched literally, so a dataset name with underscores works, and
    ``FedAvg`` does not pick up ``FedAvg-S`` nor goal ``test`` pick up goal ``test_2``.

    Args:
        results_dir: Folder holding the ``.h5`` files.
        dataset: Dataset name (``-data``).
        algorithm: Algorithm name (``-algo``).
        goal: Goal string (``-go``).

    Returns:
        Matching paths sorted by run index; empty when there are none (or no such folder).
    """
    folder = Path(results_dir)
    if not folder.is_dir():
        return []
    pattern = re.compile(
        re.escape(f"{dataset}_{algorithm}_{goal}_") + r"(\d+)\.h5")
    found: list[tuple[int, Path]] = []
    for path in folder.iterdir():
        match = pattern.fullmatch(path.name)
        if match is not None and path.is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def algorithms_with_results(results_dir: Path | str, dataset: str, goal: str) -> list[str]:
    """Algorithm names that have result files for ``dataset`` and ``goal`` (by file name)."""
    folder = Path(results_dir)
    if not folder.is_dir():
        return []
    pattern = re.compile(re.escape(f"{dataset}_") + r"([^_]+)" + re.escape(f"_{goal}_") + r"\d+\.h5")
    names = {m.group(1) for p in folder.iterdir() if (m := pattern.fullmatch(p.name))}
    return sorted(names)


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
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def load_run(path: Path | str) -> RunResult:
    """Read one result file in either layout.

    Args:
        path: The ``.h5`` file.

    Returns:
        The run, with identity from the attributes when present, else from the file name.

    Raises:
        ResultFileError: The file is not readable HDF5, lacks a non-empty 1-D ``rs_test_acc``,
            or its per-evaluation series have inconsistent lengths.
    """
    path = Path(path)
    series: dict[str, np.ndarray] = {}
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
            final_client_acc = None
            if isinstance(client_acc, h5py.Dataset) and client_acc.ndim == 2 and client_acc.shape[0] > 0:
                final_client_acc = np.asarray(client_acc[-1], dtype=float)
    except ResultFileError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise ResultFileError(f"{path}: not a readable HDF5 result file ({_one_line(exc)})") from exc

    acc = series.get("rs_test_acc")
    if acc is None:
        raise ResultFileError(f"{path}: no 'rs_test_acc' dataset, not a result file")
    if acc.size == 0:
        raise ResultFileError(f"{path}: 'rs_test_acc' is empty (the run recorded no evaluation)")
    for key in PER_EVAL_KEYS + ("rs_eval_rounds",):
        if key in series and series[key].shape[0] != acc.shape[0]:
            raise ResultFileError(
                f"{path}: '{key}' has {series[key].shape[0]} entries but 'rs_test_acc' has "
                f"{acc.shape[0]}")

    config: dict[str, Any] = {}
    raw_config = attrs.get("config")
    if isinstance(raw_config, str):
        try:
            parsed = json.loads(raw_config)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            config = parsed

    if "rs_eval_rounds" in series:
        eval_rounds = series["rs_eval_rounds"].astype(int)
    else:
        gap = config.get("eval_gap", config.get("eg", 1))
        try:
            gap = max(int(gap), 1)
        except (TypeError, ValueError):
            gap = 1
        eval_rounds = np.arange(acc.shape[0], dtype=int) * gap

    parsed_name = parse_result_name(path.name)
    dataset, algorithm, goal, run = parsed_name if parsed_name else ("?", "?", "?", 0)
    dataset = str(attrs.get("dataset", dataset))
    algorithm = str(attrs.get("algorithm", algorithm))
    goal = str(attrs.get("goal", goal))
    try:
        run = int(attrs.get("run", run))
    except (TypeError, ValueError):
        pass
    return RunResult(path=path, dataset=dataset, algorithm=algorithm, goal=goal, run=run,
                     series=series, eval_rounds=eval_rounds, attrs=attrs, config=config,
                     final_client_acc=final_client_acc)


def load_algorithm_runs(results_dir: Path | str, dataset: str, algorithm: str, goal: str,
                        note: Note | None = None) -> list[RunResult]:
    """Find and load every run of one algorithm.

    A file whose attributes name another dataset, algorithm or goal than its file name is left
    out (with a note): the attributes are trusted over the name.

    Args:
        results_dir: Folder holding the ``.h5`` files.
        dataset, algorithm, goal: What to look for.
        note: Receives one-line remarks; ignored when None.

    Returns:
        The runs in run order; empty when no file matches.

    Raises:
        ResultFileError: A matching file is unreadable.
    """
    wanted = {"dataset": dataset, "algorithm": algorithm, "goal": goal}
    runs: list[RunResult] = []
    for path in find_runs(results_dir, dataset, algorithm, goal):
        run = load_run(path)
        clash = [f"{key}={run.attrs[key]!r}" for key in ID_ATTRS
                 if key in run.attrs and str(run.attrs[key]) != wanted[key]]
        if clash:
            if note is not None:
                note(f"{path}: attributes say {', '.join(clash)}; file left out of {algorithm}")
            continue
        runs.append(run)
    runs.sort(key=lambda r: r.run)
    return runs


# --------------------------------------------------------------------------------------------
# Grouping
# --------------------------------------------------------------------------------------------

def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average of the same length (the first points average what exists).

    Args:
        values: 1-D series.
        window: Number of points averaged; 1 (or less) returns a copy unchanged.
    """
    values = np.asarray(values, dtype=float)
    if window <= 1 or values.size == 0:
        return values.copy()
    cumulative = np.concatenate([[0.0], np.cumsum(values)])
    ends = np.arange(1, values.size + 1)
    starts = np.maximum(ends - window, 0)
    return (cumulative[ends] - cumulative[starts]) / (ends - starts)


def mean_std(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
    """Point-wise mean and population std (``ddof=0``) of series cut to the shortest.

    Args:
        arrays: One 1-D series per run.

    Returns:
        ``(mean, std, length)`` where ``length`` is the common (shortest) length.

    Raises:
        ValueError: ``arrays`` is empty.
    """
    if not arrays:
        raise ValueError("mean_std needs at least one series")
    length = min(len(a) for a in arrays)
    stacked = np.stack([np.asarray(a, dtype=float)[:length] for a in arrays])
    return stacked.mean(axis=0), stacked.std(axis=0, ddof=0), length


def group_runs(runs: Sequence[RunResult], metric: MetricSpec, x_mode: str = "rounds",
               smooth: int = 1, note: Note | None = None) -> GroupedSeries | None:
    """Combine the runs of one algorithm into a mean ± std curve for one metric.

    Each run is smoothed first (``smooth`` > 1), then all are cut to the shortest run.

    Args:
        runs: Runs of a single algorithm.
        metric: What to plot.
        x_mode: ``"rounds"`` (evaluation rounds), ``"time"`` (mean elapsed seconds at each
            evaluation; needs ``rs_round_time``), ``"bytes"`` (mean megabytes uploaded before
            each evaluation; needs ``rs_bytes_up``) or ``"virtual"`` (mean virtual-clock seconds
            at each evaluation; needs ``rs_virtual_time``). Per-round metrics always use the
            round number, counted from 1.
        smooth: Moving-average window in points.
        note: Receives one-line remarks (truncation, runs left out, misaligned rounds).

    Returns:
        The grouped series, or None when no run has the metric.

    Raises:
        PlotError: ``x_mode`` is ``"time"`` or ``"bytes"`` and a run lacks the series it needs.
        ValueError: Unknown ``x_mode``.
    """
    if x_mode not in X_MODES:
        raise ValueError(f"x_mode must be one of {X_MODES}, not {x_mode!r}")
    say = note if note is not None else (lambda _message: None)
    if not runs:
        return None
    algorithm = runs[0].algorithm
    usable = [r for r in runs if r.get(metric.key) is not None and r.get(metric.key).size > 0]
    if not usable:
        return None
    if len(usable) < len(runs):
        missing = ", ".join(str(r.run) for r in runs if all(r is not u for u in usable))
        say(f"{algorithm}: run(s) {missing} have no '{metric.key}'; left out of the "
            f"{metric.name} plot")

    values = [moving_average(r.get(metric.key), smooth) * metric.scale for r in usable]
    mean, std, length = mean_std(values)
    lengths = [len(v) for v in values]
    if len(set(lengths)) > 1:
        unit = "rounds" if metric.per_round else "evaluations"
        say(f"{algorithm}: runs have different lengths ({', '.join(map(str, lengths))} {unit}); "
            f"curves truncated to the shortest ({length} {unit})")

    if metric.per_round:
        x = np.arange(1, length + 1, dtype=float)
    elif x_mode != "rounds":
        positions = []
        for run in usable:
            values = run.x_at_evals(x_mode)
            if values is None:
                needed = X_SERIES[x_mode]
                raise PlotError(
                    f"--x {x_mode} needs '{needed}', which {run.path} does not have "
                    f"(PFLlib-format file); use --x rounds")
            positions.append(values)
        x = mean_std(positions)[0][:length]
    else:
        x = usable[0].eval_rounds[:length].astype(float)
        if any(not np.array_equal(r.eval_rounds[:length], usable[0].eval_rounds[:length])
               for r in usable[1:]):
            say(f"{algorithm}: runs were evaluated at different rounds; x-axis uses the rounds "
                f"of run {usable[0].run}")
    return GroupedSeries(algorithm=algorithm, metric=metric, x=x, mean=mean, std=std,
                         lengths=lengths, runs=[r.run for r in usable])


# --------------------------------------------------------------------------------------------
# Summary table (plot.py, sweep.py, summarize.py and report.py print this one table)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Stat:
    """One figure over the runs of a row: mean and population std (``ddof=0``) over the runs
    that have a value (``count`` of them; NaN when none has)."""

    mean: float
    std: float
    count: int


@dataclass
class AlgorithmSummary:
    """One row of the summary table: the runs (``-t`` repeats) of one algorithm and goal.

    Accuracies are fractions as stored (not percent). ``stats`` holds every figure of
    :data:`SUMMARY_COLUMNS` that at least one run has, keyed by the column's key.

    Attributes:
        algorithm: The algorithm name (sweep.py appends the setting).
        n_runs: Number of runs.
        n_evals: Evaluations per run (min, max).
        last_round: Last evaluated round of the shortest run.
        best_mean, best_std: Mean and population std over runs of each run's best accuracy.
        final_mean, final_std: Same for each run's last accuracy.
        time_per_round: Mean seconds per training round over all runs' rounds, None without
            ``rs_round_time``.
        dataset, goal: Where the runs come from.
        personalized: True when the accuracy is that of each client's own model on its own test
            data (a personalised algorithm); the shared model's is then in the ``global_*`` stats.
        unfinished: Runs whose file says ``finished = False``.
        stats: Figure key -> :class:`Stat`.
    """

    algorithm: str
    n_runs: int
    n_evals: tuple[int, int]
    last_round: int
    best_mean: float
    best_std: float
    final_mean: float
    final_std: float
    time_per_round: float | None
    dataset: str = ""
    goal: str = ""
    personalized: bool = False
    unfinished: int = 0
    stats: dict[str, Stat] = field(default_factory=dict)


@dataclass(frozen=True)
class SummaryColumn:
    """A figure of the summary table.

    Attributes:
        key: Name in :attr:`AlgorithmSummary.stats` and in the CSV (``<key>_mean``, ...).
        header: Column header; ``{n}`` and ``{target}`` are filled in.
        kind: ``"acc"`` (a fraction shown in percent), ``"count"`` or ``"number"``.
        note: Exactly how the figure is computed (printed under Markdown tables, in reports).
        always: Shown even when no row has the figure (then as "–").
        none_text: Shown when the runs have what the figure needs but none gives a value (a
            target no run reached).
    """

    key: str
    header: str
    kind: str
    note: str
    always: bool = False
    none_text: str = MISSING


SUMMARY_COLUMNS: tuple[SummaryColumn, ...] = (
    SummaryColumn("best", "best acc (%)", "acc",
                  "the highest rs_test_acc of a run over all its evaluations (PFLlib's 'best "
                  "accuracy'); mean ± population std over the runs", always=True),
    SummaryColumn("final", "final acc (%)", "acc",
                  "the last rs_test_acc of a run (the model after its last training round)",
                  always=True),
    SummaryColumn("last_10pct", "last 10% (%)", "acc",
                  "mean rs_test_acc over the last 10% of a run's evaluations of trained models "
                  "(at least one; the evaluation of the untrained model at round 0 is never "
                  "counted), IGFL's metric", always=True),
    SummaryColumn("last_n", "last {n} (%)", "acc",
                  "mean rs_test_acc over the last N evaluations of trained models (all of them "
                  "when fewer than N; round 0 never counted)", always=True),
    SummaryColumn("global_best", "global best (%)", "acc",
                  "for personalised algorithms with a shared model: the best of "
                  "rs_test_acc_global, the shared model evaluated on every client's test data"),
    SummaryColumn("global_final", "global final (%)", "acc",
                  "the last rs_test_acc_global of a run"),
    SummaryColumn("rounds_to_target", "rounds to {target}", "count",
                  "the first evaluated round r whose rs_test_acc >= the target accuracy, i.e. "
                  "after r training rounds (AdaFL's metric); mean over the runs that reach it, "
                  "(k/n) when only k of n do", none_text="not reached"),
    SummaryColumn("mb_to_target", "MB up to {target}", "number",
                  "megabytes (10^6 bytes) uploaded by all clients in training rounds 0..r-1, "
                  "r the round reaching the target (sum of rs_bytes_up)", none_text="not reached"),
    SummaryColumn("s_per_round", "s/round", "number",
                  "mean of rs_round_time, the wall-clock seconds of each training round (client "
                  "training, aggregation and the evaluation made at the start of the round)",
                  always=True),
    SummaryColumn("peak_rss_mb", "peak RSS (MB)", "number",
                  "the attribute peak_rss_mb: the process's peak resident memory at the end of the "
                  "run (with -t, a later run's peak includes the earlier runs')", always=True),
    SummaryColumn("peak_gpu_mb", "peak GPU (MB)", "number",
                  "the attribute peak_gpu_mb: torch's peak allocated CUDA memory"),
    SummaryColumn("dp_epsilon", "DP ε", "number",
                  "the last rs_dp_epsilon of a run: the privacy budget spent by its end"),
    SummaryColumn("virtual_time", "virtual time (s)", "number",
                  "the last rs_virtual_time of a run: the simulated clock at its end"),
    SummaryColumn("new_client_acc", "new-client acc (%)", "acc",
                  "the last rs_new_client_acc of a run: accuracy on clients held out of training"),
)
COLUMNS_BY_KEY: dict[str, SummaryColumn] = {c.key: c for c in SUMMARY_COLUMNS}

_PERSONALIZED_CACHE: dict[str, bool | None] = {}


def registered_personalized(algorithm: str) -> bool | None:
    """Whether a registered algorithm evaluates personal models (its server's ``personalized``);
    None for a name this platform does not know (e.g. a PFLlib algorithm we lack)."""
    if algorithm not in _PERSONALIZED_CACHE:
        try:
            from flcore.registry import ALGORITHMS, load_all
            load_all()
            known = algorithm in ALGORITHMS
            _PERSONALIZED_CACHE[algorithm] = bool(ALGORITHMS.get(algorithm).personalized) if known else None
        except ImportError:  # the registry needs torch; the summaries do not
            _PERSONALIZED_CACHE[algorithm] = None
    return _PERSONALIZED_CACHE[algorithm]


def is_personalized(runs: Sequence[RunResult]) -> bool:
    """True when the runs' accuracy is that of personal models: the file records the shared
    model's accuracy separately, or the algorithm is registered as personalised."""
    if any(r.get("rs_test_acc_global") is not None for r in runs):
        return True
    return bool(runs) and bool(registered_personalized(runs[0].algorithm))


def _last(run: RunResult, key: str) -> float | None:
    values = run.get(key)
    return None if values is None or values.size == 0 else float(values[-1])


def _attr_number(run: RunResult, key: str) -> float | None:
    value = run.attrs.get(key)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if np.isfinite(number) else None


def run_figures(run: RunResult, avg_last: int = 10, target_acc: float | None = None) -> dict[str, float | None]:
    """Every figure of :data:`SUMMARY_COLUMNS` for one run (None where it cannot be computed),
    from the series themselves, so PFLlib's files and ours get the same definitions."""
    from utils.result_utils import reach_target, tail_means  # one definition for main.py and here

    acc = run.series["rs_test_acc"]
    finite = acc[np.isfinite(acc)]
    last_10pct, last_n = tail_means(acc, run.eval_rounds, avg_last)
    figures: dict[str, float | None] = {
        "best": float(finite.max()) if finite.size else None,
        "final": float(acc[-1]),
        "last_10pct": last_10pct,
        "last_n": last_n,
        "peak_rss_mb": _attr_number(run, "peak_rss_mb"),
        "peak_gpu_mb": _attr_number(run, "peak_gpu_mb"),
        "dp_epsilon": _last(run, "rs_dp_epsilon"),
        "virtual_time": _last(run, "rs_virtual_time"),
        "new_client_acc": _last(run, "rs_new_client_acc"),
    }
    times = run.get("rs_round_time")
    figures["s_per_round"] = float(times.mean()) if times is not None and times.size else None
    global_acc = run.get("rs_test_acc_global")
    if global_acc is not None and global_acc.size:
        figures["global_best"] = float(np.nanmax(global_acc))
        figures["global_final"] = float(global_acc[-1])
    if target_acc is not None:
        bytes_up = run.get("rs_bytes_up")
        reached = reach_target(acc, run.eval_rounds, bytes_up if bytes_up is not None else [], target_acc)
        # NaN: computable but not reached; None: not computable (no traffic recorded).
        figures["rounds_to_target"] = np.nan if reached is None else float(reached[0])
        figures["mb_to_target"] = None if bytes_up is None else np.nan if reached is None else reached[1] / 1e6
    return figures


def summarize_runs(runs: Sequence[RunResult], avg_last: int = 10,
                   target_acc: float | None = None) -> AlgorithmSummary:
    """The summary row of one algorithm's runs (full, untruncated series).

    Args:
        runs: At least one run of a single algorithm (and goal).
        avg_last: N of the "mean over the last N evaluations" column.
        target_acc: Accuracy (fraction) for the rounds/bytes-to-target columns; None leaves
            them out.

    Returns:
        The summary; accuracies are fractions like the stored data.
    """
    if not runs:
        raise ValueError("summarize_runs needs at least one run")
    per_run = [run_figures(r, avg_last, target_acc) for r in runs]
    stats: dict[str, Stat] = {}
    for key in COLUMNS_BY_KEY:
        present = np.array([f[key] for f in per_run if f.get(key) is not None], dtype=float)
        values = present[np.isfinite(present)]
        if values.size:
            stats[key] = Stat(float(values.mean()), float(values.std(ddof=0)), int(values.size))
        elif present.size:
            stats[key] = Stat(np.nan, np.nan, 0)
    evals = [r.n_evals for r in runs]
    shortest = runs[int(np.argmin(evals))]
    times = [t for r in runs if (t := r.get("rs_round_time")) is not None and t.size > 0]
    missing = Stat(np.nan, np.nan, 0)
    return AlgorithmSummary(
        algorithm=runs[0].algorithm,
        n_runs=len(runs),
        n_evals=(min(evals), max(evals)),
        last_round=int(shortest.eval_rounds[-1]),
        best_mean=stats.get("best", missing).mean,
        best_std=stats.get("best", missing).std,
        final_mean=stats["final"].mean if "final" in stats else np.nan,
        final_std=stats["final"].std if "final" in stats else np.nan,
        time_per_round=float(np.mean(np.concatenate(times))) if times else None,
        dataset=runs[0].dataset,
        goal=runs[0].goal,
        personalized=is_personalized(runs),
        unfinished=sum(not r.finished for r in runs),
        stats=stats,
    )


def shown_columns(summaries: Sequence[AlgorithmSummary]) -> list[SummaryColumn]:
    """The columns of a table: those always shown, and the others some row has."""
    return [c for c in SUMMARY_COLUMNS if c.always or any(c.key in s.stats for s in summaries)]


def column_header(column: SummaryColumn, avg_last: int, target_acc: float | None) -> str:
    target = "target" if target_acc is None else f"{100 * target_acc:g}%"
    return column.header.format(n=avg_last, target=target)


def format_cell(summary: AlgorithmSummary, column: SummaryColumn) -> str:
    """``mean ± std`` over the runs (percent for accuracies), ``(k/n)`` when only k of the n runs
    have the figure, "–" when none has it."""
    stat = summary.stats.get(column.key)
    if stat is None:
        return MISSING
    if stat.count == 0:
        return f"{column.none_text} (0/{summary.n_runs})" if column.none_text != MISSING else MISSING
    if column.kind == "acc":
        text = f"{100 * stat.mean:.2f} ± {100 * stat.std:.2f}"
    elif column.kind == "count":
        text = f"{stat.mean:.1f} ± {stat.std:.1f}"
    else:
        text = f"{stat.mean:.3g} ± {stat.std:.2g}" if summary.n_runs > 1 else f"{stat.mean:.3g}"
    if stat.count < summary.n_runs:
        text += f" ({stat.count}/{summary.n_runs})"
    return text


def summary_cells(summaries: Sequence[AlgorithmSummary], avg_last: int = 10,
                  target_acc: float | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and text cells of the table: algorithm, runs, evaluations, last round, (whose
    accuracy, for tables with personalised rows), the figures, (unfinished runs)."""
    columns = shown_columns(summaries)
    any_pfl = any(s.personalized for s in summaries)
    any_unfinished = any(s.unfinished for s in summaries)
    header = ["algorithm", "runs", "evals", "last round"]
    header += ["acc of"] if any_pfl else []
    header += [column_header(c, avg_last, target_acc) for c in columns]
    header += ["unfinished"] if any_unfinished else []
    rows = []
    for s in summaries:
        evals = str(s.n_evals[0]) if s.n_evals[0] == s.n_evals[1] else f"{s.n_evals[0]}-{s.n_evals[1]}"
        row = [s.algorithm, str(s.n_runs), evals, str(s.last_round)]
        row += [("personal models" if s.personalized else "global model")] if any_pfl else []
        row += [format_cell(s, c) for c in columns]
        row += [f"{s.unfinished} of {s.n_runs}" if s.unfinished else ""] if any_unfinished else []
        rows.append(row)
    return header, rows


def table_title(dataset: str, goal: str) -> str:
    return f"{dataset} (goal: {goal}): mean ± population std over the runs (-t repeats)"


def format_summary_table(summaries: Sequence[AlgorithmSummary], dataset: str, goal: str,
                         avg_last: int = 10, target_acc: float | None = None) -> str:
    """The table as aligned plain text, one row per algorithm, under a title line."""
    header, rows = summary_cells(summaries, avg_last, target_acc)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "  ".join([first, *rest]).rstrip()

    lines = [table_title(dataset, goal), line(header), line(["-" * w for w in widths]), *map(line, rows)]
    if any(s.unfinished for s in summaries):
        lines.append("unfinished: runs interrupted before their last round (their file says finished = False)")
    return "\n".join(lines)


def format_summary_markdown(summaries: Sequence[AlgorithmSummary], dataset: str, goal: str,
                            avg_last: int = 10, target_acc: float | None = None) -> str:
    """The table in Markdown, followed by how each figure shown was computed."""
    header, rows = summary_cells(summaries, avg_last, target_acc)
    escape = lambda cell: cell.replace("|", "\\|")  # noqa: E731 - one-line cell escape
    lines = [f"### {table_title(dataset, goal)}", "",
             "| " + " | ".join(map(escape, header)) + " |",
             "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(map(escape, row)) + " |" for row in rows]
    lines += [""] + [f"- {column_header(c, avg_last, target_acc)}: {c.note}" for c in shown_columns(summaries)]
    return "\n".join(lines)


def summary_records(summaries: Sequence[AlgorithmSummary]) -> list[dict[str, Any]]:
    """One flat dict per row for CSV files: identity, then ``<key>_mean``, ``<key>_std`` and
    ``<key>_runs`` of every figure (empty where missing), fractions as stored."""
    records = []
    for s in summaries:
        record: dict[str, Any] = {
            "dataset": s.dataset, "goal": s.goal, "algorithm": s.algorithm, "runs": s.n_runs,
            "unfinished": s.unfinished, "evals_min": s.n_evals[0], "evals_max": s.n_evals[1],
            "last_round": s.last_round, "accuracy_of": "personal models" if s.personalized else "global model",
        }
        for column in SUMMARY_COLUMNS:
            stat = s.stats.get(column.key)
            known = stat is not None and stat.count > 0
            record[f"{column.key}_mean"] = repr(stat.mean) if known else ""
            record[f"{column.key}_std"] = repr(stat.std) if known else ""
            record[f"{column.key}_runs"] = 0 if stat is None else stat.count
        records.append(record)
    return records


def find_all_runs(results_dir: Path | str, datasets: Sequence[str] | None = None,
                  algorithms: Sequence[str] | None = None, goals: Sequence[str] | None = None,
                  note: Note | None = None) -> dict[str, dict[tuple[str, str], list[RunResult]]]:
    """Every result file of a folder, loaded and grouped: dataset -> (algorithm, goal) -> runs.

    Files are found by name (``<dataset>_<algorithm>_<goal>_<run>.h5``) and identified by their
    attributes where they have them; the filters keep the listed names only (None: all). A file
    that cannot be read is left out with a note, so one broken file does not hide the others.
    """
    folder = Path(results_dir)
    if not folder.is_dir():
        raise PlotError(f"results folder {folder} does not exist; pass --results_dir")
    say = note if note is not None else (lambda _message: None)
    grouped: dict[str, dict[tuple[str, str], list[RunResult]]] = {}
    for path in sorted(folder.glob("*.h5")):
        if parse_result_name(path.name) is None:
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
    for table in grouped.values():
        for runs in table.values():
            runs.sort(key=lambda r: r.run)
    return dict(sorted(grouped.items()))

# --------------------------------------------------------------------------------------------
# Plotting
# --------------------------------------------------------------------------------------------

def plot_file_name(dataset: str, goal: str, metric: str, x_mode: str = "rounds") -> str:
    """PNG name for one metric, e.g. ``MNIST_test_acc.png`` (``..._vs_time.png`` for ``--x time``,
    ``..._vs_bytes.png`` for ``--x bytes``)."""
    suffix = f"_vs_{x_mode}" if x_mode != "rounds" and not METRICS[metric].per_round else ""
    return f"{dataset}_{goal}_{metric}{suffix}.png"


def draw_metric(axes: Any, groups: Sequence[GroupedSeries], x_mode: str = "rounds",
                colors: dict[str, str] | None = None) -> None:
    """Mean curves with ±std bands into matplotlib ``axes``: one colour per algorithm (from
    ``colors``, so that several panels agree, else in order), its shared model's accuracy
    (``variant``) dashed in the same colour; whole-number ticks on a round axis (there is no
    round 2.5)."""
    colors = dict(colors or {})
    for group in groups:
        color = colors.setdefault(group.algorithm, f"C{len(colors) % 10}")
        marker = "o" if len(group.x) <= 30 else None
        axes.plot(group.x, group.mean, color=color, marker=marker, markersize=3, linewidth=1.6,
                  linestyle="--" if group.metric.variant else "-", label=group.label)
        if group.n_runs > 1:
            axes.fill_between(group.x, group.mean - group.std, group.mean + group.std,
                              color=color, alpha=0.15 if group.metric.variant else 0.2, linewidth=0)
    metric = groups[0].metric
    mode = "rounds" if metric.per_round else x_mode
    axes.set_xlabel(X_LABELS[mode])
    if mode == "rounds":
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel(metric.label)
    axes.grid(True, alpha=0.35)
    axes.legend(loc="best", frameon=True, fontsize="small")


def plot_metric(groups: Sequence[GroupedSeries], dataset: str, goal: str, out_path: Path | str,
                x_mode: str = "rounds", smooth: int = 1, dpi: int = 150) -> Path:
    """Draw the mean curves with ±std bands of several algorithms into one PNG (Agg backend).

    Args:
        groups: Grouped series of one metric (a pFL algorithm's shared-model accuracy included).
        dataset: Dataset name for the title.
        goal: Goal string for the title.
        out_path: The PNG to write (its folder must exist).
        x_mode: One of :data:`X_MODES`; only changes the x label and ticks.
        smooth: Moving-average window used, mentioned in the title when > 1.
        dpi: Resolution.

    Returns:
        ``out_path`` as a Path.
    """
    if not groups:
        raise ValueError("plot_metric needs at least one series")
    metric = groups[0].metric
    figure = Figure(figsize=(7.0, 4.5), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    draw_metric(axes, groups, x_mode)
    title = f"{dataset}: {metric.title} (goal: {goal})"
    extras = []
    if any(g.n_runs > 1 for g in groups):
        extras.append("mean ± std over runs")
    if smooth > 1:
        extras.append(f"moving average of {smooth}")
    if extras:
        title += "\n" + ", ".join(extras)
    axes.set_title(title)
    figure.tight_layout()
    out_path = Path(out_path)
    figure.savefig(out_path, dpi=dpi)
    return out_path


def metric_groups(runs_by_algorithm: dict[str, Sequence[RunResult]], metric: MetricSpec,
                  x_mode: str = "rounds", smooth: int = 1, note: Note | None = None) -> list[GroupedSeries]:
    """The grouped series of one metric for every algorithm that has it; for accuracy, a
    personalised algorithm's curve is marked as such and followed by its shared model's
    (``rs_test_acc_global``) where the files have it."""
    groups: list[GroupedSeries] = []
    for runs in runs_by_algorithm.values():
        personalized = is_personalized(runs)
        for spec in ([metric, GLOBAL_ACC] if metric.key == "rs_test_acc" else [metric]):
            group = group_runs(runs, spec, x_mode=x_mode, smooth=smooth,
                               note=note if spec is metric else None)
            if group is not None:
                group.personalized = personalized
                groups.append(group)
    return groups
