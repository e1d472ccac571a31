"""The PFLlib slides' pFedEff table, with our numbers: MNIST and Fashion-MNIST, each split
IID, Dirichlet 0.75 / 0.5 / 0.25 and pathological (2 labels per client); rows FedAvg, FedPer,
Hermes-50, LotteryFL-75/50/25 and pFedEff-75/50/25; four metrics per cell:

* accuracy: the best sample-weighted test accuracy of the run (``rs_test_acc``: personal models for
  the personalised methods, the global model for FedAvg), as the slides' "Accuracy" rows;
* rounds: the round of that best accuracy (the slides' "Rounds" rows read as "converged by round r"
  out of 200; with few rounds this mostly says whether a method still improves at the end);
* comm. volume: the run's bytes both ways (``rs_bytes_up`` + ``rs_bytes_down``) over FedAvg's in the
  same cell (the slides' "Comm. Vol.": FedPer ≈ 0.09, pFedEff-50 ≈ 0.24, LotteryFL-50 ≈ 0.49);
* rounds to a target: the first round whose evaluation reaches ``--target`` (default 0.95) times
  FedAvg's mean best accuracy in the same cell, the usual "rounds to FedAvg's accuracy" of FL papers
  (a seed that never reaches it is left out and counted: ``12.0 ± 1.0 (2/3)``; ``–``: no seed did).

Every number is the mean ± population std over ``--times`` runs (seeds seed..seed+times-1; the
partition stays, initialisation and batches change).

The slides do not give the model, clients, rounds or lr; defaults here are what a 2-core CPU runs
in about an hour (DNN, 20 clients, 300 training samples each, 20 rounds, lr 0.05, B 10, E 1); the
slides' setting is closer to ``--model CNN --rounds 200 --samples 0``. Hermes and LotteryFL prune
when a client's accuracy passes their threshold; at the slides' "-50"/"-75"/"-25" they stop at that
kept fraction (``-kf``), as pFedEff keeps ``-kf`` of its entries.

Usage (from the repository root)::

    .venv/bin/python experiments/sparse_table.py                       # both datasets, 5 splits, 3 seeds
    .venv/bin/python experiments/sparse_table.py --datasets MNIST --splits iid dir0.5 pat --times 1
    .venv/bin/python experiments/sparse_table.py --only FedAvg pFedEff-50 --model CNN --rounds 200 --samples 0
"""
from __future__ import annotations

import argparse
from pathlib import Path

import h5py
import numpy as np

from common import MNIST_RAW, OUT, add_training_flags, generate_data, mean_std, run_variant, write_table
from flcore.registry import load_all  # importable once common has put system/ on the path
from reporting.results import reach_target

