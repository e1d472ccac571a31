"""The directional table of every registered algorithm on real Fashion-MNIST (Dirichlet 0.1, 20
clients), personalised accuracy, mean ± std over seeds, against Local, FedAvg and the strongest
of the classic personalised baselines (Ditto or FedRep, whichever scores higher here).

Every row runs ``main.main`` ``--times`` times (seeds seed..seed+times-1) on one partition, generated
once under ``experiments/out/data`` by ``dataset/generate_FashionMNIST.py`` from the Debian package's
IDX files, each client keeping at most ``--samples`` training rows (all its test rows). All rows share
the training flags (model, B, E, lr, rounds, every client every round); an algorithm gets its own
flags only where it needs them to run (public data) or where PFLlib's default would switch the method
off (:data:`OWN_FLAGS`, the table's "own flags" column); every other flag is our default.

Accuracy is ``rs_test_acc``: each client's own model on its own test rows, sample-weighted, for the
personalised methods; the global model for the others (the "model" column says which). A row that
fails keeps its one-line reason in the table; no name is dropped.

    python experiments/all_algorithms_table.py                     # every registered name (slow)
    python experiments/all_algorithms_table.py --shard 1/2 &       # half of them, the other half beside it
    python experiments/all_algorithms_table.py --only FedAvg Local --rounds 2 --times 1     # a pilot
    python experiments/all_algorithms_table.py --table-only        # the table of every row run so far

Each finished row is kept in ``experiments/out/all_algorithms/<row>.json``; the table of all rows is
written to ``experiments/out/all_algorithms_table.md`` and printed.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import traceback
from pathlib import Path

import h5py
import numpy as np

from common import OUT, add_training_flags, generate_data, mean_std, results_folder, run_variant
from flcore.registry import list_algorithms, load_all  # noqa: E402  (common puts system/ on the path)

FMNIST_RAW = Path("/usr/share/datasets/fashion-mnist")
#: the default ``--name``: the rows of the full table
EXPERIMENT = "all_algorithms"
#: the baselines every row is read against; the strongest of REFERENCE_PFL is picked from the table
REFERENCE_PFL = ("Ditto", "FedRep")
#: rows run first (the baselines and the eleven PFLlib algorithms added last), so that a run cut short has them
FIRST = ["Local", "FedAvg", *REFERENCE_PFL, "FedMTL", "FedFomo", "APPLE", "FedPHP", "FedCP", "GPFL", "FedDBE", "FedCAC",
         "PFL-DA", "FedAS", "FedGC"]
#: algorithm -> (own flags, why): flags an algorithm needs to run here, or that switch on a method
#: PFLlib's default would switch off (ours warn then); values from the papers
OWN_FLAGS: dict[str, tuple[list[str], str]] = {
    "KT-pFL": (["--public_data", "0.1"], "public data (10% of each client's rows, server-side)"),
    "Sageflow": (["--public_data", "0.1"], "public data (10%)"),
    "FedProx": (["-mu", "0.01"], "PFLlib's -mu 0 is FedAvg"),
    "Ditto": (["-mu", "0.1"], "PFLlib's -mu 0 leaves the personal model unregularised"),
    "MOON": (["-mu", "1", "-tau", "0.5"], "PFLlib's -mu 0 is FedAvg; paper's τ 0.5"),
    "FedNTD": (["-bt", "1"], "PFLlib's -bt 0 is FedAvg"),
    "FedGen": (["-se", "100"], "time: 100 generator steps a round, not PFLlib's 1000"),
    "FedMA": (["--fedma_iterations", "1"], "time: one BBP-MAP pass per layer, not the authors' 5"),
    "FedDBE": (["-klw", "1"], "PFLlib's -klw 0 switches the regulariser off"),
    "APPLE": (["-dlr", "0.01", "-mu", "0.1"], "PFLlib's -dlr 0 freezes the relationship vectors, -mu 0 drops the pull to p0"),
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_flags(parser, lr=0.01, lr_help="client learning rate of every row", batch_size=10)
    parser.add_argument("--only", nargs="*", default=None, help="rows (-algo names) to run (default: every registered one)")
    parser.add_argument("--shard", default="1/1", metavar="K/N",
                        help="run the K-th of N interleaved parts of the rows (two processes: 1/2 and 2/2)")
    parser.add_argument("--data", type=Path, default=None, help="dataset folder (default: generated under out/data)")
    parser.add_argument("--samples", type=int, default=50, help="training rows kept per client (0: all)")
    parser.add_argument("--rounds", type=int, default=50, help="-gr of every run (50 or more for a directional result)")
    parser.add_argument("--eval_gap", type=int, default=25, help="-eg: evaluate every N rounds (and after the last)")
    parser.add_argument("--model", default="DNN")
    parser.add_argument("--engine", default="sequential", help="--engine of main.py (sequential: one core per process)")
    parser.add_argument("--name", default=EXPERIMENT,
                        help="the experiment: its rows are kept in out/<name>/ and its table written to "
                             "out/<name>_table.md (give another scale another name: a row's record is replaced "
                             "by a rerun, and one table never mixes scales)")
    parser.add_argument("--table-only", action="store_true", help="run nothing: write the table of the rows run so far")
    parser.add_argument("--skip-done", action="store_true", help="skip rows already run at this scale or being run by another process")
    return parser.parse_args(argv)


def ensure_data(args: argparse.Namespace) -> Path:
    if args.data is not None:
        return args.data.resolve()
    folder = OUT / "data" / f"FMNIST-dir0.1-20-{args.samples or 'all'}s"
    if not (folder / "config.json").is_file():
        if not FMNIST_RAW.is_dir():
            raise SystemExit(f"{FMNIST_RAW} not found (apt-get install dataset-fashion-mnist)")
        options = ["noniid", "-", "dir", "--alpha", "0.1", "--num-clients", "20", "--raw-dir", str(FMNIST_RAW),
                   "--out-dir", str(folder)]
        generate_data("generate_FashionMNIST.py", options + (["--samples-per-client", str(args.samples)] if args.samples else []))
    return folder


def curve_numbers(path: Path) -> dict:
    """Final and best ``rs_test_acc`` of one run, and whether it is personalised."""
    with h5py.File(path, "r") as f:
        acc = np.asarray(f["rs_test_acc"][()], dtype=float)
        personalised = bool(f.attrs.get("personalized", False))
    acc = acc[np.isfinite(acc)]
    return {"final": float(acc[-1]) if len(acc) else None, "best": float(acc.max()) if len(acc) else None,
            "personalised": personalised}


def run_row(algo: str, data: Path, args: argparse.Namespace) -> dict:
    """One row's ``--times`` runs; the record kept in ``out/all_algorithms/<algo>.json``."""
    flags, why = OWN_FLAGS.get(algo, ([], ""))
    extra = ["-jr", "1", "-eg", str(args.eval_gap), "--engine", args.engine, "--num_threads", "1"]
    record: dict = {"algo": algo, "flags": flags, "why": why, "scale": scale_text(args)}
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            run = run_variant(args.name, algo, algo, flags, data, args, args.model, args.rounds, extra=extra, quiet=True)
    except Exception as exc:  # noqa: BLE001 - an algorithm's crash is a row of the table, not the end of it
        run = f"crashed: {type(exc).__name__}: {exc}"
        traceback.print_exc()
    reason = [line for line in errors.getvalue().splitlines() if line.startswith("error")]
    if isinstance(run, str):
        record["failed"] = (reason[-1] if reason else run)[:200]
    else:
        record["runs"] = [curve_numbers(path) for path in run.paths]
        record["s_per_run"] = run.seconds() / max(len(run.paths), 1)
    rows_dir(args.name).mkdir(parents=True, exist_ok=True)
    (rows_dir(args.name) / f"{algo}.json").write_text(json.dumps(record, indent=1))
    return record


