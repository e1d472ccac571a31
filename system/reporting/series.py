"""Curves: the runs of one algorithm combined into a mean ± std series of one metric.

Repeated runs are combined point-wise into a mean with a population standard deviation
(``ddof=0``, as PFLlib's ``average_data``), truncated to the shortest run.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from reporting.loading import Note, PlotError, RunResult, measured_metric


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
#: evaluation, the megabytes uploaded before it, or the virtual clock's seconds (flcore/features/clock.py).
X_MODES: tuple[str, ...] = ("rounds", "time", "bytes", "virtual")
X_LABELS: dict[str, str] = {
    "rounds": "Communication round",
    "time": "Wall-clock time (s)",
    "bytes": "Uploaded traffic (MB)",
    "virtual": "Virtual time (s)",
}
#: The series each x-axis needs.
X_SERIES: dict[str, str] = {"time": "rs_round_time", "bytes": "rs_bytes_up", "virtual": "rs_virtual_time"}


@dataclass
class GroupedSeries:
    """Mean and standard deviation of one metric over the runs of one algorithm.

    Attributes:
        algorithm: The name shown (the algorithm, and its setting when runs were split).
        metric: The metric plotted.
        x: The x values (rounds or seconds), of the truncated length.
        mean, std: Per-point mean and population std over the runs (already scaled).
        lengths: Length of each run's series before truncation, in run order.
        runs: Run indices that contributed.
        personalized: True when the accuracy is that of each client's own model.
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


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average of the same length (the first points average what exists);
    a window of 1 (or less) returns a copy unchanged."""
    values = np.asarray(values, dtype=float)
    if window <= 1 or values.size == 0:
        return values.copy()
    cumulative = np.concatenate([[0.0], np.cumsum(values)])
    ends = np.arange(1, values.size + 1)
    starts = np.maximum(ends - window, 0)
    return (cumulative[ends] - cumulative[starts]) / (ends - starts)


def mean_std(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
    """Point-wise mean and population std (``ddof=0``) of series cut to the shortest, and that
    common length.

    Raises:
        ValueError: ``arrays`` is empty.
    """
    if not arrays:
        raise ValueError("mean_std needs at least one series")
    length = min(len(a) for a in arrays)
    stacked = np.stack([np.asarray(a, dtype=float)[:length] for a in arrays])
    return stacked.mean(axis=0), stacked.std(axis=0, ddof=0), length


def _x_values(usable: Sequence[RunResult], metric: MetricSpec, x_mode: str, length: int,
              name: str, say: Note) -> np.ndarray:
    """The x values of a grouped series (see :func:`group_runs`)."""
    if metric.per_round:
        return np.arange(1, length + 1, dtype=float)
    if x_mode != "rounds":
        positions = []
        for run in usable:
            values = run.x_at_evals(x_mode)
            if values is None:
                raise PlotError(f"--x {x_mode} needs '{X_SERIES[x_mode]}', which {run.path} does not "
                                f"have (PFLlib-format file); use --x rounds")
            positions.append(values)
        return mean_std(positions)[0][:length]
    first = usable[0].eval_rounds[:length]
    if any(not np.array_equal(r.eval_rounds[:length], first) for r in usable[1:]):
        say(f"{name}: runs were evaluated at different rounds; x-axis uses the rounds of run {usable[0].run}")
    return first.astype(float)


def measured(metric: MetricSpec, runs: Sequence[RunResult]) -> MetricSpec:
    """``metric`` named for what the runs' accuracy measures (``measured_metric``: a multi-label
    dataset's ``recall@5``)."""
    if not metric.key.startswith("rs_test_acc"):
        return metric
    name = measured_metric(runs)
    if name == "accuracy":
        return metric
    return replace(metric, label=f"Test {name} (%)", title=f"test {name}")


def group_runs(runs: Sequence[RunResult], metric: MetricSpec, x_mode: str = "rounds",
               smooth: int = 1, note: Note | None = None, name: str | None = None) -> GroupedSeries | None:
    """Combine the runs of one algorithm into a mean ± std curve for one metric; None when no
    run has the metric.

    Each run is smoothed first (``smooth`` > 1), then all are cut to the shortest run.
    ``x_mode``: ``"rounds"`` (evaluation rounds), ``"time"`` (mean elapsed seconds at each
    evaluation; needs ``rs_round_time``), ``"bytes"`` (mean megabytes uploaded before each
    evaluation; needs ``rs_bytes_up``) or ``"virtual"`` (mean virtual-clock seconds; needs
    ``rs_virtual_time``). Per-round metrics always use the round number, counted from 1.
    ``note`` receives remarks (truncation, runs left out, misaligned rounds); ``name`` is the
    name shown (default: the algorithm).

    Raises:
        PlotError: A run lacks the series ``x_mode`` needs.
        ValueError: Unknown ``x_mode``.
    """
    if x_mode not in X_MODES:
        raise ValueError(f"x_mode must be one of {X_MODES}, not {x_mode!r}")
    say = note if note is not None else (lambda _message: None)
    usable = [r for r in runs if r.get(metric.key) is not None and r.get(metric.key).size > 0]
    if not usable:
        return None
    name = name or usable[0].algorithm
    if len(usable) < len(runs):
        missing = ", ".join(str(r.run) for r in runs if all(r is not u for u in usable))
        say(f"{name}: run(s) {missing} have no '{metric.key}'; left out of the {metric.name} plot")
    values = [moving_average(r.get(metric.key), smooth) * metric.scale for r in usable]
    mean, std, length = mean_std(values)
    lengths = [len(v) for v in values]
    if len(set(lengths)) > 1:
        unit = "rounds" if metric.per_round else "evaluations"
        say(f"{name}: runs have different lengths ({', '.join(map(str, lengths))} {unit}); "
            f"curves truncated to the shortest ({length} {unit})")
    x = _x_values(usable, metric, x_mode, length, name, say)
    return GroupedSeries(algorithm=name, metric=measured(metric, usable), x=x, mean=mean, std=std,
                         lengths=lengths, runs=[r.run for r in usable])


def metric_groups(runs_by_name: dict[str, Sequence[RunResult]], metric: MetricSpec,
                  x_mode: str = "rounds", smooth: int = 1, note: Note | None = None) -> list[GroupedSeries]:
    """The grouped series of one metric for every name (algorithm, or algorithm and setting)
    that has it; for accuracy, a personalised algorithm's curve is marked as such and followed by
    its shared model's (``rs_test_acc_global``) where the files have it."""
    groups: list[GroupedSeries] = []
    for name, runs in runs_by_name.items():
        personalized = any(r.personalized for r in runs)
        for spec in ([metric, GLOBAL_ACC] if metric.key == "rs_test_acc" else [metric]):
            group = group_runs(runs, spec, x_mode=x_mode, smooth=smooth,
                               note=note if spec is metric else None, name=name)
            if group is not None:
                group.personalized = personalized
                groups.append(group)
    return groups
