"""Directional results for FAIR and FLChain, in one small setting: MNIST, Dirichlet 0.1,
20 clients with 300 training samples each, the DNN, E = 1, B = 10, lr 0.05 (the defaults fit a
loaded 2-core CPU; say so when reporting).

``--part fair``: FAIR (``-algo FAIR``) against the baselines that spend the same budget per round
on the same seeded costs: random order (``--select budget_uniform``) and AdaFL's attention order
(``--select budget_adafl``), both with FedAvg; on clean data and with ``--flip`` of the clients
flipping their labels (``label_flip``). Columns: final and best accuracy, the budget spent over the
run (``rs_budget_spent``), the uploads the server bought and how many of them were attackers'
(``rs_attack_uploads``). ``--public_data F`` holds a fraction F of the training pool out as the
server's public data for every row (so all rows train on the same client data) and adds FAIR with
learned aggregation weights (``--fair_aggregation learned``, the journal version's, which needs
it); its table is ``out/trust_fair_public.md``.

``--part flchain``: FedAvg, FLChain with every edge node honest and FLChain with one malicious
node of five (``--flchain_malicious 1``, outvoted by the quorum). Half the clients
train each round (``-jr 0.5``).
Columns: final and best accuracy, the largest difference of the accuracy curve from FedAvg's of
the same seed (0: the committed models are FedAvg's), the nodes outvoted over the run, and the
virtual seconds the run took (FLChain's consensus and blocks are on the clock).

Usage (from the repository root)::

    nice -n 10 .venv/bin/python experiments/trust_directional.py --part fair --times 3
    nice -n 10 .venv/bin/python experiments/trust_directional.py --part fair --times 3 --public_data 0.05
    nice -n 10 .venv/bin/python experiments/trust_directional.py --part fair --times 3 --public_data 0.05 \
        --data experiments/out/data/FashionMNIST_dir0.1_20c_300s   # generated with dataset/generate_FashionMNIST.py
    nice -n 10 .venv/bin/python experiments/trust_directional.py --part flchain --times 3
"""
from __future__ import annotations

import argparse
from pathlib import Path

import h5py
import numpy as np

from common import MNIST_RAW, OUT, Run, add_only_and_data_flags, add_training_flags, generate_data, mean_std, \
    run_variant, write_table
from flcore.registry import load_all  # importable once common has put system/ on the path

EXTRA = ["--engine", "sequential", "--num_threads", "1"]


def fair_rows(budget: float, flip: float, public: str | None = None) -> list[tuple[str, str, list[str]]]:
    """(label, -algo, flags): FAIR and the two same-budget baselines, clean then with label flippers;
    with ``public`` (a --public_data fraction) every row holds it out and FAIR's learned weights join."""
    rows = []
    for poison, attack in (("clean", []), (f"{flip:g} label flip",
                                            ["--attack", "label_flip", "--attack_fraction", str(flip)])):
        spend = ["--budget", str(budget), *attack, *(["--public_data", public, "--public_data_withhold", "True"] if public else [])]
        rows += [(f"FAIR, {poison}", "FAIR", spend),
                 *([(f"FAIR learned, {poison}", "FAIR", ["--fair_aggregation", "learned", *spend])] if public else []),
                 (f"random, {poison}", "FedAvg", ["--select", "budget_uniform", *spend]),
                 (f"AdaFL order, {poison}", "FedAvg", ["--select", "budget_adafl", *spend])]
    return rows


FLCHAIN_ROWS = [("FedAvg", "FedAvg", []), ("FLChain, honest", "FLChain", ["--flchain_nodes", "5"]),
                ("FLChain, 1 malicious of 5", "FLChain", ["--flchain_nodes", "5", "--flchain_malicious", "1"])]


def series(path: Path, name: str) -> np.ndarray:
    """One ``rs_*`` series of a results file (empty when the run did not record it)."""
    with h5py.File(path, "r") as f:
        return np.asarray(f[name], dtype=float) if name in f else np.zeros(0)


def fair_cells(run: Run) -> list[str]:
    """Final and best accuracy (%), budget spent, uploads bought and attackers' uploads, over the seeds."""
    acc = [series(p, "rs_test_acc") for p in run.paths]
    return [mean_std([a[-1] for a in acc]), mean_std([a.max() for a in acc]),
            *(mean_std([float(np.nansum(series(p, name))) for p in run.paths], scale=1, digits=1)
              for name in ("rs_budget_spent", "rs_clients_per_round", "rs_attack_uploads"))]