def scale_text(args: argparse.Namespace) -> str:
    return (f"{args.model}, {args.samples or 'all'} training rows per client, {args.rounds} rounds, B {args.batch_size}, "
            f"E {args.local_epochs}, lr {args.lr}, seeds {args.seed}..{args.seed + args.times - 1}")


def mean(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def table(records: dict[str, dict]) -> list[str]:
    """One line per registered algorithm: accuracy and its difference of means to the three baselines."""
    finals = {name: mean([r["final"] for r in rec.get("runs", [])]) for name, rec in records.items()}
    pfl = [name for name in REFERENCE_PFL if finals.get(name) is not None]
    strongest = max(pfl, key=lambda name: finals[name]) if pfl else None
    refs = [("Local", "Local"), ("FedAvg", "FedAvg"), (strongest or "/".join(REFERENCE_PFL), strongest)]
    lines = ["| algorithm | model evaluated | own flags | final acc. (%) | best (%) | "
             + " | ".join(f"− {label}" for label, _ in refs) + " | s/run |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in list_algorithms():
        rec = records.get(name)
        if rec is None:
            lines.append(f"| {name} | not run | | | | | | | |")
            continue
        flags = f"`{' '.join(rec['flags'])}`" if rec["flags"] else "–"
        if "failed" in rec:
            lines.append(f"| {name} | failed: {rec['failed']} | {flags} | | | | | | |")
            continue
        runs = rec["runs"]
        kind = "personal" if all(r["personalised"] for r in runs) else "global"
        diffs = ["–" if finals[name] is None or ref is None or finals.get(ref) is None
                 else f"{100 * (finals[name] - finals[ref]):+.2f}" for _, ref in refs]
        lines.append(f"| {name} | {kind} | {flags} | {mean_std([r['final'] for r in runs])} | "
                     f"{mean_std([r['best'] for r in runs])} | " + " | ".join(diffs) + f" | {rec['s_per_run']:.0f} |")
    return lines


def is_done(name: str, args: argparse.Namespace) -> bool:
    """The row has a record at this scale (read afresh: another process may have just written it)."""
    path = rows_dir(args.name) / f"{name}.json"
    return path.is_file() and json.loads(path.read_text()).get("scale") == scale_text(args)


def in_progress(name: str, experiment: str = EXPERIMENT) -> bool:
    """Another process runs the row now: ``main`` holds a lock file, naming a live process, in its results
    folder (a killed run leaves its lock files behind)."""
    for lock in results_folder(experiment, name).glob(".*.lock"):
        try:
            os.kill(int(lock.read_text().strip()), 0)
        except (ValueError, ProcessLookupError):
            continue
        except PermissionError:  # alive, another user's
            pass
        return True
    return False


def rows_dir(experiment: str) -> Path:
    """Where an experiment's rows are kept: ``out/<name>/``, one JSON file per row."""
    return OUT / experiment


def load_records(experiment: str = EXPERIMENT) -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(rows_dir(experiment).glob("*.json"))}


def main_(argv: list[str] | None = None) -> None:
    args = parse(argv)
    load_all()
    if not args.table_only:
        names = args.only or [*FIRST, *(name for name in list_algorithms() if name not in FIRST)]
        unknown = [name for name in names if name not in list_algorithms()]
        if unknown:
            raise SystemExit(f"not registered: {', '.join(unknown)}")
        part, parts = (int(v) for v in args.shard.split("/"))
        data = ensure_data(args)
        for name in names[part - 1::parts]:
            if args.skip_done and (is_done(name, args) or in_progress(name, args.name)):
                continue
            rec = run_row(name, data, args)
            print(f"{name}: {rec.get('failed') or mean_std([r['final'] for r in rec['runs']])} "
                  f"({rec.get('s_per_run', 0):.0f} s/run)", flush=True)
    lines = table(load_records(args.name))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}_table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main_()
