"""Drawing grouped series (:mod:`reporting.series`) with matplotlib's Agg backend (no display)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from reporting.series import METRICS, X_LABELS, GroupedSeries
from reporting.results import write_atomically


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
                x_mode: str = "rounds", smooth: int = 1, dpi: int = 150, flag: str = "--out") -> Path:
    """Draw the mean curves with ±std bands of several algorithms (of one metric, a pFL
    algorithm's shared-model accuracy included) into one PNG, written atomically (an error
    names ``flag``, the option that chose the folder); ``smooth``, the moving-average window
    used, is named in the title when > 1. Returns ``out_path``."""
    if not groups:
        raise ValueError("plot_metric needs at least one series")
    figure = Figure(figsize=(7.0, 4.5), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    draw_metric(axes, groups, x_mode)
    title = f"{dataset}: {groups[0].metric.title} (goal: {goal})"
    extras = ["mean ± std over runs"] if any(g.n_runs > 1 for g in groups) else []
    extras += [f"moving average of {smooth}"] if smooth > 1 else []
    if extras:
        title += "\n" + ", ".join(extras)
    axes.set_title(title)
    figure.tight_layout()
    out_path = Path(out_path)
    write_atomically(out_path, lambda tmp: figure.savefig(tmp, dpi=dpi, format="png"), flag=flag)
    return out_path