def flchain_cells(run: Run, fedavg: Run | None) -> list[str]:
    """Final and best accuracy (%), the largest |accuracy − FedAvg's| of the same seed (percentage
    points), nodes outvoted and the virtual seconds of the run, over the seeds."""
    acc = [series(p, "rs_test_acc") for p in run.paths]
    gaps = [None] * len(acc)
    if fedavg is not None and len(fedavg.paths) == len(acc):
        gaps = [float(np.max(np.abs(a - series(q, "rs_test_acc")))) for a, q in zip(acc, fedavg.paths)]
    return [mean_std([a[-1] for a in acc]), mean_std([a.max() for a in acc]), mean_std(gaps, digits=4),
            mean_std([float(series(p, "rs_outvoted_nodes").sum()) for p in run.paths], scale=1, digits=0),
            mean_std([float(series(p, "rs_virtual_time")[-1]) for p in run.paths], scale=1, digits=1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["fair", "flchain"], required=True)
    parser.add_argument("--rounds", type=int, default=20, help="global rounds")
    parser.add_argument("--budget", type=float, default=10.0, help="fair: budget per round (costs uniform in [1, 5])")
    parser.add_argument("--flip", type=float, default=0.3, help="fair: share of label-flipping clients")
    parser.add_argument("--public_data", default=None,
                        help="fair: a fraction of the training pool held out as public data for every row; adds "
                             "FAIR with learned aggregation weights")
    parser.add_argument("--model", default="DNN", help="-m")
    add_training_flags(parser, lr=0.05, lr_help="client learning rate", batch_size=10)
    add_only_and_data_flags(parser, "row labels to run")
    args = parser.parse_args()
    load_all()
    data = args.data
    if data is None:
        data = OUT / "data" / "MNIST_dir0.1_20c_300s"
        generate_data("generate_MNIST.py", ["noniid", "-", "dir", "--alpha", "0.1", "--num-clients", "20",
                                            "--samples-per-client", "300", "--raw-dir", str(MNIST_RAW),
                                            "--out-dir", str(data)])
    public = args.public_data if args.part == "fair" else None
    if args.part == "fair":
        rows, header = fair_rows(args.budget, args.flip, public), ["final acc (%)", "best acc (%)", "budget spent",
                                                           "uploads bought", "attackers' uploads"]
    else:
        rows, header = FLCHAIN_ROWS, ["final acc (%)", "best acc (%)", "max |acc − FedAvg| (pp)", "nodes outvoted",
                                      "virtual s"]
    # another dataset (--data) gets its own results and table, so it never empties the default's
    experiment = (f"trust_{args.part}" + ("_public" if public else "")
                  + ("" if args.data is None else f"_{args.data.name}"))
    setting = "MNIST Dir 0.1, 20 clients x 300 samples" if args.data is None else str(args.data.name)
    lines = [f"# {args.part}: {setting}, {args.model}, {args.rounds} rounds, "
             f"E = {args.local_epochs}, B = {args.batch_size}, lr {args.lr}, seeds {args.seed}..{args.seed + args.times - 1}"
             + (f", public data {public} of the training pool" if public else ""),
             "", "| method | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
    fedavg = None
    for label, algo, flags in rows:
        if args.only and label not in args.only:
            continue
        extra = [*EXTRA, "-jr", "0.5"] if args.part == "flchain" else EXTRA
        run = run_variant(experiment, label, algo, flags, data, args, args.model, args.rounds, extra,
                          quiet=True)
        if isinstance(run, str):
            lines.append(f"| {label} | {run} |")
            continue
        if label == "FedAvg":
            fedavg = run
        cells = fair_cells(run) if args.part == "fair" else flchain_cells(run, fedavg)
        lines.append(f"| {label} | " + " | ".join(cells) + f" |  <!-- {run.seconds():.0f} s -->")
        print(lines[-1], flush=True)
    write_table(experiment, lines, args.only or ())  # rows run with --only keep the others'


if __name__ == "__main__":
    main()
