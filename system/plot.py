"""Plot the results of federated-learning runs: one PNG per metric, one line per algorithm.

Run from ``system/``, after ``python main.py -data MNIST -algo FedAvg -t 3`` and friends::

    python plot.py -data MNIST -algo FedAvg FedProx
    python plot.py -data MNIST -algo FedAvg FedProx --metric acc loss time --smooth 5 --x time
    python plot.py -data ../dataset/MNIST -algo FedAvg Ditto --x bytes

Every run (``-t`` repeat) of an algorithm found as ``<results>/<dataset>_<algo>_<goal>_<run>.h5``
is averaged into a mean line with a shaded ±std band (population std); ``<dataset>`` is the
last part of ``-data``, as main.py names the files. Runs of different lengths are cut to the
shortest, with a note; runs of one algorithm made with different settings (their stored flags
differ) are drawn as separate lines, with a note naming the flags. PNGs go next to the results
unless ``--out`` is given (``MNIST_test_acc.png``, ``MNIST_test_loss.png``, ...); their paths
are printed, followed by a summary table (runs, best accuracy mean ± std as in PFLlib, final
accuracy).

A personalised algorithm's accuracy (each client's own model on its own test data) is labelled
so, with its shared model's accuracy (``rs_test_acc_global``) dashed in the same colour. Round
axes have whole-number ticks; ``--metric time`` plots the time of training round ``t`` at round
``t + 1``, the round at which the accuracy curve shows the model it produced.

Files written by PFLlib itself (only ``rs_test_acc``, ``rs_test_auc``, ``rs_train_loss``) are
plotted too, with one evaluation per round. Errors are one line on stderr and exit status 2.

A sweep's attack × defence grid (``reporting/grid.py``): heatmaps of the final accuracy and the
backdoor's attack success rate over two flags of the runs whose goal is ``-go`` or a sweep setting
of it (``-go-...``)::

    python sweep.py -data MNIST -m CNN -algo FedAvg --attack_fraction 0.2 -go grid \\
        --grid attack=sign_flip,ipm,backdoor robust=median,multi_krum,clip+multi_krum -t 3
    python plot.py -data MNIST -algo FedAvg -go grid --grid attack,robust

writes ``MNIST_grid_FedAvg_grid_acc.png`` and ``..._grid_asr.png`` and prints both tables. The two
flags may be spelled as sweep.py takes them (``--grid lr,robust``, ``-lr``, ``local_learning_rate``).

A repeat whose file is unreadable (corrupt or truncated) is left out with a note, as summarize.py
and report.py do; an algorithm none of whose files can be read is an error.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from reporting.cli import NotePrinter, add_results_dir_flag, one_line_errors, positive_int
from reporting.grid import (GRID_METRICS, build_grid, cells_of, draw_grid, format_grid, grid_file_name, in_sweep,
                            parse_grid_flags)
from reporting.loading import Note, PlotError, RunResult, find_all_runs, load_algorithm_runs
from reporting.names import (algorithms_with_results, creation_command, dataset_name,
                             search_pattern)
from reporting.plots import plot_file_name, plot_metric
from reporting.series import METRICS, X_MODES, metric_groups
from reporting.settings import split_by_setting
from reporting.stats import summarize_runs, unknown_personalization
from reporting.tables import format_summary_table
from cli.flags import generic_parser, pfllib_algorithm_actions

PROG = "plot.py"


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser (PFLlib-style short flags for dataset, algorithm and goal)."""
    parser = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        description="Plot mean ± std curves of FL runs from the .h5 result files.")
    parser.add_argument("-data", "--dataset", required=True,
                        help="dataset name or folder, as given to main.py")
    parser.add_argument("-algo", "--algorithms", required=True, nargs="+", metavar="ALGO",
                        help="one or more algorithm names, as given to main.py")
    parser.add_argument("-go", "--goal", default="test", help="goal string of the runs (default: test)")
    add_results_dir_flag(parser)
    parser.add_argument("--out", default=None,
                        help="folder for the PNG files (default: the results folder)")
    parser.add_argument("--metric", nargs="+", choices=list(METRICS), default=["acc", "loss"],
                        help="metrics to plot, one PNG each (default: acc loss); 'time' is the "
                             "wall-clock time per round")
    parser.add_argument("--smooth", type=positive_int, default=1, metavar="K",
                        help="trailing moving average over K points before averaging runs "
                             "(default: 1, no smoothing)")
    parser.add_argument("--x", dest="x_mode", choices=list(X_MODES), default="rounds",
                        help="x-axis of the per-evaluation curves: communication rounds, elapsed "
                             "wall-clock seconds (needs rs_round_time), uploaded megabytes (needs "
                             "rs_bytes_up) or the virtual clock's seconds (rs_virtual_time); "
                             "default: rounds")
    parser.add_argument("--grid", default=None, metavar="ROWS,COLUMNS",
                        help="instead of curves: heatmaps of the final accuracy and attack success rate over "
                             "two flags (e.g. attack,robust) of the runs whose goal is -go or -go-... "
                             "(a sweep's settings)")
    return parser


