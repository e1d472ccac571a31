"""Sageflow (Park et al., NeurIPS 2021) on MNIST in the official code's setting, and the directional
comparisons of issue 27.

Setting (savertm/Sageflow's ``scripts/Sageflow_both.sh``): 100 clients, McMahan's shard partition
(2 label shards each), the standard MNIST test set (``--test-split global``), 20% of the clients
selected each round, 1,000 public samples held by the server (``--public_data 1000/60000`` of the
training pool, removed from the clients), B = 10, stragglers with delays uniform in {0, 1, 2}
rounds, E_th = 1, δ = 1, λ = 0.5, the official γ halving every 15 rounds.

``--setting``:

* ``official``: FedAvg and Sageflow with 20% attackers re-drawn every round, sign flip with
  s = ``--attack_scale`` (the official script's 0.1), stragglers S = 2: the side-by-side with the
  official code (experiments/RESULTS.md). A third row, Sageflow with E_th = inf and δ = 0, is what
  the official code runs as "Fedavg" (its ``Sag()`` groups plain averages by staleness too).
* ``stragglers``: stragglers only (S = 2): Sageflow, FedAsync (polynomial, a = 0.5, α = 0.8) and
  FedAvg ignoring stragglers.
* ``sign_flip``: 20% attackers, sign flip s = 10, no stragglers: FedAvg, Sageflow and the median.

Differences from the official code, on purpose or forced (also in RESULTS.md):

* local training is plain SGD: the platform's clients have no momentum. The default lr 0.1 is the
  step size lr/(1 − β) that lr 0.01 with momentum β = 0.9 settles to;
* the model is the platform's ``CNN`` (PFLlib's FedAvgCNN, FC 512) rather than the official
  ``CNNMnist`` (padded convolutions, FC 1024);
* our ``sign_flip`` flips the update, u ← −s·u; the official one flips the weights, w ← −s·w;
* clients train on all of their ~590 samples (the official code keeps 20% of them aside);
* every delay is drawn from the seed and a client with an upload in flight may be selected again.

Usage (from the repository root; E and rounds are reduced on a small CPU, say so when reporting)::

    nice -n 10 .venv/bin/python experiments/sageflow_mnist.py --setting official --rounds 10 --local_epochs 1 --times 1
    nice -n 10 .venv/bin/python experiments/sageflow_mnist.py --setting stragglers --rounds 20 --times 3
"""
from __future__ import annotations

import argparse
from pathlib import Path

import h5py
import numpy as np

from common import MNIST_RAW, OUT, add_only_and_data_flags, add_training_flags, generate_data, run_variant, write_table
from flcore.registry import load_all  # importable once common has put system/ on the path

PUBLIC = ["--public_data", str(1000 / 60000)]
SAGEFLOW = ["--sageflow_eth", "1", "--sageflow_delta", "1", "--sageflow_lambda", "0.5", "--sageflow_gamma", "1",
            "--sageflow_gamma_halving", "15"]
STRAGGLERS = ["--straggler_delay", "2"]


def attack(scale: float) -> list[str]:
    return ["--attack", "sign_flip", "--attack_fraction", "0.2", "--attack_resample", "True",
            "--attack_scale", str(scale)]


def variants(setting: str, scale: float) -> list[tuple[str, str, list[str]]]:
    """(label, -algo, flags) of the setting's rows."""
    if setting == "official":
        both = [*STRAGGLERS, *attack(scale)]
        # the official code's "Fedavg" rule still groups by staleness (its Sag() on plain averages):
        # that is Sageflow with no filter and δ = 0
        plain = [*SAGEFLOW, "--sageflow_eth", "inf", "--sageflow_delta", "0"]
        return [("FedAvg", "FedAvg", both), ("Sageflow", "Sageflow", [*both, *SAGEFLOW]),
                ("Sageflow E_th=inf, delta=0", "Sageflow", [*both, *plain])]
    if setting == "stragglers":
        return [("Sageflow", "Sageflow", [*STRAGGLERS, *SAGEFLOW]),
                ("FedAsync", "FedAsync", [*STRAGGLERS, "--staleness_fn", "polynomial", "--staleness_a", "0.5",
                                          "--async_alpha", "0.8"]),
                ("FedAvg ignoring stragglers", "FedAvg", [*STRAGGLERS, "--straggler_policy", "ignore"])]
    return [("FedAvg", "FedAvg", attack(10.0)), ("Sageflow", "Sageflow", [*attack(10.0), *SAGEFLOW]),
            ("median", "FedAvg", [*attack(10.0), "--robust", "median"])]


def curves(paths: list[Path]) -> np.ndarray:
    """rs_test_acc of every repeat (rows), NaN after a run that stopped early."""
    rows = []
    for path in paths:
        with h5py.File(path, "r") as f:
            rows.append(np.asarray(f["rs_test_acc"], dtype=float))
    width = max(len(r) for r in rows)
    return np.stack([np.pad(r, (0, width - len(r)), constant_values=np.nan) for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=["official", "stragglers", "sign_flip"], default="official")
    parser.add_argument("--rounds", type=int, default=150, help="global rounds (the official MNIST runs: 150)")
    parser.add_argument("--attack_scale", type=float, default=0.1, help="official setting: sign flip s")
    parser.add_argument("--raw_dir", type=Path, default=MNIST_RAW, help="MNIST's four IDX files")
    add_training_flags(parser, lr=0.1, lr_help="local lr (plain SGD; see the module docstring)", batch_size=10)
    add_only_and_data_flags(parser, "row labels to run")
    args = parser.parse_args()
    load_all()
    data = args.data
    if data is None:
        data = OUT / "data" / "MNIST_shard100_global"
        generate_data("generate_MNIST.py", ["noniid", "-", "shard", "--num-clients", "100", "--test-split", "global",
                                            "--raw-dir", str(args.raw_dir), "--out-dir", str(data)])
    name = f"sageflow_{args.setting}"
    lines = [f"# Sageflow on MNIST, setting {args.setting}: {args.rounds} rounds, E = {args.local_epochs}, "
             f"B = {args.batch_size}, lr {args.lr}, {args.times} seed(s) from {args.seed}",
             "", "| method | " + " | ".join(f"round {r}" for r in range(args.rounds + 1)) + " |",
             "|---|" + "---|" * (args.rounds + 1)]
    for label, algo, flags in variants(args.setting, args.attack_scale):
        if args.only and label not in args.only:
            continue
        run = run_variant(name, label, algo, ["-jr", "0.2", *PUBLIC, *flags], data, args, "CNN", args.rounds)
        if isinstance(run, str):
            lines.append(f"| {label} | {run} |")
            continue
        acc = 100 * curves(run.paths)
        cells = [f"{m:.2f} ± {s:.2f}" if args.times > 1 else f"{m:.2f}"
                 for m, s in zip(np.nanmean(acc, 0), np.nanstd(acc, 0))]
        lines.append(f"| {label} | " + " | ".join(cells) + f" |  <!-- {run.seconds():.0f} s -->")
    write_table(name, lines)


if __name__ == "__main__":
    main()
