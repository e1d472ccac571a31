"""Summarise every run of a results folder: one table per dataset, printed and written as CSV and Markdown.

Run from ``system/``::

    python summarize.py                                   # every .h5 file in ../results
    python summarize.py -data MNIST -algo FedAvg Ditto --last 20 --target_acc 0.9
    python summarize.py --results_dir /data/runs --csv runs.csv --md runs.md

One row per (algorithm, goal): the ``-t`` repeats found as ``<dataset>_<algo>_<goal>_<run>.h5``
are combined into mean ± population std. The columns (best and final accuracy, means over the
last 10% of the evaluations and over the last ``--last N``, rounds and uploaded megabytes to
``--target_acc``, seconds per round, peak RSS/GPU memory, the shared model's accuracy next to the
personal models' for personalised algorithms, and the final DP ε, virtual time and new-client
accuracy when the files have them) are defined once in :mod:`reporting.stats`
(``SUMMARY_COLUMNS``); the Markdown file states under each table how each was computed. Runs
interrupted before their end (``finished = False``) are counted in an ``unfinished`` column.
Runs of one algorithm and goal made with different settings (their stored flags differ) are
split into one row per setting, named by the differing flags, with a note; every ``.h5`` file
left out (a name that is not a result file's, an unreadable file) is listed on stderr.
PFLlib's own files (only ``rs_test_acc``, ``rs_test_auc``, ``rs_train_loss``) are read too; what
they lack is shown as "–".

Outputs: ``--csv`` (default ``<results_dir>/summary.csv``, one line per row, numbers as stored:
accuracies are fractions) and ``--md`` (default ``<results_dir>/summary.md``); ``--csv ''`` or
``--md ''`` writes none. Errors are one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path
from typing import Sequence

from reporting.cli import NotePrinter, add_results_dir_flag, one_line_errors, positive_int, write_output
from reporting.loading import Note, PlotError, RunResult, find_all_runs
from reporting.names import dataset_name
from reporting.settings import split_by_setting
from reporting.stats import AlgorithmSummary, summarize_runs, unknown_personalization
from reporting.tables import format_summary_markdown, format_summary_table, summary_records
from cli.flags import ExactParser

PROG = "summarize.py"
#: Per dataset: (the goal its title shows, row name -> the runs of that row).
Rows = dict[str, tuple[str, dict[str, list[RunResult]]]]
#: Per dataset: (the goal its title shows, the summary rows).
Tables = dict[str, tuple[str, list[AlgorithmSummary]]]


def fraction(text: str) -> float:
    """argparse type: an accuracy in [0, 1] (a percentage such as 90 is refused, not guessed)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected an accuracy between 0 and 1 (0.9 for 90%), got {value}")
    return value


def add_selection_flags(parser: argparse.ArgumentParser) -> None:
    """The flags summarize.py and report.py share: which runs, which figures."""
    add_results_dir_flag(parser)
    parser.add_argument("-data", "--dataset", nargs="+", default=None, metavar="DATA",
                        help="only these datasets, by name or folder (default: all)")
    parser.add_argument("-algo", "--algorithm", nargs="+", default=None, metavar="ALGO",
                        help="only these algorithms (default: all)")
    parser.add_argument("-go", "--goal", nargs="+", default=None, metavar="GOAL",
                        help="only these goals (default: all)")
    parser.add_argument("--last", type=positive_int, default=10, metavar="N",
                        help="N of the 'mean over the last N evaluations' column (default: 10)")
    parser.add_argument("--target_acc", "--target-acc", type=fraction, default=None, metavar="ACC",
                        help="accuracy (0..1) for the rounds and uploaded MB to reach it (default: none)")


def build_parser() -> argparse.ArgumentParser:
    parser = ExactParser(prog=PROG, description=__doc__.split("\n\n", 1)[0])
    add_selection_flags(parser)
    parser.add_argument("--csv", default=None, metavar="FILE",
                        help="CSV output (default: <results_dir>/summary.csv; '' for none)")
    parser.add_argument("--md", default=None, metavar="FILE",
                        help="Markdown output (default: <results_dir>/summary.md; '' for none)")
    return parser


def table_rows(runs_by_dataset: dict[str, dict[tuple[str, str], list[RunResult]]], note: Note) -> Rows:
    """The rows of each dataset's table: one per (algorithm, goal), named ``FedAvg [goal]`` when
    the dataset has runs of several goals, and split by setting (:func:`split_by_setting`)."""
    tables: Rows = {}
    for dataset, groups in runs_by_dataset.items():
        goals = sorted({goal for _, goal in groups})
        rows: dict[str, list[RunResult]] = {}
        for (algorithm, goal), runs in sorted(groups.items()):
            name = algorithm if len(goals) == 1 else f"{algorithm} [{goal}]"
            rows.update(split_by_setting(name, runs, note, where=f"{dataset} (goal {goal}): "))
        tables[dataset] = (goals[0] if len(goals) == 1 else "several, in brackets", rows)
    return tables


def load_tables(args: argparse.Namespace, note: Note) -> tuple[Rows, Tables]:
    """The runs the flags select, by table row, and the summary tables; a PlotError when there
    are none. What is left out, split or unknown is told to ``note``."""
    datasets = [dataset_name(d) for d in args.dataset] if args.dataset else None
    runs = find_all_runs(args.results_dir, datasets, args.algorithm, args.goal, note=note)
    if not runs:
        wanted = [f"{name} {' '.join(values)}" for name, values in
                  (("-data", datasets), ("-algo", args.algorithm), ("-go", args.goal)) if values]
        raise PlotError(f"no result files in {args.results_dir}"
                        + (f" for {', '.join(wanted)}" if wanted else "")
                        + "; run main.py first or pass --results_dir")
    rows = table_rows(runs, note)
    note(unknown_personalization({f"{name} ({dataset})": group for dataset, (_, named) in rows.items()
                                  for name, group in named.items()}))
    tables = {dataset: (goal, [summarize_runs(group, args.last, args.target_acc, name=name)
                               for name, group in named.items()])
              for dataset, (goal, named) in rows.items()}
    return rows, tables


def csv_text(tables: Tables) -> str:
    records = [record for _, rows in tables.values() for record in summary_records(rows)]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(records[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return out.getvalue()


def markdown_text(tables: Tables, avg_last: int, target_acc: float | None) -> str:
    return "\n\n".join(format_summary_markdown(rows, dataset, goal, avg_last, target_acc)
                        for dataset, (goal, rows) in tables.items()) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 on success, 2 on a user-facing error)."""
    args = build_parser().parse_args(argv)

    def body() -> None:
        _, tables = load_tables(args, NotePrinter())
        for dataset, (goal, rows) in tables.items():
            print(format_summary_table(rows, dataset, goal, args.last, args.target_acc))
            print()
        results_dir = Path(args.results_dir)
        outputs = [("--csv", args.csv, results_dir / "summary.csv", csv_text(tables)),
                   ("--md", args.md, results_dir / "summary.md", markdown_text(tables, args.last, args.target_acc))]
        for flag, chosen, default, text in outputs:
            if chosen != "":
                path = Path(chosen) if chosen is not None else default
                write_output(path, text, flag)
                print(f"wrote {path}")

    return one_line_errors(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
