"""A sweep's grid as heatmaps: one cell per pair of values of two flags (attack × defence).

``plot.py -data MNIST -algo FedAvg -go sweep --grid attack,robust`` reads every run of the
algorithm whose goal is ``sweep`` or starts with ``sweep-`` (the goals ``sweep.py`` gives its
settings), takes the two flags from each run's stored configuration (``config``; a flag that is
unset, such as no ``--attack``, is shown as ``none``), and draws per algorithm:

* ``acc``: the final accuracy (the last ``rs_test_acc`` of each run), in percent;
* ``asr``: the final attack success rate (the last ``rs_backdoor_asr``) of the backdoor runs, in
  percent; cells whose runs have no backdoor are left blank (drawn only when some run has it).

A cell's value is the mean over its runs (the ``-t``/sweep repeats), and it shows the number of
runs when there are several. Runs in one cell whose other stored flags differ (a third axis of the
sweep) are not averaged: that is one line naming the flags, exit status 2 (narrow the runs with
``-go``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from reporting.loading import PlotError, RunResult
from reporting.settings import differing_flags
from reporting.results import write_atomically

#: the grid's metrics: the series whose last value a cell averages, and its title
GRID_METRICS: dict[str, tuple[str, str]] = {
    "acc": ("rs_test_acc", "final accuracy (%)"),
    "asr": ("rs_backdoor_asr", "attack success rate (%)"),
}
UNSET = "none"


@dataclass
class Grid:
    """One metric over two flags: ``values[i, j]`` (NaN: no run) over ``counts[i, j]`` runs, and
    ``collapsed[i, j]`` runs whose model diverged as they measured (left out of the value: their
    last accuracy is the one before the collapse)."""

    row_flag: str
    col_flag: str
    rows: list[str]
    cols: list[str]
    metric: str
    values: np.ndarray
    counts: np.ndarray
    collapsed: np.ndarray | None = None

    def cell_text(self, i: int, j: int, scale: float = 100.0, digits: int = 2) -> str:
        """A cell's value (percent) with its collapsed runs, ``–`` for an empty cell."""
        gone = 0 if self.collapsed is None else int(self.collapsed[i, j])
        if self.counts[i, j] == 0:
            return "collapsed" if gone else "–"
        value = f"{scale * self.values[i, j]:.{digits}f}"
        return f"{value} ({gone} collapsed)" if gone else value


def parse_grid_flags(text: str) -> tuple[str, str]:
    """``"attack,robust"`` as two flag names (``--attack`` and ``-attack`` spelled alike)."""
    names = [name.strip().lstrip("-") for name in text.split(",")]
    if len(names) != 2 or not all(names) or names[0] == names[1]:
        raise PlotError(f"--grid {text!r}: give two different flags as ROWS,COLUMNS, e.g. --grid attack,robust")
    return names[0], names[1]


def flag_value(run: RunResult, flag: str) -> str:
    """A run's value of ``flag`` as a label (``none`` when unset)."""
    value = run.config.get(flag)
    if value is None or value == "":
        return UNSET
    return value if isinstance(value, str) else json.dumps(value)


def _order(labels: set[str]) -> list[str]:
    return sorted(labels, key=lambda label: (label != UNSET, label))


def cells_of(runs: Sequence[RunResult], row_flag: str, col_flag: str) -> dict[tuple[str, str], list[RunResult]]:
    """The runs by (row value, column value); a PlotError for runs without a stored configuration, or a
    cell whose runs differ in another flag."""
    bare = [run.path.name for run in runs if not run.config]
    if bare:
        raise PlotError(f"{', '.join(bare)}: no stored settings (PFLlib-format files), so no --grid cell; "
                        f"leave them out with -go")
    missing = [flag for flag in (row_flag, col_flag) if not any(flag in run.config for run in runs)]
    if missing:
        raise PlotError(f"--grid: no run stores the flag {missing[0]!r}; give flags of main.py, e.g. attack,robust")
    cells: dict[tuple[str, str], list[RunResult]] = {}
    for run in runs:
        cells.setdefault((flag_value(run, row_flag), flag_value(run, col_flag)), []).append(run)
    for (row, col), members in cells.items():
        others = [flag for flag in differing_flags(members) if flag not in (row_flag, col_flag)]
        if others:
            raise PlotError(f"--grid cell {row_flag}={row}, {col_flag}={col}: its {len(members)} runs differ in "
                            f"{', '.join(others)}; narrow the runs with -go (one setting of the other flags per cell)")
    return cells


