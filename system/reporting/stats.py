"""The figures of the summary table (plot.py, sweep.py, summarize.py and report.py print this
one table): each defined once, per run from its series, then mean ± population std over runs.

Accuracies are fractions as stored; the tail means and the target figures are main.py's own
definitions (:mod:`reporting.results`, which imports no torch), so the table and the run's
printed summary agree.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from reporting.loading import RunResult, measured_metric
from reporting.results import reach_target, tail_gain, tail_means

MISSING = "–"  # a figure the files do not allow to compute (PFLlib's files lack most series)


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

    Attributes:
        algorithm: The row's name (the algorithm; its setting or goal appended when needed).
        n_runs: Number of runs.
        n_evals: Evaluations per run (min, max).
        last_round: Last evaluated round of the shortest run.
        best_mean, best_std: Mean and population std over runs of each run's best accuracy.
        final_mean, final_std: Same for each run's last accuracy.
        time_per_round: Mean seconds per training round over all runs' rounds, None without
            ``rs_round_time``.
        dataset, goal: Where the runs come from.
        personalized: True when the accuracy is that of each client's own model on its own test
            data (the shared model's is then in the ``global_*`` stats), None when the files do
            not say (:attr:`RunResult.personalized`).
        unfinished: Runs whose file says ``finished = False``.
        collapsed: Runs whose model diverged as they measured (an attack, ``--record_divergence``:
            ``diverged_round``).
        stats: Figure key -> :class:`Stat`, for every figure of :data:`SUMMARY_COLUMNS` that at
            least one run has.
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
    personalized: bool | None = False
    unfinished: int = 0
    stats: dict[str, Stat] = field(default_factory=dict)
    collapsed: int = 0
    #: what the accuracies measure (``RunResult.metric``: a multi-label dataset's recall@5)
    metric: str = "accuracy"


@dataclass(frozen=True)
class SummaryColumn:
    """A figure of the summary table.

    Attributes:
        key: Name in :attr:`AlgorithmSummary.stats` and in the CSV (``<key>_mean``, ...).
        header: Column header; ``{n}`` and ``{target}`` are filled in.
        kind: ``"acc"`` (a fraction shown in percent), ``"gain"`` (a difference of fractions shown
            in signed percentage points), ``"count"`` or ``"number"``.
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
    SummaryColumn("gain_last_n", "last {n} gain (points)", "gain",
                  "mean rs_test_acc over the last N evaluations of trained models minus the mean over "
                  "the N before them, in percentage points: about 0 when a run had converged where it "
                  "stopped, a gain when it was still learning (runs with at least 2N such evaluations)"),
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
                  "r the round reaching the target (sum of rs_bytes_up: what was sent, late or "
                  "dropped uploads included)", none_text="not reached"),
    SummaryColumn("mb_arrived_to_target", "MB arrived to {target}", "number",
                  "the same sum of rs_bytes_up_arrived: the uploads that reached the server in "
                  "those rounds (a straggler's in the round it arrives); files written before the "
                  "series lack it", none_text="not reached"),
    SummaryColumn("virtual_to_target", "virtual s to {target}", "number",
                  "the virtual clock's reading (rs_virtual_time) after the training rounds 0..r-1, "
                  "r the round reaching the target", none_text="not reached"),
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


def is_personalized(runs: Sequence[RunResult]) -> bool | None:
    """True when some run measured personal models, False when every run says it measured
    the global model, None when it is unknown for some (files without the attribute)."""
    says = [r.personalized for r in runs]
    if any(says):
        return True
    return None if None in says else False


def unknown_personalization(runs_by_name: dict[str, Sequence[RunResult]]) -> str | None:
    """The one line naming the rows (or lines) whose files do not tell whose model their
    accuracy is, or None when every file tells."""
    unknown = [name for name, runs in runs_by_name.items() if is_personalized(runs) is None]
    if not unknown:
        return None
    return (f"the files of {', '.join(unknown)} do not say whether their accuracy is the global "
            f"model's or each client's own model's (PFLlib's files, or written before main.py "
            f"stored 'personalized'); shown as 'unknown' under 'acc of'")


def _last(run: RunResult, key: str) -> float | None:
    values = run.get(key)
    return None if values is None or values.size == 0 else float(values[-1])


def _attr_number(run: RunResult, key: str) -> float | None:
    try:
        number = float(run.attrs.get(key))
    except (TypeError, ValueError):
        return None
    return number if np.isfinite(number) else None


def run_figures(run: RunResult, avg_last: int = 10, target_acc: float | None = None) -> dict[str, float | None]:
    """Every figure of :data:`SUMMARY_COLUMNS` for one run (None where it cannot be computed),
    from the series themselves, so PFLlib's files and ours get the same definitions."""
    acc = run.series["rs_test_acc"]
    finite = acc[np.isfinite(acc)]
    last_10pct, last_n = tail_means(acc, run.eval_rounds, avg_last)
    figures: dict[str, float | None] = {
        "best": float(finite.max()) if finite.size else None,
        "final": float(acc[-1]),
        "last_10pct": last_10pct,
        "last_n": last_n,
        "gain_last_n": tail_gain(acc, run.eval_rounds, avg_last),
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
        arrived = run.get("rs_bytes_up_arrived")
        figures["mb_arrived_to_target"] = (None if arrived is None else np.nan if reached is None
                                           else reach_target(acc, run.eval_rounds, arrived, target_acc)[1] / 1e6)
        clock = run.get("rs_virtual_time")
        if clock is not None:
            at = None if reached is None else np.concatenate([[0.0], clock])[min(reached[0], len(clock))]
            figures["virtual_to_target"] = np.nan if at is None else float(at)
    return figures


def summarize_runs(runs: Sequence[RunResult], avg_last: int = 10, target_acc: float | None = None,
                   name: str | None = None) -> AlgorithmSummary:
    """The summary row of one algorithm's runs (full, untruncated series), named ``name``
    (default: the algorithm). ``avg_last``: N of the "last N evaluations" column;
    ``target_acc``: accuracy (fraction) of the to-target columns, None leaves them out."""
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
    times = [t for r in runs if (t := r.get("rs_round_time")) is not None and t.size > 0]
    missing = Stat(np.nan, np.nan, 0)
    return AlgorithmSummary(
        algorithm=name or runs[0].algorithm,
        n_runs=len(runs),
        n_evals=(min(evals), max(evals)),
        last_round=int(runs[int(np.argmin(evals))].eval_rounds[-1]),
        best_mean=stats.get("best", missing).mean,
        best_std=stats.get("best", missing).std,
        final_mean=stats.get("final", missing).mean,
        final_std=stats.get("final", missing).std,
        time_per_round=float(np.mean(np.concatenate(times))) if times else None,
        dataset=runs[0].dataset,
        goal=runs[0].goal,
        personalized=is_personalized(runs),
        unfinished=sum(not r.finished for r in runs),
        stats=stats,
        collapsed=sum(r.diverged for r in runs),
        metric=measured_metric(runs),
    )