def load_all(results_dir: Path, dataset: str, algorithms: Sequence[str], goal: str,
             note: Note) -> dict[str, list[RunResult]]:
    """Runs of every requested algorithm, by line name (an algorithm whose runs have different
    settings gives one line per setting); a PlotError naming what is missing otherwise.
    ``dataset`` as the user gave it (a name or a folder)."""
    name = dataset_name(dataset)
    if not results_dir.is_dir():
        raise PlotError(f"results folder {results_dir} does not exist; pass --results_dir or "
                        f"{creation_command(dataset, algorithms[0], goal)}")
    loaded = {algo: load_algorithm_runs(results_dir, name, algo, goal, note=note) for algo in algorithms}
    missing = [algo for algo, runs in loaded.items() if not runs]
    if missing:
        found = [a for a in algorithms_with_results(results_dir, name, goal) if a not in missing]
        hint = f" (results exist for: {', '.join(found)})" if found else ""
        what = f"algorithm{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
        pattern = missing[0] if len(missing) == 1 else "{" + ",".join(missing) + "}"
        raise PlotError(f"no results for {what} on {name}: searched "
                        f"{search_pattern(results_dir, name, pattern, goal)}{hint}; "
                        f"{creation_command(dataset, missing[0], goal)}")
    lines: dict[str, list[RunResult]] = {}
    for algo, runs in loaded.items():
        lines.update(split_by_setting(algo, runs, note, where=f"{name} (goal {goal}): "))
    return lines


def plot_all(loaded: dict[str, list[RunResult]], args: argparse.Namespace, dataset: str,
             out_dir: Path, note: Note) -> list[Path]:
    """One PNG per requested metric; returns the paths written."""
    written: list[Path] = []
    for metric_name in dict.fromkeys(args.metric):
        metric = METRICS[metric_name]
        groups = metric_groups(loaded, metric, x_mode=args.x_mode, smooth=args.smooth, note=note)
        for line, runs in loaded.items():
            if not any(g.algorithm == line for g in groups):
                kind = " (PFLlib-format files)" if all(r.is_pfllib_format for r in runs) else ""
                note(f"{line}: no '{metric.key}' in its files{kind}; left out of the {metric_name} plot")
        if not groups:
            note(f"no algorithm has '{metric.key}'; {metric_name} plot skipped")
            continue
        path = out_dir / plot_file_name(dataset, args.goal, metric_name, args.x_mode)
        written.append(plot_metric(groups, dataset, args.goal, path, x_mode=args.x_mode,
                                   smooth=args.smooth, flag="--out"))
    return written


def stored_flag(name: str, runs: Sequence[RunResult]) -> str:
    """The setting a ``--grid`` name stands for, as the runs store it (``local_learning_rate``):
    the name itself (with dashes or not: ``--local-learning-rate``), else the flag main.py spells
    so among its generic flags and PFLlib's algorithm flags (``lr``, ``-lr``, ``mu``), which
    sweep.py also takes. An algorithm's own short spelling is not known here (reporting does not
    import the federated layers): its long name, which runs store, is."""
    plain = name.lstrip("-").replace("-", "_")
    if any(plain in run.config for run in runs):
        return plain
    spellings = [name] if name.startswith("-") else [f"-{name}", f"--{name}"]
    actions = {spelling: action.dest for action in (*generic_parser()._actions, *pfllib_algorithm_actions())
               for spelling in action.option_strings}
    return next((actions[s] for s in spellings if s in actions), plain)


def plot_grid(args: argparse.Namespace, note: Note) -> list[Path]:
    """The --grid heatmaps of every requested algorithm; prints their tables, returns the paths."""
    row_name, col_name = parse_grid_flags(args.grid)
    results_dir = Path(args.results_dir)
    dataset = dataset_name(args.dataset)
    found = find_all_runs(results_dir, [dataset], args.algorithms, note=note).get(dataset, {})
    out_dir = Path(args.out) if args.out is not None else results_dir
    written = []
    for algo in args.algorithms:
        runs = [run for (name, goal), group in found.items() if name == algo and in_sweep(goal, args.goal)
                for run in group]
        if not runs:
            raise PlotError(f"no results for {algo} on {dataset} with goal {args.goal} or {args.goal}-...: "
                            f"searched {search_pattern(results_dir, dataset, algo, args.goal + '*')}")
        row_flag, col_flag = (stored_flag(name, runs) for name in (row_name, col_name))
        if row_flag == col_flag:
            raise PlotError(f"--grid {args.grid!r}: {row_name} and {col_name} are one flag ({row_flag}); "
                            f"give two different flags as ROWS,COLUMNS")
        cells = cells_of(runs, row_flag, col_flag)
        for metric in GRID_METRICS:
            grid = build_grid(cells, row_flag, col_flag, metric)
            if grid is None:
                note(f"{algo}: no run records {GRID_METRICS[metric][0]}; no {metric} heatmap")
                continue
            title = f"{dataset}, {algo}: {GRID_METRICS[metric][1]} (goal: {args.goal})"
            written.append(draw_grid(grid, title, out_dir / grid_file_name(dataset, args.goal, algo, metric)))
            print(f"{algo}: {format_grid(grid)}\n")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 on success, 2 on a user-facing error)."""
    args = build_parser().parse_args(argv)
    args.algorithms = list(dict.fromkeys(args.algorithms))

    def body() -> None:
        results_dir = Path(args.results_dir)
        note = NotePrinter()
        if args.grid is not None:
            for path in plot_grid(args, note):
                print(path)
            return
        loaded = load_all(results_dir, args.dataset, args.algorithms, args.goal, note)
        dataset = dataset_name(args.dataset)
        out_dir = Path(args.out) if args.out is not None else results_dir
        written = plot_all(loaded, args, dataset, out_dir, note)
        if not written:
            raise PlotError(f"nothing to plot: none of the metrics {', '.join(args.metric)} "
                            f"is in the result files")
        for path in written:
            print(path)
        note(unknown_personalization(loaded))
        print()
        print(format_summary_table([summarize_runs(runs, name=line) for line, runs in loaded.items()],
                                   dataset, args.goal))

    return one_line_errors(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
