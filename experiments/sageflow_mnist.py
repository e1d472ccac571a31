"""Sageflow (Park et al., NeurIPS 2021) on MNIST in the official code's setting, and the directional
comparisons of robust and asynchronous aggregation around it.

Setting (savertm/Sageflow's ``scripts/Sageflow_both.sh``): 100 clients, McMahan's shard partition
(2 label shards each), the standard MNIST test set (``--test-split global``), 20% of the clients
selected each round, 1,000 public samples held by the server (``--public_data 1000/60000`` of the
training pool, removed from the clients), B = 10, stragglers with delays uniform in {0, 1, 2}
rounds, E_th = 1, δ = 1, λ = 0.5, the official γ halving every 15 rounds (20 on Fashion-MNIST,
``--dataset FashionMNIST``).

``--setting``:

* ``official``: FedAvg and Sageflow with 20% attackers re-drawn every round, sign flip with
  s = ``--attack_scale`` (the official script's 0.1), stragglers S = 2: the side-by-side with the
  official code (docs/results/robustness.md). A third row, Sageflow with E_th = inf and δ = 0, is what
  the official code runs as "Fedavg" (its ``Sag()`` groups plain averages by staleness too).
* ``stragglers``: stragglers only (S = 2): Sageflow, FedAsync (polynomial, a = 0.5, α = 0.8, the
  Sageflow paper's baseline, staleness in rounds, workers' regulariser ρ = 0.005 as Xie et al.'s
  CIFAR-10 runs; and again with staleness in server updates,
  ``--staleness_unit upload``, as Xie et al.'s Algorithm 1 counts it), FedAvg ignoring stragglers and FedAvg waiting for all (``--straggler_wait 1``: every round lasts
  until its latest upload, 1 + max d periods of the virtual clock); the table adds the virtual time
  to ``--target`` accuracy.
* ``sign_flip``: 20% attackers, sign flip s = 10, no stragglers: FedAvg, Sageflow, the median,
  Multi-Krum and RFA (the Sageflow paper's baselines).
* ``backdoor``: 20% attackers with Sageflow's pixel backdoor (12 pixels, target 2, 3 of 10 samples
  per batch, update ×10 from ``--backdoor_from_round``), no stragglers: FedAvg, Sageflow and
  norm clipping; the table adds the attack success rate (``rs_backdoor_asr``).

A seed whose training diverges (FedAvg under sign flip) is a result: its curve is kept up to the
divergence and the row says ``diverged at round r in k/n seeds`` (``common.run_variant``).

Differences from the official code, on purpose or forced (also in docs/results/robustness.md):

* local training is plain SGD by default, at lr 0.1: the step size lr/(1 − β) that lr 0.01 with
  momentum β = 0.9 settles to. ``--local_momentum 0.9 --lr 0.01`` trains with the official optimiser
  (SGD, momentum 0.9, a new optimiser per client and round); its results go to folders of their own;
* the model is the platform's ``CNN`` (PFLlib's FedAvgCNN, FC 512) rather than the official
  ``CNNMnist`` (padded convolutions, FC 1024);
* our ``sign_flip`` flips the update, u ← −s·u, by default; the official one flips the weights,
  w ← −s·w, which ``--attack_flip weights`` selects in the ``official`` and ``sign_flip`` settings;
* clients train on all of their ~590 samples (the official code keeps 20% of them aside);
* every delay is drawn from the seed and a client with an upload in flight may be selected again;
* attackers are 20% of all clients, re-drawn every round (0 to 8 in a cohort of 20), where the
  official code draws 4 of each round's 20.

``--protocol official`` removes the last three differences but the data share: the official model
(``-m SageflowCNN``), attackers as a share of each round's drawn clients, chosen before busy ones sit
out as the official code chooses them (``--attack_scope drawn``; formerly ``cohort``, among
those that train), busy clients that sit out a round while their upload is in flight
(``--straggler_busy skip``) and the official delay draw (``--straggler_delays each``: the round's first
three clients get delays 0, 1, 2). Its results go to folders ending ``_official_protocol``.

``--partition official`` removes the data differences too: the official code's clients and public set, drawn
with its generator calls for ``--official_seed`` (checked identical to its ``mnist_noniidcmm`` for seeds
2021-2023), each client's first 80 % of rows for training and the official input normalisation
(:func:`official_shards`, :func:`official_data`); folders end ``_official_partition<seed>``.

Usage (from the repository root; E and rounds are reduced on a small CPU, say so when reporting)::

    nice -n 10 .venv/bin/python experiments/sageflow_mnist.py --setting official --rounds 10 --local_epochs 1 --times 1
    nice -n 10 .venv/bin/python experiments/sageflow_mnist.py --setting sign_flip --rounds 10 --local_epochs 1 --times 3
    nice -n 10 .venv/bin/python experiments/sageflow_mnist.py --setting stragglers --samples 150 --rounds 10 --times 3 --target 0.6
    nice -n 10 .venv/bin/python experiments/sageflow_mnist.py --setting stragglers --samples 150 --rounds 20 --eval_gap 2 --times 3
    nice -n 10 .venv/bin/python experiments/sageflow_mnist.py --setting backdoor --samples 150 --rounds 6 --backdoor_from_round 2
    nice -n 10 .venv/bin/python experiments/sageflow_mnist.py --dataset FashionMNIST --setting sign_flip --samples 150 --rounds 10
    nice -n 10 .venv/bin/python experiments/sageflow_mnist.py --setting stragglers --samples 150 --rounds 10 --local_momentum 0.9 --lr 0.01
    nice -n 10 .venv/bin/python experiments/sageflow_mnist.py --setting stragglers --samples 150 --rounds 40 --local_epochs 5 --gamma_halving 0 --only Sageflow
    nice -n 10 .venv/bin/python experiments/sageflow_mnist.py --setting official --rounds 15 --local_epochs 5 --local_momentum 0.9 --lr 0.01 --attack_flip weights --protocol official --times 1
    nice -n 10 .venv/bin/python experiments/sageflow_mnist.py --setting official --rounds 15 --local_epochs 5 --local_momentum 0.9 --lr 0.01 --attack_flip weights --protocol official --partition official --official_seed 2022 --times 1

``--gamma_halving R`` replaces the official code's halving period (0: γ stays ``--sageflow_gamma``, as the
paper states it); such runs go to folders ending ``_gamma_halving<R>``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import h5py
import numpy as np

from common import (MNIST_RAW, OUT, REPO, add_only_and_data_flags, add_training_flags, generate_data, mean_std, run_variant,
                    write_table)
from flcore.registry import load_all  # importable once common has put system/ on the path

#: the server's public samples (the official 1,000), drawn from the training pool of 100 clients
PUBLIC_SAMPLES = 1000


def public(samples_per_client: int) -> list[str]:
    """``--public_data`` as the fraction of the training pool that is 1,000 samples (MNIST's pool:
    60,000; with ``--samples`` N per client, 100 N)."""
    return ["--public_data", str(PUBLIC_SAMPLES / (100 * samples_per_client if samples_per_client else 60000)),
            "--public_data_withhold", "True"]  # every row withholds the same rows, Sageflow's or not
#: the official code's hidden γ halving period, in rounds
GAMMA_HALVING = {"MNIST": 15, "FashionMNIST": 20}


def sageflow(halving: int) -> list[str]:
    return ["--sageflow_eth", "1", "--sageflow_delta", "1", "--sageflow_lambda", "0.5", "--sageflow_gamma", "1",
            "--sageflow_gamma_halving", str(halving)]
STRAGGLERS = ["--straggler_delay", "2"]
#: the four IDX files of each dataset (Fashion-MNIST: the Debian package dataset-fashion-mnist)
RAW = {"MNIST": MNIST_RAW, "FashionMNIST": Path("/usr/share/datasets/fashion-mnist")}


def attack(scale: float, flip: str = "update") -> list[str]:
    return ["--attack", "sign_flip", "--attack_fraction", "0.2", "--attack_resample", "True",
            "--attack_scale", str(scale), "--attack_flip", flip]


def backdoor(from_round: int) -> list[str]:
    return ["--attack", "backdoor", "--attack_fraction", "0.2", "--attack_resample", "True",
            "--backdoor_from_round", str(from_round)]


def variants(setting: str, scale: float, from_round: int = 10, halving: int = 15,
             flip: str = "update") -> list[tuple[str, str, list[str]]]:
    """(label, -algo, flags) of the setting's rows (``halving``: Sageflow's γ halving period;
    ``flip``: what sign flip negates, ``--attack_flip``)."""
    sage = sageflow(halving)
    if setting == "official":
        both = [*STRAGGLERS, *attack(scale, flip)]
        # the official code's "Fedavg" rule still groups by staleness (its Sag() on plain averages):
        # that is Sageflow with no filter and δ = 0
        plain = [*sage, "--sageflow_eth", "inf", "--sageflow_delta", "0"]
        return [("FedAvg", "FedAvg", both), ("Sageflow", "Sageflow", [*both, *sage]),
                ("Sageflow E_th=inf, delta=0", "Sageflow", [*both, *plain])]
    if setting == "stragglers":
        fedasync = [*STRAGGLERS, "--staleness_fn", "polynomial", "--staleness_a", "0.5", "--async_alpha", "0.8"]
        return [("Sageflow", "Sageflow", [*STRAGGLERS, *sage]),
                ("FedAsync", "FedAsync", fedasync),
                # the same with t − τ counted in server updates, as t in Xie et al.'s Algorithm 1
                ("FedAsync, staleness in uploads", "FedAsync", [*fedasync, "--staleness_unit", "upload"]),
                ("FedAvg ignoring stragglers", "FedAvg", [*STRAGGLERS, "--straggler_policy", "ignore"]),
                ("FedAvg waiting for all", "FedAvg", [*STRAGGLERS, "--straggler_wait", "1"])]
    if setting == "backdoor":
        return [("FedAvg", "FedAvg", backdoor(from_round)),
                ("Sageflow", "Sageflow", [*backdoor(from_round), *sage]),
                ("clip", "FedAvg", [*backdoor(from_round), "--robust", "clip"])]
    flipped = attack(10.0, flip)
    return [("FedAvg", "FedAvg", flipped), ("Sageflow", "Sageflow", [*flipped, *sage]),
            ("median", "FedAvg", [*flipped, "--robust", "median"]),
            ("Multi-Krum", "FedAvg", [*flipped, "--robust", "multi_krum"]),
            ("RFA", "FedAvg", [*flipped, "--robust", "rfa"])]


def curves(paths: list[Path], series: str = "rs_test_acc", width: int = 0) -> np.ndarray:
    """``series`` of every repeat (rows), indexed by round, at least ``width`` wide: NaN at a round
    not evaluated (``--eval_gap``) and after a run that stopped early."""
    rows = []
    for path in paths:
        with h5py.File(path, "r") as f:
            values = np.asarray(f[series], dtype=float)
            evaluated = np.asarray(f["rs_eval_rounds"], dtype=int)[: len(values)]
        row = np.full(int(evaluated.max()) + 1 if len(evaluated) else 0, np.nan)
        row[evaluated] = values
        rows.append(row)
    width = max(width, *(len(r) for r in rows))
    return np.stack([np.pad(r, (0, width - len(r)), constant_values=np.nan) for r in rows])


def cell(values: np.ndarray, times: int) -> str:
    """A round's mean ± std (in %) over the seeds that reached it; ``–`` when none did."""
    present = values[np.isfinite(values)]
    if not present.size:
        return "–"
    text = f"{np.mean(present):.2f} ± {np.std(present):.2f}" if times > 1 else f"{present[0]:.2f}"
    return text if present.size == values.size else f"{text} ({present.size}/{values.size})"