def build_grid(cells: dict[tuple[str, str], list[RunResult]], row_flag: str, col_flag: str, metric: str) -> Grid | None:
    """The metric's grid, or None when no run has its series."""
    key = GRID_METRICS[metric][0]
    rows = _order({row for row, _ in cells})
    cols = _order({col for _, col in cells})
    values = np.full((len(rows), len(cols)), np.nan)
    counts = np.zeros((len(rows), len(cols)), dtype=int)
    collapsed = np.zeros((len(rows), len(cols)), dtype=int)
    for (row, col), members in cells.items():
        i, j = rows.index(row), cols.index(col)
        collapsed[i, j] = sum(run.diverged for run in members)
        finals = [float(series[-1]) for run in members
                  if not run.diverged and (series := run.get(key)) is not None and series.size]
        finals = [value for value in finals if np.isfinite(value)]
        if finals:
            values[i, j], counts[i, j] = float(np.mean(finals)), len(finals)
    if not counts.any() and not collapsed.any():
        return None
    return Grid(row_flag, col_flag, rows, cols, metric, values, counts, collapsed)


def format_grid(grid: Grid) -> str:
    """The grid as a text table (percent; ``–`` for an empty cell)."""
    header = [f"{grid.row_flag} \\ {grid.col_flag}", *grid.cols]
    lines = [header]
    for i, row in enumerate(grid.rows):
        lines.append([row, *(grid.cell_text(i, j) for j in range(len(grid.cols)))])
    widths = [max(len(line[k]) for line in lines) for k in range(len(header))]
    text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines]
    return f"{GRID_METRICS[grid.metric][1]}\n" + "\n".join(text)


def draw_grid(grid: Grid, title: str, out_path: Path, dpi: int = 150, flag: str = "--out") -> Path:
    """The heatmap, each cell annotated with its value (and its number of runs when > 1), written
    atomically."""
    figure = Figure(figsize=(max(6.5, 3.0 + 1.3 * len(grid.cols)), 1.6 + 0.6 * len(grid.rows)), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    percent = np.ma.masked_invalid(100 * grid.values)
    image = axes.imshow(percent, cmap="viridis" if grid.metric == "acc" else "magma_r", vmin=0, vmax=100,
                        aspect="auto")
    figure.colorbar(image, ax=axes, label=GRID_METRICS[grid.metric][1])
    axes.set_xticks(range(len(grid.cols)), grid.cols, rotation=30, ha="right")
    axes.set_yticks(range(len(grid.rows)), grid.rows)
    axes.set_xlabel(grid.col_flag)
    axes.set_ylabel(grid.row_flag)
    for i in range(len(grid.rows)):
        for j in range(len(grid.cols)):
            if not grid.counts[i, j] and grid.collapsed is not None and grid.collapsed[i, j]:
                axes.text(j, i, "collapsed", ha="center", va="center", fontsize="small", color="red")
            elif grid.counts[i, j]:
                runs = f"\n({grid.counts[i, j]} runs)" if grid.counts[i, j] > 1 else ""
                dark = percent[i, j] < 50 if grid.metric == "acc" else percent[i, j] > 50
                axes.text(j, i, f"{percent[i, j]:.1f}{runs}", ha="center", va="center", fontsize="small",
                          color="white" if dark else "black")
    axes.set_title(title, fontsize="medium")
    figure.tight_layout()
    write_atomically(out_path, lambda tmp: figure.savefig(tmp, dpi=dpi, format="png"), flag=flag)
    return out_path


def grid_file_name(dataset: str, goal: str, algorithm: str, metric: str) -> str:
    return f"{dataset}_{goal}_{algorithm}_grid_{metric}.png"


def in_sweep(goal: str, base: str) -> bool:
    """Whether ``goal`` is the base goal or one of a sweep's settings of it (``base-...``)."""
    return goal == base or goal.startswith(f"{base}-")
