"""Directional runs per algorithm family on real MNIST.

MNIST split over 20 clients by Dirichlet(0.1) (``generate_MNIST.py noniid - dir --alpha 0.1``),
full participation, one table per family:

* **global**: MOON and FedDyn against FedAvg, plus FedGen and FedCross; metric = the global
  model's test accuracy on the union of the clients' test splits (``rs_test_acc``).
* **personalised**: FedPer, FedRep and FedRoD against FedAvg and Local; metric = personalised
  accuracy, each client's own model on its own test data, sample-weighted (``rs_test_acc``, what
  ``main.py`` reports for pFL algorithms; for FedAvg its one global model), and the unweighted mean
  over clients (``rs_client_acc``).
* **batchnorm**: FedBN against FedAvg and Local on the BatchNorm CNN (``-m CNN-BN``), same metric.

The global and personalised families share one model (DNN by default) and one partition, so their
FedAvg row is one run. The CNN-BN family gets its own, smaller partition (same split rule and seed,
``--bn_samples_per_client`` training samples per client) because a CNN costs roughly ten times a
DNN per sample on a CPU; its test splits are kept whole, as for every partition here.

Flags of each algorithm are its file's defaults (PFLlib's) except where a default switches the
method off: MOON's ``-mu`` defaults to 0 (= FedAvg, PFLlib), so it runs with the paper's μ = 1
(Li et al. 2021 use μ ∈ {0.1, 1, 5, 10}; 1 for CIFAR-100 and Tiny-ImageNet) and PFLlib's τ = 1.0
(paper: 0.5). FedDyn α = 1.0, FedRep 1 head epoch, FedGen 1000 generator steps, FedCross α = 0.99
(all PFLlib's defaults).

Every (row, seed) is one ``main.main`` run in a worker process, ``--jobs`` at a time (one torch
thread each, ``--engine``), so the machine's cores are used without oversubscribing them. Every
number is the mean ± population std over ``--times`` runs (default 3, seeds ``seed .. seed+times-1``:
the partition stays, initialisation and batches change), as in the other experiment scripts.
'last 10%' = mean over the last 10% of evaluations (at least one).

Usage (from the repository root)::

    .venv/bin/python experiments/protocol_families.py                      # 30 rounds, seeds 0-2, 2 jobs
    .venv/bin/python experiments/protocol_families.py --quick --times 1    # 2 rounds: every row runs
    .venv/bin/python experiments/protocol_families.py --times 1            # seed 0 only, then ...
    .venv/bin/python experiments/protocol_families.py --reuse              # ... seeds 1, 2 added to it
    .venv/bin/python experiments/protocol_families.py --only global --skip FedGen
    .venv/bin/python experiments/protocol_families.py --only FedBN Local --rounds 50
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np

from common import (MNIST_RAW, OUT, add_only_and_data_flags, add_training_flags, generate_data, mean_std,
                    results_folder, run_variant, write_table)
from flcore.registry import ALGORITHMS, load_all  # importable once common has put system/ on the path

EXPERIMENT = "protocol_families"


class Row(NamedTuple):
    """One table row: its family, label, ``-algo`` name, own flags and which set-up it runs on."""

    family: str
    label: str
    algo: str
    flags: tuple[str, ...]
    setup: str  # "main" (--model on the main partition) or "bn" (--bn_model on the BN partition)


ROWS: list[Row] = [
    Row("global", "FedAvg", "FedAvg", (), "main"),
    Row("global", "MOON", "MOON", ("-mu", "1"), "main"),  # PFLlib's -mu 0 is FedAvg: the paper's μ = 1
    Row("global", "FedDyn", "FedDyn", (), "main"),
    Row("global", "FedGen", "FedGen", (), "main"),
    Row("global", "FedCross", "FedCross", (), "main"),
    Row("personalised", "FedAvg", "FedAvg", (), "main"),
    Row("personalised", "Local", "Local", (), "main"),
    Row("personalised", "FedPer", "FedPer", (), "main"),
    Row("personalised", "FedRep", "FedRep", (), "main"),
    Row("personalised", "FedRoD", "FedROD", (), "main"),
    Row("batchnorm", "FedAvg", "FedAvg", (), "bn"),
    Row("batchnorm", "Local", "Local", (), "bn"),
    Row("batchnorm", "FedBN", "FedBN", (), "bn"),
]

FAMILY_TITLES = {
    "global": "Global family: global model's test accuracy",
    "personalised": "Personalised family: each client's own model on its own test data",
    "batchnorm": "BatchNorm family (FedBN): each client's own model on its own test data",
}


class Job(NamedTuple):
    """One ``main.main`` run: an algorithm with its flags on one set-up and one seed."""

    algo: str
    flags: tuple[str, ...]
    setup: str
    seed: int


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="communication rounds (-gr; default 30, 2 quick)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of every row")
    parser.add_argument("--model", default="DNN", help="-m of the global and personalised families")
    parser.add_argument("--samples_per_client", type=int, default=500,
                        help="training samples kept per client for --model (0 = all of MNIST)")
    parser.add_argument("--bn_model", default="CNN-BN", help="-m of the FedBN family (needs BatchNorm layers)")
    parser.add_argument("--bn_samples_per_client", type=int, default=100,
                        help="training samples kept per client for --bn_model")
    add_training_flags(parser, lr=0.05, lr_help="client learning rate for every method", batch_size=10)
    parser.add_argument("--engine", default="sequential", help="--engine of main.py")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per run (--num_threads)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time, each in its own process")
    parser.add_argument("--eval_gap", type=int, default=1, help="evaluate every N rounds (-eg) on --model")
    parser.add_argument("--bn_eval_gap", type=int, default=5,
                        help="evaluate every N rounds on --bn_model (a CNN evaluation of every test split "
                             "costs about as much as several training rounds of the small partition)")
    add_only_and_data_flags(parser, "families, labels or -algo names to run (default: all)")
    parser.add_argument("--skip", nargs="*", default=[], help="families, labels or -algo names to leave out")
    parser.add_argument("--reuse", action="store_true",
                        help="take a run's numbers from its results file when one with the same settings "
                             "(data, model, rounds, lr, B, E, seed, eval gap, algorithm and flags) is there, "
                             "e.g. to add seeds to a finished table")
    parser.add_argument("--bn_data", type=Path, default=None,
                        help="dataset folder of the FedBN family (default: generated under out/)")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.times < 1:
        parser.error("--jobs and --times must be at least 1")
    return args


def data_name(given: Path | None, samples_per_client: int) -> Path:
    """Where the Dirichlet-0.1, 20-client MNIST partition is (``given``, or the generated folder)."""
    if given is not None:
        return given
    return OUT / "data" / f"MNIST_dir0.1_20c{f'_{samples_per_client}s' if samples_per_client > 0 else ''}"


def ensure_data(given: Path | None, samples_per_client: int) -> Path:
    """The Dirichlet-0.1, 20-client MNIST partition (generated once; the generator skips a folder that
    already holds the same partition)."""
    folder = data_name(given, samples_per_client)
    if given is not None or (folder / "config.json").is_file():
        return folder
    if not MNIST_RAW.is_dir():
        raise SystemExit(f"{MNIST_RAW} not found: pass --data/--bn_data or provide MNIST's raw files there")
    cap = ["--samples-per-client", str(samples_per_client)] if samples_per_client > 0 else []
    generate_data("generate_MNIST.py", ["noniid", "-", "dir", "--alpha", "0.1", "--num-clients", "20", *cap,
                                        "--raw-dir", str(MNIST_RAW), "--out-dir", str(folder)])
    return folder


def read_run(path: Path) -> dict[str, float]:
    """The numbers of one result file: sample-weighted accuracy (last 10%, best, final), the unweighted
    mean over clients (last 10%), where the method has one its shared model's accuracy, and the run's
    wall time as ``main`` measured it."""
    with h5py.File(path) as f:
        seconds = float(f.attrs["wall_time_s"])
        weighted = f["rs_test_acc"][()]
        client_mean = f["rs_client_acc"][()].mean(axis=1)
        shared = f["rs_test_acc_global"][()] if "rs_test_acc_global" in f else None
    tail = max(1, int(np.ceil(0.1 * weighted.size)))
    numbers = {"last10": weighted[-tail:].mean(), "best": weighted.max(), "final": weighted[-1],
               "client_last10": client_mean[-tail:].mean()}
    if shared is not None:
        numbers["shared_last10"] = shared[-tail:].mean()
    return {key: float(value) for key, value in numbers.items()} | {"time": seconds}


def earlier_run(folder: Path, expected: dict[str, object]) -> Path | None:
    """The one results file in ``folder`` whose recorded settings include ``expected``, if any."""
    paths = sorted(folder.glob("*.h5"))
    if len(paths) != 1:
        return None
    with h5py.File(paths[0]) as f:
        config = json.loads(f.attrs["config"])
    return paths[0] if all(config.get(key) == value for key, value in expected.items()) else None


def choose_rows(only: list[str] | None, skip: list[str]) -> list[Row]:
    """The rows named by ``--only`` (all when None) less those named by ``--skip``; a row is named by its
    family, its label or its ``-algo`` name."""
    def named(row: Row, names: list[str]) -> bool:
        return bool({row.family, row.label, row.algo} & set(names))
    return [row for row in ROWS if (only is None or named(row, only)) and not named(row, skip)]


def plan_jobs(rows: list[Row], seeds: range) -> list[Job]:
    """The runs behind ``rows``, each once: the global and personalised FedAvg rows are one run, since
    a job is keyed by what ``main.main`` receives. Unregistered algorithms get no job (their rows say
    so). The CNN runs come first: they are the longest, so the pool's last minutes are not one run alone."""
    jobs = list(dict.fromkeys(Job(row.algo, row.flags, row.setup, s) for row in rows for s in seeds
                              if row.algo in ALGORITHMS))
    return sorted(jobs, key=lambda job: job.setup != "bn")