def target_times(paths: list[Path]) -> list[float | None]:
    """Each run's ``virtual_time_to_target`` (None: the target was never reached)."""
    times = []
    for path in paths:
        with h5py.File(path, "r") as f:
            value = f.attrs.get("virtual_time_to_target")
        times.append(None if value is None or not np.isfinite(value) else float(value))
    return times


#: --protocol official: what the official code does differently, as flags of every row that has stragglers or
#: attackers (the model is run_variant's argument)
OFFICIAL_STRAGGLERS = ["--straggler_busy", "skip", "--straggler_delays", "each"]
OFFICIAL_ATTACKERS = ["--attack_scope", "drawn"]
MODELS = {"ours": "CNN", "official": "SageflowCNN"}


def with_protocol(flags: list[str], protocol: str) -> list[str]:
    """A row's flags under ``--protocol``: the official code's simulation of stragglers and attackers."""
    if protocol == "ours":
        return flags
    return [*flags, *(OFFICIAL_STRAGGLERS if "--straggler_delay" in flags else []),
            *(OFFICIAL_ATTACKERS if "--attack" in flags else [])]


#: the official code's input normalisation (torchvision's Normalize with MNIST's mean and std, on Fashion-MNIST too);
#: our generators scale to [-1, 1]
OFFICIAL_NORMALISE = (0.1307, 0.3081)
#: the official code trains a client on the first 80 % of its rows (the rest is a local validation set it never reads)
OFFICIAL_TRAIN_SHARE = 0.8
#: the official code's default --seed
OFFICIAL_SEED = 2021


