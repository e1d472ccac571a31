"""Write one self-contained HTML report of the runs in a results folder.

Run from ``system/``::

    python report.py                                   # every run in ../results -> ../results/report.html
    python report.py -data MNIST -algo FedAvg Ditto --target_acc 0.9 --out mnist.html

Per dataset, the page holds the summary table of ``summarize.py`` (the same rows and
definitions), accuracy and training-loss curves against communication rounds, wall-clock time,
uploaded megabytes and the virtual clock (mean line and ±std band over the ``-t`` repeats), the distribution of
the clients' test accuracies at the last evaluation, and each run's full configuration (the
``config`` attribute main.py stores; runs of one algorithm made with different settings are
separate rows, as in ``summarize.py``); a closing section states exactly how every figure and
curve was computed. Images are PNGs drawn with matplotlib's Agg backend and embedded as base64
``data:`` URIs: the page loads no file, script, font or style sheet from anywhere, so it can
be mailed or archived alone. Errors are one line on stderr and exit status 2.
"""
from __future__ import annotations

import base64
import html
import io
import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from reporting.cli import NotePrinter, one_line_errors, write_output
from reporting.loading import RunResult
from reporting.plots import draw_metric
from reporting.series import METRICS, X_LABELS, X_MODES, X_SERIES, metric_groups
from reporting.stats import AlgorithmSummary
from reporting.tables import column_header, shown_columns, summary_cells, table_title
from summarize import add_selection_flags, load_tables
from cli.flags import ExactParser

PROG = "report.py"
DPI = 90

#: How each curve and figure of the page is computed (the table's columns carry their own notes).
CURVE_NOTES: tuple[tuple[str, str], ...] = (
    ("Curves", "each algorithm's runs (-t repeats) are cut to the shortest run; the line is the "
               "point-wise mean and the band the point-wise population std (ddof=0) over the runs."),
    ("Test accuracy", "rs_test_acc: correctly classified test samples of all clients divided by "
                      "all test samples, at each evaluation; for personalised algorithms each "
                      "client uses its own model on its own test data, and the dashed line of the "
                      "same colour is rs_test_acc_global, the shared model on the same data."),
    ("Training loss", "rs_train_loss: the sample-weighted mean loss of the evaluated model over "
                      "all clients' training data at each evaluation."),
    ("x: communication round", "the evaluation at round r measures the model after r training "
                               "rounds (round 0: the untrained model)."),
    ("x: wall-clock time", "the sum of rs_round_time over training rounds 0..r-1 before the "
                           "evaluation at round r, averaged over the runs; PFLlib files lack it."),
    ("x: uploaded traffic", "the sum of rs_bytes_up (bytes uploaded by all clients of a round, counted "
                            "in the round they were sent, whether they arrived then, later or never; "
                            "rs_bytes_up_arrived holds what reached the server in each round) over "
                            "training rounds 0..r-1, in 10^6 bytes, averaged over the runs."),
    ("x: virtual time", "rs_virtual_time, the simulated clock (flcore/features/clock.py) after training "
                        "round r-1, averaged over the runs; files written before the clock lack it."),
    ("Client accuracy distribution", "the last row of rs_client_acc (each client's test accuracy "
                                     "at the last evaluation), pooled over the runs; box: quartiles "
                                     "and median, whiskers 1.5 IQR, dots: every client of every run."),
)

STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1400px; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; display: block; overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { background: #f0f0f0; }
img { max-width: 100%; height: auto; display: block; margin: 0.5em 0; }
pre { background: #f7f7f7; padding: 0.5em; overflow-x: auto; font-size: 0.8em; }
dt { font-weight: bold; margin-top: 0.4em; } .muted { color: #666; }
"""


def build_parser() -> ExactParser:
    parser = ExactParser(prog=PROG, description=__doc__.split("\n\n", 1)[0])
    add_selection_flags(parser)
    parser.add_argument("--out", default=None, metavar="FILE",
                        help="the HTML file (default: <results_dir>/report.html)")
    parser.add_argument("--title", default="Federated-learning results", help="the page's heading")
    return parser


def png_data_uri(figure: Figure) -> str:
    """The figure as an embedded PNG (``data:image/png;base64,...``)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def image(uri: str, alt: str) -> str:
    return f'<img src="{uri}" alt="{html.escape(alt)}">'


def palette(runs_by_algorithm: dict[str, list[RunResult]]) -> dict[str, str]:
    """One matplotlib colour per algorithm, the same in every panel of a dataset."""
    return {algorithm: f"C{i % 10}" for i, algorithm in enumerate(runs_by_algorithm)}


def curves_figure(dataset: str, runs_by_algorithm: dict[str, list[RunResult]]) -> Figure:
    """Accuracy (top) and training loss (bottom) against rounds, time and uploaded MB."""
    figure = Figure(figsize=(5.3 * len(X_MODES), 8.5))
    FigureCanvasAgg(figure)
    colors = palette(runs_by_algorithm)
    panels = figure.subplots(2, len(X_MODES))
    for row, metric in enumerate((METRICS["acc"], METRICS["loss"])):
        for column, x_mode in enumerate(X_MODES):
            axes = panels[row][column]
            usable = {a: r for a, r in runs_by_algorithm.items()
                      if all(run.x_at_evals(x_mode) is not None for run in r)}
            groups = metric_groups(usable, metric, x_mode=x_mode)
            left_out = sorted(set(runs_by_algorithm) - set(usable))
            title = f"{metric.title} vs {X_LABELS[x_mode].split(' (')[0].lower()}"
            if left_out:
                title += f"\n(no data for this axis: {', '.join(left_out)})"
            axes.set_title(title, fontsize="medium")
            if groups:
                draw_metric(axes, groups, x_mode, colors)
            else:
                axes.text(0.5, 0.5, "no run has this series", ha="center", va="center",
                          transform=axes.transAxes)
    figure.suptitle(f"{dataset}: mean ± std over runs")
    figure.tight_layout()
    return figure


def client_figure(dataset: str, runs_by_algorithm: dict[str, list[RunResult]]) -> Figure | None:
    """Box plots of the clients' final test accuracies (percent), one per algorithm."""
    names, values = [], []
    for algorithm, runs in runs_by_algorithm.items():
        pooled = [r.final_client_acc for r in runs if r.final_client_acc is not None]
        if pooled:
            data = 100 * np.concatenate(pooled)
            names.append(algorithm)
            values.append(data[np.isfinite(data)])
    if not names:
        return None
    figure = Figure(figsize=(max(5.0, 1.6 * len(names) + 2), 4.2))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    colors = palette(runs_by_algorithm)
    axes.boxplot(values, showfliers=False)
    axes.set_xticks(range(1, len(names) + 1), names)
    for position, data in enumerate(values, start=1):
        # Evenly spread dots (no random jitter: the page is the same every time it is made).
        offsets = np.linspace(-0.15, 0.15, data.size) if data.size > 1 else np.zeros(1)
        axes.scatter(position + offsets, data, s=8, alpha=0.5, color=colors[names[position - 1]])
    axes.set_ylabel("Client test accuracy at the end (%)")
    axes.set_title(f"{dataset}: per-client accuracy at the last evaluation")
    axes.grid(True, axis="y", alpha=0.35)
    figure.tight_layout()
    return figure


def html_table(rows: list[AlgorithmSummary], dataset: str, goal: str, avg_last: int,
               target_acc: float | None) -> str:
    header, cells = summary_cells(rows, avg_last, target_acc)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in cells)
    return (f"<p>{html.escape(table_title(dataset, goal))}</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def configuration(run: RunResult) -> str:
    """A run's stored configuration (every flag) as a collapsible block."""
    state = "finished" if run.finished else "UNFINISHED (interrupted)"
    summary = f"{run.path.name}: {run.algorithm}, run {run.run}"
    if run.is_pfllib_format:
        return (f"<details><summary>{html.escape(summary)}</summary><p class='muted'>PFLlib-format file: "
                f"no configuration stored</p></details>")
    seed = run.attrs.get("seed", "–")
    text = json.dumps(run.config, indent=2, sort_keys=True) if run.config else "(no config attribute)"
    return (f"<details><summary>{html.escape(f'{summary}, seed {seed}, {state}')}</summary>"
            f"<pre>{html.escape(text)}</pre></details>")


def dataset_section(dataset: str, goal: str, rows: list[AlgorithmSummary],
                    by_row: dict[str, list[RunResult]], avg_last: int, target_acc: float | None) -> str:
    """A dataset's table, curves, client accuracies and configurations; ``by_row`` holds the
    runs of each row of the table, under the row's name."""
    parts = [f"<h2>{html.escape(dataset)}</h2>", html_table(rows, dataset, goal, avg_last, target_acc)]
    parts.append(image(png_data_uri(curves_figure(dataset, by_row)),
                       f"{dataset}: accuracy and loss curves"))
    for x_mode, needed in X_SERIES.items():
        lacking = [name for name, runs in by_row.items() if any(r.x_at_evals(x_mode) is None for r in runs)]
        if lacking:
            parts.append(f"<p class='muted'>Not on the {html.escape(X_LABELS[x_mode].lower())} axis (their "
                         f"files have no {needed}, e.g. PFLlib's): {html.escape(', '.join(lacking))}</p>")
    clients = client_figure(dataset, by_row)
    parts.append(image(png_data_uri(clients), f"{dataset}: per-client accuracy") if clients is not None
                 else "<p class='muted'>No run stores per-client accuracies (rs_client_acc).</p>")
    parts.append("<h3>Configurations</h3>")
    parts += [configuration(run) for runs in by_row.values() for run in runs]
    return "\n".join(parts)


def notes_section(rows: list[AlgorithmSummary], avg_last: int, target_acc: float | None) -> str:
    items = [(column_header(c, avg_last, target_acc), c.note) for c in shown_columns(rows)]
    items += list(CURVE_NOTES)
    body = "".join(f"<dt>{html.escape(term)}</dt><dd>{html.escape(text)}</dd>" for term, text in items)
    return f"<h2>How each figure is computed</h2><dl>{body}</dl>"


def render(args) -> str:
    runs, tables = load_tables(args, NotePrinter())
    sections = [dataset_section(dataset, goal, rows, runs[dataset][1], args.last, args.target_acc)
                for dataset, (goal, rows) in tables.items()]
    all_rows = [row for _, rows in tables.values() for row in rows]
    files = sum(len(group) for _, named in runs.values() for group in named.values())
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(args.title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{html.escape(args.title)}</h1><p class='muted'>From {html.escape(str(args.results_dir))}: "
            f"{files} result files.</p>"
            + "\n".join(sections) + notes_section(all_rows, args.last, args.target_acc)
            + "</body></html>\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 on success, 2 on a user-facing error)."""
    args = build_parser().parse_args(argv)

    def body() -> None:
        page = render(args)
        out = Path(args.out) if args.out else Path(args.results_dir) / "report.html"
        write_output(out, page, "--out")
        print(out)

    return one_line_errors(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