def run_job(job: Job, args: argparse.Namespace, data: dict[str, Path], rounds: int) -> dict[str, float] | str:
    """One run in a worker process: the numbers of its result file and its wall time, or a note."""
    load_all()
    model = args.model if job.setup == "main" else args.bn_model
    gap = args.eval_gap if job.setup == "main" else args.bn_eval_gap
    extra = ["-jr", "1", "--engine", args.engine, "--num_threads", str(args.threads), "-eg", str(gap)]
    # flags and rounds in the label: a quick run gets its own folder and leaves the full runs' files alone
    label = f"{job.algo} {' '.join(job.flags)} {model} {rounds}r seed{job.seed}"
    if args.reuse:
        expected = {"dataset": str(data[job.setup]), "model": model, "global_rounds": rounds, "algorithm": job.algo,
                    "local_learning_rate": args.lr, "batch_size": args.batch_size, "local_epochs": args.local_epochs,
                    "seed": job.seed, "eval_gap": gap, "join_ratio": 1.0}
        found = earlier_run(results_folder(EXPERIMENT, label), expected)
        if found is not None:
            return read_run(found)
    one_seed = argparse.Namespace(**{**vars(args), "seed": job.seed, "times": 1})  # a job is one run
    run = run_variant(EXPERIMENT, label, job.algo, list(job.flags), data[job.setup], one_seed, model, rounds, extra,
                      quiet=True)
    if isinstance(run, str):
        return run
    if len(run.paths) != 1:
        return f"failed: expected one result file, found {len(run.paths)}"
    return read_run(run.paths[0])