def official_shards(labels: np.ndarray, seed: int, clients: int = 100, public: int = PUBLIC_SAMPLES,
                    shards: int = 200, per_client: int = 2) -> tuple[list[np.ndarray], np.ndarray]:
    """The official code's split of a training set (savertm/Sageflow's ``mnist_noniidcmm``, for MNIST and
    Fashion-MNIST alike), made with the same generator calls in the same order, so that the same ``seed``
    gives the same clients and the same public set: numpy's legacy generator, seeded with the official
    ``--seed``, draws the server's ``public`` rows; the other rows, sorted by label (numpy's default,
    unstable sort, as there), are cut into ``shards`` equal shards; each client in turn draws
    ``per_client`` of the shards not yet taken. Which shard a client holds first (and so which rows are
    its first 80 %) is the order the official code walks a Python set of the drawn shard numbers, and
    the shards left are the list of a Python set; both are kept by doing the same set operations.
    Returns each client's rows in that order and the public rows (sorted). The same rows need the same
    raw files in the same order (a local MNIST copy may hold the original training images in another order
    than the official files: both codes reading it get the same split, not the one of the paper's runs)."""
    draw = np.random.RandomState(seed)
    taken = set(draw.choice(len(labels), public, replace=False).tolist())
    pool = np.asarray(list(set(range(len(labels))) - taken), dtype=np.int64)
    by_label = pool[np.argsort(labels[pool].astype(np.int64))]
    size = len(pool) // shards
    left = list(range(shards))
    rows = []
    for _ in range(clients):
        drawn = set(draw.choice(left, per_client, replace=False).tolist())
        left = list(set(left) - drawn)
        rows.append(np.concatenate([by_label[shard * size:(shard + 1) * size] for shard in drawn]))
    return rows, np.asarray(sorted(taken), dtype=np.int64)


