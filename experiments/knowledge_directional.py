"""Directional runs of the knowledge-transfer algorithms (FedProto, FD, FedPCL, FedGH, FedPAC,
FML, FedKD) against Local and FedAvg, personalised accuracy, mean ± std over seeds.

Every row runs ``main.main`` ``--times`` times (seeds seed..seed+times-1) on one partition (default:
MNIST, Dirichlet 0.1, 20 clients, generated under ``experiments/out/data``) with the same flags
(PFLlib's defaults: B = 10, E = 1, lr 0.005, every client every round) and each algorithm's PFLlib
defaults, ours where PFLlib's switch the method off (FML: α = 1 trains the personal model alone). FedProto's
nearest-prototype accuracy (``rs_test_acc_proto``) is reported beside its personal-head accuracy.

KT-pFL needs a public dataset held by the server; its rows (``PUBLIC_ROWS``: KT-pFL, Local and FD,
each with ``--public_data 0.02``) withhold the same 2% of the training pool (drawn from ``--seed``)
from the clients in all three, so they compare on the same training rows. They run only when named
in ``--only`` (or with ``--public``).

    python experiments/knowledge_directional.py --rounds 10 --data DIR [--only FedProto FD]
    python experiments/knowledge_directional.py --rounds 50 --data DIR --public

The table is printed and written to ``experiments/out/knowledge_directional.md``.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import h5py
import numpy as np

from common import MNIST_RAW, OUT, add_only_and_data_flags, add_training_flags, generate_data, mean_std, results_folder, \
    run_variant, write_table
from flcore.registry import load_all  # noqa: E402  (common puts system/ on the path)

#: row label -> (algorithm, its flags)
ROWS: dict[str, tuple[str, list[str]]] = {
    "Local": ("Local", []), "FedAvg": ("FedAvg", []),
    "FedProto": ("FedProto", ["-lam", "1.0"]), "FD": ("FD", ["-lam", "1.0"]), "FedPCL": ("FedPCL", ["-tau", "1.0"]),
    "FedGH": ("FedGH", ["-slr", "1.0"]), "FedPAC": ("FedPAC", ["-lam", "1.0"]),
    # FML: the paper's α = β = 0.5 (our default); PFLlib's α = 1, β = 0 make the personal model plain
    # Local training (measured equal to Local to the digit at 10 rounds; docs/results/algorithms.md), i.e. switch FML off.
    # FedKD: the mentee learns at the run's lr, as PFLlib's defaults have it (-mlr = -lr = 0.005).
    "FML": ("FML", ["-al", "0.5", "-bt", "0.5"]), "FedKD": ("FedKD", ["-mlr", "{lr}", "-Ts", "0.95", "-Te", "0.98"]),
}
#: KT-pFL against Local and FD on the same public data: 2% of the training pool, which no client trains on
PUBLIC = ["--public_data", "0.02", "--public_data_withhold", "True"]  # Local's and FD's rows withhold it too
PUBLIC_ROWS: dict[str, tuple[str, list[str]]] = {
    "KT-pFL": ("KT-pFL", PUBLIC), "Local (public 0.02)": ("Local", PUBLIC), "FD (public 0.02)": ("FD", ["-lam", "1.0", *PUBLIC]),
}


def row(label: str, lr: float) -> tuple[str, list[str]]:
    """The algorithm and flags of the row ``label`` (of ROWS or PUBLIC_ROWS) for a run at learning rate ``lr``."""
    algo, flags = {**ROWS, **PUBLIC_ROWS}[label]
    return algo, [flag.format(lr=lr) for flag in flags]


#: evaluations averaged for the "mean of the last" column (a curve that swings between rounds makes
#: its final value a lottery)
TAIL = 10


def curve_stats(paths: list[Path], name: str = "rs_test_acc") -> tuple[list[float | None], ...]:
    """(final, best, mean of the last TAIL) values of the series ``name`` in each results file (None
    where it is missing)."""
    finals, bests, tails = [], [], []
    for path in paths:
        with h5py.File(path, "r") as f:
            values = np.asarray(f[name][()], dtype=float) if name in f else np.zeros(0)
        values = values[np.isfinite(values)]
        finals.append(float(values[-1]) if len(values) else None)
        bests.append(float(values.max()) if len(values) else None)
        tails.append(float(values[-TAIL:].mean()) if len(values) else None)
    return finals, bests, tails


def table_rows(label: str, algo: str, paths: list[Path], times: str) -> list[str]:
    """The table's line(s) for one row's results files (FedProto's nearest-prototype accuracy as a
    second line); ``times`` fills the two time columns."""
    series = [("", "rs_test_acc")] + ([(" (nearest prototype)", "rs_test_acc_proto")] if algo == "FedProto" else [])
    lines = []
    for suffix, name in series:
        numbers = " | ".join(mean_std(column) for column in curve_stats(paths, name))
        lines.append(f"| {label}{suffix} | {numbers} | {len(paths)} | {times if not suffix else ' | '} |")
    return lines


def main_(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_flags(parser, lr=0.005, lr_help="local learning rate (PFLlib's default)", batch_size=10)
    add_only_and_data_flags(parser, f"rows to run (default: {' '.join(ROWS)})")
    parser.add_argument("--rounds", type=int, default=50, help="-gr of every run (50 or more for a directional result)")
    parser.add_argument("--model", default="DNN")
    parser.add_argument("--engine", default="sequential", choices=["sequential", "batched", "threaded", "auto"],
                        help="main's --engine (results agree within float rounding)")
    parser.add_argument("--public", action="store_true", help="run the KT-pFL rows (PUBLIC_ROWS) after the chosen rows")
    parser.add_argument("--tabulate", action="store_true",
                        help="no runs: the table of the results already under out/results/knowledge_directional")
    args = parser.parse_args(argv)
    chosen = list(args.only or ROWS)
    unknown = [label for label in chosen if label not in ROWS and label not in PUBLIC_ROWS]
    if unknown:
        parser.error(f"unknown row(s) {', '.join(map(repr, unknown))}; rows: {', '.join(map(repr, [*ROWS, *PUBLIC_ROWS]))}")
    chosen += [label for label in PUBLIC_ROWS if args.public and label not in chosen]
    load_all()
    data = args.data
    if data is None and not args.tabulate:
        data = OUT / "data" / "MNIST-dir0.1-20"
        generate_data("generate_MNIST.py", ["noniid", "-", "dir", "--alpha", "0.1", "--num-clients", "20",
                                            "--raw-dir", str(MNIST_RAW), "--out-dir", str(data)])
    lines = [f"| algorithm | final personalised acc. (%) | best (%) | mean of the last {TAIL} (%) | runs | s/run | "
             "CPU s/run |", "|---|---|---|---|---|---|---|"]
    for label in chosen:
        algo, flags = row(label, args.lr)
        if args.tabulate:
            paths = sorted(results_folder("knowledge_directional", label).glob("*.h5"))
            lines += table_rows(label, algo, paths, " | ") if paths else [f"| {label} | no results | | | | | |"]
            continue
        cpu = time.process_time()  # this process's CPU seconds: what a loaded machine's wall clock hides
        run = run_variant("knowledge_directional", label, algo, flags, Path(data).resolve(), args, args.model,
                          args.rounds, extra=["--engine", args.engine, "--num_threads", "1"], quiet=True)
        if isinstance(run, str):
            lines.append(f"| {label} | {run} | | | | | |")
            continue
        runs = max(len(run.paths), 1)
        lines += table_rows(label, algo, run.paths, f"{run.seconds() / runs:.0f} | {(time.process_time() - cpu) / runs:.0f}")
        print("\n".join(lines[-2 if algo == "FedProto" else -1:]), flush=True)
    name = "_".join(["knowledge_directional", *(args.only or []), *(["public"] if args.public else []),
                     *(["tabulated"] if args.tabulate else [])])
    write_table("".join(ch if ch.isalnum() else "_" for ch in name), lines)


if __name__ == "__main__":
    main_()