def row_cells(outcomes: list[dict[str, float] | str], personal: bool) -> list[str]:
    """A row's numbers as mean ± std over its runs (a failed run's note instead, if any)."""
    notes = [o for o in outcomes if isinstance(o, str)]
    if notes:
        return [notes[0]] + [""] * (5 if personal else 3)
    keys = ["last10", "best", "final"] + (["client_last10", "shared_last10"] if personal else [])
    seconds = np.mean([o["time"] for o in outcomes])
    return [mean_std([o.get(key) for o in outcomes]) for key in keys] + [f"{seconds:.0f}"]


def family_table(family: str, rows: list[Row], results: dict[Row, list[dict[str, float] | str]]) -> list[str]:
    personal = family != "global"
    metric = "personalised acc (weighted)" if personal else "global acc"
    lines = [f"### {FAMILY_TITLES[family]}", "",
             f"| method | flags | {metric}, last 10% | best | final |"
             + (" mean over clients, last 10% | shared model, last 10% |" if personal else "") + " time per run (s) |",
             "|---|---|---|---|---|" + ("---|---|" if personal else "") + "---|"]
    for row in rows:
        lines.append("| " + " | ".join([row.label, " ".join(row.flags), *row_cells(results[row], personal)]) + " |")
    return lines + [""]