FMNIST_RAW = Path("/usr/share/datasets/fashion-mnist")
DATASETS = {"MNIST": ("generate_MNIST.py", MNIST_RAW), "FMNIST": ("generate_FashionMNIST.py", FMNIST_RAW)}
# split name -> the generator's PFLlib arguments and options
SPLITS: dict[str, list[str]] = {
    "iid": ["iid", "balance", "-"],
    "dir0.75": ["noniid", "-", "dir", "--alpha", "0.75"],
    "dir0.5": ["noniid", "-", "dir", "--alpha", "0.5"],
    "dir0.25": ["noniid", "-", "dir", "--alpha", "0.25"],
    "pat": ["noniid", "-", "pat", "--class-per-client", "2"],
}
# (label, -algo, flags); LotteryFL and Hermes prune from the first round their accuracy allows
ROWS: list[tuple[str, str, list[str]]] = [
    ("FedAvg", "FedAvg", []),
    ("FedPer", "FedPer", []),
    ("Hermes-50", "Hermes", ["-kf", "0.5"]),
    ("LotteryFL-75", "LotteryFL", ["-kf", "0.75"]),
    ("LotteryFL-50", "LotteryFL", ["-kf", "0.5"]),
    ("LotteryFL-25", "LotteryFL", ["-kf", "0.25"]),
    ("pFedEff-75", "pFedEff", ["-kf", "0.75"]),
    ("pFedEff-50", "pFedEff", ["-kf", "0.5"]),
    ("pFedEff-25", "pFedEff", ["-kf", "0.25"]),
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="*", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--splits", nargs="*", default=list(SPLITS), choices=list(SPLITS))
    parser.add_argument("--only", nargs="*", default=None, help="row labels or -algo names (default: all)")
    parser.add_argument("--model", default="DNN", help="-m (default DNN; the slides' scale: CNN)")
    parser.add_argument("--rounds", type=int, default=20, help="communication rounds (-gr)")
    parser.add_argument("--clients", type=int, default=20, help="clients of every split")
    parser.add_argument("--samples", type=int, default=300,
                        help="training samples kept per client (0: all; the generator's --samples-per-client)")
    parser.add_argument("--engine", default="sequential", help="--engine of main.py")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads per run (--num_threads; 1 keeps a loaded machine from spinning)")
    parser.add_argument("--target", type=float, default=0.95,
                        help="rounds to a target: the target is this fraction of FedAvg's mean best accuracy in each cell")
    add_training_flags(parser, lr=0.05, lr_help="client learning rate of every row", batch_size=10)
    args = parser.parse_args()
    if not 0 < args.target <= 1:
        parser.error(f"--target {args.target}: give a fraction of FedAvg's best accuracy in (0, 1]")
    return args


def ensure_data(dataset: str, split: str, args: argparse.Namespace) -> Path:
    """The split's folder under out/data, generated once (the generator skips an unchanged folder)."""
    generator, raw = DATASETS[dataset]
    folder = OUT / "data" / f"{dataset}_{split}_{args.clients}c_{args.samples or 'all'}s"
    if (folder / "config.json").is_file():
        return folder
    if not raw.is_dir():
        raise SystemExit(f"{raw} not found (Fashion-MNIST: apt-get install dataset-fashion-mnist)")
    options = [*SPLITS[split], "--num-clients", str(args.clients), "--raw-dir", str(raw), "--out-dir", str(folder)]
    if args.samples:
        options += ["--samples-per-client", str(args.samples)]
    generate_data(generator, options)
    return folder


def run_numbers(path: Path) -> dict:
    """Best accuracy, its round (``rs_eval_rounds`` of the best evaluation: 0 is the initial model; the first
    best where several tie), the bytes both ways, and the accuracy curve with the round of each evaluation (for
    the rounds to a target)."""
    with h5py.File(path) as f:
        acc = f["rs_test_acc"][()]
        moved = float(f["rs_bytes_up"][()].sum() + f["rs_bytes_down"][()].sum())
        eval_rounds = f["rs_eval_rounds"][()]
    return {"acc": float(acc.max()), "round": float(eval_rounds[int(np.argmax(acc))]), "bytes": moved, "curve": acc,
            "eval_rounds": eval_rounds}


def rounds_to(curve: np.ndarray, eval_rounds: np.ndarray, target: float) -> float | None:
    """The first evaluated round whose accuracy reaches ``target`` (``reach_target``, as summarize.py's
    rounds to a target), None if none does."""
    reached = reach_target(curve, eval_rounds, (), target)
    return None if reached is None else float(reached[0])


def fedavg_reference(cell_runs: dict[str, dict]) -> dict[str, float] | None:
    """What the relative columns of a cell divide by: FedAvg's mean bytes and mean best accuracy
    (None when FedAvg did not run in this cell)."""
    fedavg = cell_runs.get("FedAvg", {})
    if "bytes" not in fedavg:
        return None
    return {"bytes": float(np.mean(fedavg["bytes"])), "acc": float(np.mean(fedavg["acc"]))}


def cell(dataset: str, split: str, args: argparse.Namespace, rows: list[tuple[str, str, list[str]]]) -> dict[str, dict]:
    """Every row's runs in one (dataset, split) cell: label -> {acc, round, bytes: lists} or a note."""
    data = ensure_data(dataset, split, args)
    experiment = f"sparse_table_{args.model}_{args.rounds}r_{args.clients}c_{args.samples or 'all'}s/{dataset}_{split}"
    out: dict[str, dict] = {}
    for label, algo, flags in rows:
        run = run_variant(experiment, label, algo, flags, data, args, args.model, args.rounds,
                          extra=["-jr", "1", "-eg", "1", "--engine", args.engine, "--num_threads", str(args.threads)], quiet=True)
        if isinstance(run, str):
            out[label] = {"note": run}
            continue
        numbers = [run_numbers(path) for path in run.paths]
        out[label] = {key: [n[key] for n in numbers] for key in ("acc", "round", "bytes", "curve", "eval_rounds")}
        print(f"{dataset} {split} {label}: acc {mean_std(out[label]['acc'])}, {run.seconds():.0f} s", flush=True)
    return out


def table_lines(cells: dict[tuple[str, str], dict[str, dict]], rows: list[tuple[str, str, list[str]]],
                args: argparse.Namespace) -> list[str]:
    """The four tables (accuracy, round of the best, communication volume, rounds to the target), a
    column per (dataset, split) of ``cells``, a row per label of ``rows``."""
    columns = [f"{d} {s}" for d in args.datasets for s in args.splits]
    header = ["| method | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    refs = {key: fedavg_reference(runs) for key, runs in cells.items()}
    lines = [f"# The slides' pFedEff table, our numbers: model {args.model}, {args.clients} clients, "
             f"{args.samples or 'all'} training samples each, {args.rounds} rounds, E={args.local_epochs}, "
             f"B={args.batch_size}, lr={args.lr}, seeds {args.seed}..{args.seed + args.times - 1}", ""]
    for title, render in (
            ("Accuracy (best rs_test_acc, %)", lambda e, ref: mean_std(e["acc"])),
            ("Round of the best accuracy", lambda e, ref: mean_std(e["round"], scale=1, digits=1)),
            ("Communication volume relative to FedAvg (bytes both ways)",
             lambda e, ref: "–" if ref is None else mean_std([b / ref["bytes"] for b in e["bytes"]], scale=1, digits=4)),
            (f"Rounds to {args.target:g} of FedAvg's mean best accuracy (first round at or above it)",
             lambda e, ref: "–" if ref is None else mean_std(
                 [rounds_to(c, r, args.target * ref["acc"]) for c, r in zip(e["curve"], e["eval_rounds"])],
                 scale=1, digits=1))):
        lines += [f"## {title}", "", *header]
        for label, _, _ in rows:
            cells_text = []
            for d in args.datasets:
                for s in args.splits:
                    entry = cells[(d, s)][label]
                    cells_text.append(entry["note"] if "note" in entry else render(entry, refs[(d, s)]))
            lines.append(f"| {label} | " + " | ".join(cells_text) + " |")
        lines.append("")
    return lines


def main_script() -> None:
    args = parse_args()
    load_all()
    rows = [row for row in ROWS if args.only is None or row[0] in args.only or row[1] in args.only]
    cells = {(d, s): cell(d, s, args, rows) for d in args.datasets for s in args.splits}
    lines = table_lines(cells, rows, args)
    write_table(f"sparse_table_{args.model}_{args.rounds}r", lines, [r[0] for r in rows] if args.only else ())  # --only keeps the others


if __name__ == "__main__":
    main_script()