def official_data(args: argparse.Namespace) -> tuple[Path, Path]:
    """``--partition official``: the clients' and the server's data folders of the official split of
    ``--official_seed`` (:func:`official_shards`), each client's first 80 % for training, the global
    test split cut into one slice a client, inputs normalised as the official code normalises them;
    written once (a folder with a finished config.json is reused)."""
    sys.path.insert(0, str(REPO / "dataset"))
    from datagen import dataset_utils, sources  # the generators' readers and writer

    base = OUT / "data" / f"{args.dataset}_sageflow_official_seed{args.official_seed}"
    clients, server = base, base.with_name(base.name + "_public")
    if all((folder / "config.json").is_file() for folder in (clients, server)):
        return clients, server
    load = {"MNIST": sources.load_mnist, "FashionMNIST": sources.load_fashion_mnist}[args.dataset]
    raw = load(getattr(args, "raw_dir", None) or RAW[args.dataset], OUT / "data" / "rawdata")
    train = np.arange(raw.num_train)
    rows, public_rows = official_shards(raw.y[train], args.official_seed)
    mean, std = OFFICIAL_NORMALISE
    official = sources.RawDataset((raw.x.astype(np.float32) / np.float32(raw.pixel_max) - np.float32(mean))
                                  / np.float32(std), raw.y, raw.num_classes, raw.class_names, pixel_max=None,
                                  num_train=raw.num_train)
    options = {"dataset": args.dataset, "num_clients": len(rows), "non_iid": True, "balance": False,
               "partition": "sageflow-official", "alpha": 0.0, "batch_size": 10, "train_ratio": OFFICIAL_TRAIN_SHARE,
               "seed": args.official_seed, "samples_per_client": None, "few_shot": None, "test_split": "global",
               "feature_skew": None, "normalise": list(OFFICIAL_NORMALISE)}
    test = np.arange(raw.num_train, len(raw.y))
    rng = np.random.default_rng(args.official_seed)  # only cuts the global test split into the clients' slices
    dataset_utils.write_federated(clients, official, [r[:int(OFFICIAL_TRAIN_SHARE * len(r))] for r in rows],
                                  options, rng, shared_test=test)
    dataset_utils.write_federated(server, official, [public_rows], {**options, "num_clients": 1}, rng,
                                  shared_test=test[:10])  # a folder needs test files; the public set is its train
    return clients, server