def main_script() -> None:
    args = parse_args()
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 30)
    load_all()
    chosen = choose_rows(args.only, args.skip)
    setups = {row.setup for row in chosen}
    data = {}
    if "main" in setups:
        data["main"] = ensure_data(args.data, args.samples_per_client)
    if "bn" in setups:
        data["bn"] = ensure_data(args.bn_data, args.bn_samples_per_client)
    seeds = range(args.seed, args.seed + args.times)
    jobs = plan_jobs(chosen, seeds)
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {job: pool.submit(run_job, job, args, data, rounds) for job in jobs}
        for job, future in futures.items():
            outcome = future.result()
            shown = outcome if isinstance(outcome, str) else f"{100 * outcome['last10']:.2f} ({outcome['time']:.0f} s)"
            print(f"done: {job.algo} {' '.join(job.flags)} [{job.setup}] seed {job.seed}: {shown}", flush=True)
    results = {row: [futures[Job(row.algo, row.flags, row.setup, s)].result() for s in seeds]
               if row.algo in ALGORITHMS else [f"skipped: algorithm {row.algo!r} is not registered"]
               for row in chosen}
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Protocol families: MNIST, Dirichlet 0.1, 20 clients, full participation", "",
        f"{rounds} rounds, E={args.local_epochs}, B={args.batch_size}, lr={args.lr}, seeds "
        f"{args.seed}..{args.seed + args.times - 1} (mean ± population std), engine {args.engine}, {args.threads} torch thread(s) per run, "
        f"{args.jobs} run(s) at a time{' (quick)' if args.quick else ''}", "",
        f"Global and personalised families: model {args.model}, data {data_name(args.data, args.samples_per_client).name}, "
        f"evaluated every {args.eval_gap} round(s). BatchNorm family: model {args.bn_model}, data "
        f"{data_name(args.bn_data, args.bn_samples_per_client).name}, evaluated every {args.bn_eval_gap} round(s). Test splits are whole "
        "(25% of each client's samples); 'last 10%' = mean over the last 10% of evaluations; weighted = "
        "sample-weighted over clients (main.py's number); shared model = the method's shared/global model "
        "where it records one; time = wall time of one run as main.py measured it, on a shared CPU (noisy).", "",
    ]
    named = args.only is not None or bool(args.skip)
    for family in FAMILY_TITLES:
        rows = [row for row in chosen if row.family == family]
        if rows or named:  # with --only/--skip every family's table, so the file keeps the rows not run now
            lines += family_table(family, rows, results)
    # the date after the tables: the header stays the same for the same setting, so --only merges
    lines += [f"Written {date}."]
    write_table(EXPERIMENT, lines, [row.label for row in chosen] if named else ())


if __name__ == "__main__":
    main_script()