def data_folder(args: argparse.Namespace) -> Path:
    """``--data``, or the setting's partition: ``--dataset`` in 100 shard clients, the global test split,
    ``--samples`` rows a client (0: all), generated from ``--raw_dir`` (default: RAW) when missing."""
    if args.data is not None:
        return args.data
    folder = OUT / "data" / (f"{args.dataset}_shard100_global" + (f"_{args.samples}s" if args.samples else ""))
    raw = getattr(args, "raw_dir", None) or RAW[args.dataset]
    cap = ["--samples-per-client", str(args.samples)] if args.samples else []
    generate_data(f"generate_{args.dataset}.py", ["noniid", "-", "shard", "--num-clients", "100", "--test-split",
                                                  "global", "--raw-dir", str(raw), "--out-dir", str(folder), *cap])
    return folder


def experiment_name(args: argparse.Namespace, halving: int) -> str:
    """The results folder and table name of a run: runs with another dataset, rows per client,
    optimiser, attack, E, γ halving period or first seed than the defaults get folders and a table of
    their own, so they never wipe the default runs' results they are compared with (``run_variant``
    empties a row's folder, and a ``--seed 2 --times 1`` run would otherwise delete seed 0's files,
    which have the same names)."""
    return (f"sageflow_{args.setting}" + ("" if args.dataset == "MNIST" else f"_{args.dataset}")
            + (f"_{args.samples}s" if args.samples else "")
            + (f"_momentum{args.local_momentum:g}_lr{args.lr:g}" if args.local_momentum else "")
            + ("_flip_weights" if args.attack_flip == "weights" else "")
            + (f"_E{args.local_epochs}" if args.local_epochs != 1 else "")
            + (f"_gamma_halving{halving}" if halving != GAMMA_HALVING[args.dataset] else "")
            + ("_official_protocol" if args.protocol == "official" else "")
            + (f"_official_partition{args.official_seed}" if args.partition == "official" else "")
            + (f"_seed{args.seed}" if args.seed else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=["official", "stragglers", "sign_flip", "backdoor"], default="official")
    parser.add_argument("--rounds", type=int, default=150, help="global rounds (the official MNIST runs: 150)")
    parser.add_argument("--attack_scale", type=float, default=0.1, help="official setting: sign flip s")
    parser.add_argument("--target", type=float, default=0.8,
                        help="stragglers setting: the accuracy whose virtual time to reach is reported")
    parser.add_argument("--backdoor_from_round", type=int, default=10,
                        help="backdoor setting: the first round of the x10 boost (Sageflow: 10 of 150)")
    parser.add_argument("--dataset", choices=list(RAW), default="MNIST")
    parser.add_argument("--eval_gap", type=int, default=1,
                        help="evaluate every k rounds (main.py -eg; a multiple of it as --rounds keeps the last round)")
    parser.add_argument("--samples", type=int, default=0,
                        help="training samples kept per client, before the public set is taken out (0: all ~600; "
                             "fewer make a round cheaper on a small CPU)")
    parser.add_argument("--raw_dir", type=Path, default=None, help="the dataset's four IDX files (default: RAW)")
    parser.add_argument("--local_momentum", type=float, default=0.0,
                        help="clients' SGD momentum (main.py --local_momentum; the official code: 0.9 with --lr 0.01)")
    parser.add_argument("--attack_flip", choices=["update", "weights"], default="update",
                        help="official and sign_flip settings: sign flip of the update (ours) or of the weights (official)")
    parser.add_argument("--gamma_halving", type=int, default=None,
                        help="Sageflow's γ halving period in rounds (--sageflow_gamma_halving; 0: off; default: the "
                             "official code's, 15 on MNIST, 20 on Fashion-MNIST); another period gets its own folders")
    parser.add_argument("--protocol", choices=list(MODELS), default="ours",
                        help="official: the official code's model, attackers per cohort, busy stragglers and delay "
                             "draw (module docstring); its results go to folders of their own")
    parser.add_argument("--partition", choices=["ours", "official"], default="ours",
                        help="official: the official code's clients, public set, 80 %% training share and input "
                             "normalisation, drawn as it draws them for --official_seed (official_shards); its "
                             "results go to folders of their own")
    parser.add_argument("--official_seed", type=int, default=OFFICIAL_SEED,
                        help="--partition official: the official code's --seed whose split to use (default 2021)")
    add_training_flags(parser, lr=0.1, lr_help="local lr (plain SGD unless --local_momentum; see the module docstring)",
                       batch_size=10)
    add_only_and_data_flags(parser, "row labels to run")
    args = parser.parse_args()
    if args.eval_gap < 1 or args.rounds % args.eval_gap:
        parser.error(f"--eval_gap must be >= 1 and divide --rounds ({args.rounds}), got {args.eval_gap}")
    if args.partition == "official" and (args.samples or args.data is not None):
        parser.error("--partition official makes its own data (the official ~590 rows a client): drop --samples and --data")
    if args.gamma_halving is not None and args.gamma_halving < 0:
        parser.error(f"--gamma_halving must be >= 0 (0: no halving), got {args.gamma_halving}")
    halving = GAMMA_HALVING[args.dataset] if args.gamma_halving is None else args.gamma_halving
    load_all()
    if args.partition == "official":
        data, server_data = official_data(args)
        public_flags = ["--public_data", str(server_data), "--public_data_withhold", "True"]
    else:
        data, public_flags = data_folder(args), public(args.samples)
    name = experiment_name(args, halving)
    shown = list(range(0, args.rounds + 1, args.eval_gap))  # the evaluated rounds
    columns = [f"round {r}" for r in shown]
    if args.setting == "stragglers":
        columns.append(f"virtual s to {100 * args.target:g}%")
    if args.setting == "backdoor":
        columns += [f"ASR round {r}" for r in shown]
    rows = ("the official split of seed " + str(args.official_seed) if args.partition == "official"
            else f"{args.samples or 'all'} training samples per client")
    lines = [f"# Sageflow on {args.dataset}, setting {args.setting}: {rows}, "
             f"{args.rounds} rounds, E = {args.local_epochs}, "
             f"B = {args.batch_size}, lr {args.lr}, momentum {args.local_momentum:g}, "
             + (f"sign flip of the {args.attack_flip}, " if args.setting in ("official", "sign_flip") else "")
             + (f"Sageflow's γ halved every {halving} rounds, " if halving else "no γ halving, ")
             + ("the official code's protocol (model, attackers, busy stragglers, delays), "
                if args.protocol == "official" else "")
             + f"{args.times} seed(s) from {args.seed}",
             "", "| method | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    extra = ["--engine", "sequential", "--num_threads", "1", "--local_momentum", str(args.local_momentum),
             "--eval_gap", str(args.eval_gap)]
    if args.setting == "stragglers":
        extra += ["--target_acc", str(args.target)]
    for label, algo, flags in variants(args.setting, args.attack_scale, args.backdoor_from_round,
                                       halving, args.attack_flip):
        if args.only and label not in args.only:
            continue
        run = run_variant(name, label, algo, ["-jr", "0.2", *public_flags, *with_protocol(flags, args.protocol)],
                          data, args, MODELS[args.protocol], args.rounds, extra, diverged_is_result=True)
        if isinstance(run, str):
            lines.append(f"| {label} | {run} |")
            continue
        every = run.every_seed()
        cells = [cell(col, args.times) for col in (100 * curves(every, width=args.rounds + 1)).T[shown]]
        if args.setting == "stragglers":
            cells.append(mean_std(target_times(every), scale=1, digits=1))
        if args.setting == "backdoor":
            cells += [cell(col, args.times)
                      for col in (100 * curves(every, "rs_backdoor_asr", args.rounds + 1)).T[shown]]
        # (not ``shown``, the evaluated rounds the rows after this one still index by)
        row = f"{label} ({run.note()})" if run.diverged else label
        lines.append(f"| {row} | " + " | ".join(cells) + f" |  <!-- {run.seconds():.0f} s -->")
        print(lines[-1], flush=True)
    write_table(name, lines, args.only or ())  # rows run side by side with --only keep each other's


if __name__ == "__main__":
    main()
