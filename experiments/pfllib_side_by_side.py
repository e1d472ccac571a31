"""Side by side with PFLlib's own implementation: PFLlib's ``main.py`` and ours,
algorithm by algorithm, on the same partition with the same flags; both per-round accuracy curves.

The partition is one of ours (default: ``dataset/generate_MNIST.py``, 20 clients, Dirichlet 0.1,
generated into ``experiments/out/data/``), written once in PFLlib's file format into a temporary copy
of PFLlib (``benchmark.pfllib_workspace``: its ``system/`` code, our clients' data, stand-ins for the
imports its ``main.py`` makes but these runs never use), so both sides train on exactly the same
clients' train and test data. PFLlib's run is its unchanged ``main.py`` (its per-round accuracy is
the "Averaged Test Accuracy" line it prints at every evaluation); ours is ``system/main.py`` (its
``rs_test_acc``). Both sides run the algorithm's PFLlib defaults, given explicitly to both
(:data:`ALGORITHM_FLAGS`), so a default of ours that differs from PFLlib's does not enter.

    python experiments/pfllib_side_by_side.py --pfllib /tmp/pfllib --only FD FedProto
    python experiments/pfllib_side_by_side.py --pfllib /tmp/pfllib --pfllib-python /tmp/cvxenv/bin/python --only FedPAC

``--pfllib`` is a PFLlib checkout or export (``git archive HEAD system | tar -x -C DIR``). Results
accumulate in ``experiments/out/pfllib_side_by_side.json`` (a rerun of an algorithm replaces its
record) and the table of every record so far is written to ``experiments/out/pfllib_side_by_side.md``
and printed. Both sides of one algorithm run at the same time (two processes); run it with
``nice -n 10`` on a shared machine. ``--side pfllib`` and ``--side ours`` run one side each (two
invocations, one per side, keep two cores busy when PFLlib's side is the slower one).

``--seed N`` seeds both sides (PFLlib's main.py through :data:`SEEDED_LAUNCHER`); the records of
N ≠ 0 are ``'<algo> seed=N'``, and the table ends with a summary over the seeds of each algorithm
(mean ± std per side, and whether our mean lies inside PFLlib's own range over its seeds):

    for seed in 0 1 2; do python experiments/pfllib_side_by_side.py --pfllib /tmp/pfllib --seed $seed --only FedAvg Local; done
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import MNIST_RAW, OUT, REPO, generate_data, mean_std

import benchmark  # noqa: E402  (system/ is on the path through common)

#: the flags each algorithm's PFLlib code reads, with PFLlib's defaults (d832e76's main.py), given to
#: both sides so that neither side's own defaults enter (ours differ for FML, FedPHP and FedCAC);
#: FedCAC is the one exception
ALGORITHM_FLAGS: dict[str, list[str]] = {
    "FedAvg": [], "Local": [],
    "FD": ["-lam", "1.0"], "FedProto": ["-lam", "1.0"], "FedPCL": ["-tau", "1.0"], "FedGH": ["-slr", "1.0"],
    "FedPAC": ["-lam", "1.0"], "FML": ["-al", "1.0", "-bt", "0.0"],
    "FedKD": ["-mlr", "0.005", "-Ts", "0.95", "-Te", "0.98"],
    "FedMTL": ["-itk", "4000"], "FedFomo": ["-M", "5"], "APPLE": ["-dlr", "0.0", "-L", "1.0", "-mu", "0.0"],
    "FedPHP": ["-lam", "1.0", "-mu", "0.0"], "FedDBE": ["-mo", "0.1", "-klw", "0.0"],
    # PFLlib's -bt default 0 stops its FedCAC at an assertion (beta >= 1) and ours refuses it: the paper's
    # τ = 0.5, β = 50 (our defaults) on both sides instead
    "FedCAC": ["-tau", "0.5", "-bt", "50"], "PFL-DA": ["-lam", "1.0"], "FedAS": [], "FedGC": ["-lam", "1.0"],
    "FedCP": ["-lam", "1.0"], "GPFL": ["-lam", "1.0", "-mu", "0.0"],
}
# Two defaults of ours that no PFLlib flag sets: APPLE's core rate is the paper's lr (PFLlib's N·lr is
# our --apple_core_lr_scale True; PFLlib's clients also see the cores of earlier clients of the same
# round, through shared objects), and GPFL's conditions come from the client's own trained GCE, as in
# PFLlib (--gpfl_condition). docs/results/algorithms.md, "GPFL's conditions and APPLE's core rate".
#: the PFLlib algorithms compared
DEFAULT_ALGORITHMS = ["FD", "FedProto", "FedPCL", "FedGH", "FedPAC", "FML", "FedKD", "FedMTL", "FedFomo", "APPLE",
                      "FedPHP", "FedDBE", "FedCAC", "PFL-DA", "FedAS", "FedGC", "FedCP", "GPFL"]
#: the algorithms whose model PFLlib's main.py splits into ``BaseHeadSplit(base, head)`` (FedPCL: fc set
#: to Identity, no head); with ``-m DNN`` that leaves log_softmax on the features, so ours runs the
#: same function, ``DNN-PFLlib``, for them. The others run PFLlib's whole DNN, whose final log_softmax
#: changes no cross-entropy: ours runs ``DNN`` (logits) for them.
SPLIT_IN_PFLLIB = {"FedAvg", "FedProto", "FedPCL", "FedGH", "FedPAC", "FedKD", "FedPHP", "FedDBE", "PFL-DA", "FedAS",
                   "FedGC", "FedCP", "GPFL"}
#: our curve that measures what PFLlib's "Averaged Test Accuracy" measures, where it is not
#: ``rs_test_acc``: PFLlib's FedProto reports only the nearest-global-prototype accuracy
SAME_METRIC = {"FedProto": "acc_proto"}
RECORDS = OUT / "pfllib_side_by_side.json"


def our_model(algo: str, model: str) -> str:
    """Our model with the same function as PFLlib's ``model`` as PFLlib's main.py builds it for ``algo``."""
    return "DNN-PFLlib" if model == "DNN" and algo in SPLIT_IN_PFLLIB else model


def common_flags(args: argparse.Namespace) -> list[str]:
    """The flags both sides get (PFLlib's spelling, which our main.py accepts), but the model."""
    return ["-nc", str(args.num_clients), "-ncl", "10", "-lbs", str(args.batch_size),
            "-ls", str(args.local_epochs), "-lr", str(args.lr), "-jr", "1", "-eg", "1", "-gr", str(args.rounds),
            "-dev", "cpu"]


#: PFLlib's main.py has no seed flag: it calls ``torch.manual_seed(0)`` on import (and its Client
#: constructor again), and never seeds numpy or ``random``. For a seed s ≠ 0 its unchanged main.py runs
#: through this launcher, which adds s to every ``torch.manual_seed`` argument (argv: s, then main.py's)
SEEDED_LAUNCHER = ("import runpy, sys, torch; offset = int(sys.argv.pop(1)); seed_torch = torch.manual_seed; "
                   "torch.manual_seed = lambda s: seed_torch(s + offset); sys.argv = sys.argv[1:]; "
                   "sys.path.insert(0, ''); runpy.run_path(sys.argv[0], run_name='__main__')")


def pfllib_argv(algo: str, flags: list[str], args: argparse.Namespace) -> list[str]:
    """PFLlib's main.py command line (after the interpreter); seed s ≠ 0 through :data:`SEEDED_LAUNCHER`."""
    argv = ["main.py", "-data", "MNIST", "-algo", algo, "-m", args.model, *common_flags(args), "-did", "0", *flags]
    return argv if args.seed == 0 else ["-c", SEEDED_LAUNCHER, str(args.seed), *argv]


def our_argv(algo: str, flags: list[str], data: Path, results: Path, args: argparse.Namespace) -> list[str]:
    return ["main.py", "-data", str(data), "-algo", algo, "-m", our_model(algo, args.model), *common_flags(args),
            "--seed", str(args.seed),
            "--engine", "sequential", "--num_threads", str(args.threads), "--results_dir", str(results), "-go", "sbs",
            "--overwrite", "--save_model", "False", "--progress", "False", *flags]


def _tail(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"]
    return lines[-1][:300]


def run_pfllib(workspace: Path, env: dict, python: str, argv: list[str], timeout: int, log: Path | None = None) -> dict:
    """PFLlib's ``main.py`` in the workspace: its accuracy per evaluation and seconds per round
    (what it printed goes to ``log``)."""
    started = time.perf_counter()
    try:
        done = subprocess.run([python, *argv], cwd=workspace / "system", capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s", "argv": argv}
    if log is not None:
        log.write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    times, accs = benchmark.parse_pfllib_stdout(done.stdout)
    record = {"argv": argv, "wall_s": time.perf_counter() - started, "acc": accs, "round_s": times}
    if done.returncode != 0 or not accs:
        record["error"] = f"exit {done.returncode}: {_tail(done)}"
    return record


def read_our_results(path: Path) -> dict:
    """Our results file's accuracy curve (``rs_test_acc``; ``rs_test_acc_global`` beside it where a
    personalised algorithm also has a global model), seconds per round and what it says it is."""
    import h5py

    with h5py.File(path, "r") as f:
        record = {"acc": [float(v) for v in f["rs_test_acc"][()]]}
        for name in f:  # the other accuracies an algorithm records: _global, _proto (FedProto), _mentee (FedKD)
            if name.startswith("rs_test_acc_") and name != "rs_test_acc_std":
                record["acc_" + name[len("rs_test_acc_"):]] = [float(v) for v in f[name][()]]
        if "rs_round_time" in f:
            record["round_s"] = [float(v) for v in f["rs_round_time"][()]]
        if "personalized" in f.attrs:
            record["personalized"] = bool(f.attrs["personalized"])
    return record


def run_ours(argv: list[str], results: Path, timeout: int) -> dict:
    """Our ``system/main.py``: its results file's curves."""
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, *argv], cwd=REPO / "system", capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s", "argv": argv}
    record: dict = {"argv": argv, "wall_s": time.perf_counter() - started}
    paths = sorted(results.glob("*.h5"))
    if done.returncode != 0 or not paths:  # a run stopped by divergence keeps its rounds so far: show them
        return record | (read_our_results(paths[0]) if paths else {}) | {"error": f"exit {done.returncode}: {_tail(done)}"}
    warnings = [line for line in done.stderr.splitlines() if "warning" in line.lower()]
    return record | read_our_results(paths[0]) | ({"warnings": warnings} if warnings else {})


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}"


def _median(values: list[float]) -> float | None:
    values = sorted(values)
    return values[len(values) // 2] if values else None


def table_lines(records: dict[str, dict], order: list[str] | None = None) -> list[str]:
    """The markdown table (final and best accuracy of both sides, their difference, seconds per round)
    and every algorithm's two per-round curves."""
    names = [n for n in (order or []) if n in records] + [n for n in records if n not in (order or [])]
    lines = ["| algorithm | flags (both sides) | our model | PFLlib final | ours final | ours − PFLlib | PFLlib best | ours best "
             "| PFLlib s/round | ours s/round |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        rec = records[name]
        theirs, ours = rec.get("pfllib", {}), rec.get("ours", {})
        metric = SAME_METRIC.get(name.split()[0], "acc")
        curves = [theirs.get("acc"), ours.get(metric)]  # a failed run's curve goes up to its failure
        cells = [c[-1] if c else None for c in curves]
        best = [max((a for a in c if a == a), default=None) if c else None for c in curves]  # a == a: not NaN
        stopped = [bool(side.get("error")) and bool(c) for side, c in zip((theirs, ours), curves)]
        comparable = None not in cells and len(curves[0]) == len(curves[1])  # a run that stopped early is not
        diff = f"{100 * (cells[1] - cells[0]):+.2f}" if comparable else "–"
        secs = [_median(s.get("round_s", [])[1:] or s.get("round_s", [])) for s in (theirs, ours)]
        flags = " ".join(rec.get("flags", [])) or "–"
        if rec.get("our_flags"):
            flags += f"` + ours `{' '.join(rec['our_flags'])}"
        argv = ours.get("argv", [])
        model = argv[len(argv) - 1 - argv[::-1].index("-m") + 1] if "-m" in argv else rec.get("our_model", "–")
        model += "" if metric == "acc" else f" (ours: rs_test_{metric})"
        final = [_pct(c) + (f" (failed after entry {len(curve) - 1})" if stop else "")
                 for c, curve, stop in zip(cells, curves, stopped)]
        lines.append(f"| {name} | `{flags}` | {model} | {final[0]} | {final[1]} | {diff} "
                     f"| {_pct(best[0])} | {_pct(best[1])} | " + " | ".join("–" if s is None else f"{s:.2f}" for s in secs) + " |")
    lines += ["", "Per-round test accuracy (%), evaluation before each round's training, as both print it "
              "(entry 0: the initial model):", ""]
    for name in names:
        rec = records[name]
        lines.append(f"**{name}**")
        lines.append("")
        for label, key in (("PFLlib", "pfllib"), ("ours", "ours")):
            side = rec.get(key, {})
            curve = " ".join(f"{100 * a:.2f}" for a in side.get("acc", []))
            if side.get("error"):
                lines.append(f"- {label}: failed ({side['error']})" + (f" after evaluating {curve}" if curve else ""))
            else:
                lines.append(f"- {label}: {curve}")
            for key_ in sorted(k for k in side if k.startswith("acc_")):
                lines.append(f"- {label} (rs_test_acc_{key_[4:]}): " + " ".join(f"{100 * a:.2f}" for a in side[key_]))
        lines.append("")
    return lines


def _unseeded(name: str) -> str:
    words = name.split()
    return " ".join(words[:-1]) if len(words) > 1 and words[-1].startswith("seed=") else name


def seed_summary_lines(records: dict[str, dict], order: list[str] | None = None) -> list[str]:
    """Over the seeds of each algorithm that has more than one ('<algo>' is seed 0, '<algo> seed=N' the
    others): final and best accuracy per side as mean ± std (population std, as experiments/common.py),
    PFLlib's own spread over its seeds (max − min of its finals), and whether the difference of the two
    means is within it (a difference PFLlib's runs show among themselves). A run counts where its
    curve has every evaluation (PFLlib's FedAS fails only after its last one). Empty when no algorithm
    has two seeds."""
    import numpy as np

    groups: dict[str, list[dict]] = {}
    for name, rec in records.items():
        groups.setdefault(_unseeded(name), []).append(rec)
    names = [n for n in (order or []) if n in groups] + [n for n in groups if n not in (order or [])]
    names = [n for n in names if len(groups[n]) > 1]
    if not names:
        return []

    lines = ["| algorithm | seeds (PFLlib / ours) | PFLlib final | ours final | ours − PFLlib (means) "
             "| PFLlib spread (max − min) | difference within it | PFLlib best | ours best |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        finals, bests = [], []
        for side in ("pfllib", "ours"):
            metric = "acc" if side == "pfllib" else SAME_METRIC.get(name.split()[0], "acc")
            curves = [rec.get(side, {}).get(metric) or [] for rec in groups[name]]
            rounds = max(len(c) for c in curves)
            curves = [c for c in curves if c and len(c) == rounds]
            finals.append([c[-1] for c in curves])
            bests.append([max(a for a in c if a == a) for c in curves])  # a == a: not NaN
        both = all(finals)
        gap = float(np.mean(finals[1]) - np.mean(finals[0])) if both else None
        spread = max(finals[0]) - min(finals[0]) if len(finals[0]) > 1 else None
        within = "–" if gap is None or spread is None else ("yes" if abs(gap) <= spread + 1e-12 else "no")
        lines.append(f"| {name} | {len(finals[0])} / {len(finals[1])} | {mean_std(finals[0])} | {mean_std(finals[1])} "
                     f"| {'–' if gap is None else f'{100 * gap:+.2f}'} | {_pct(spread)} | {within} "
                     f"| {mean_std(bests[0])} | {mean_std(bests[1])} |")
    return lines


def load_records(path: Path) -> dict[str, dict]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        raise SystemExit(f"{path} is not valid JSON; move it away to start afresh") from None


@contextlib.contextmanager
def records_lock(path: Path):
    """Held while a record is read, merged and written, so that two invocations (e.g. ``--side pfllib``
    and ``--side ours`` side by side) do not lose each other's record."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def save_records(path: Path, records: dict[str, dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(records, indent=1))
    os.replace(tmp, path)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pfllib", type=Path, required=True, help="a PFLlib checkout or export (holding system/main.py)")
    p.add_argument("--pfllib-python", default=sys.executable,
                   help="the interpreter for PFLlib's main.py (e.g. a venv that adds cvxpy for its FedPAC)")
    p.add_argument("--only", nargs="*", default=DEFAULT_ALGORITHMS, metavar="ALGO",
                   help=f"algorithms to run (default: {' '.join(DEFAULT_ALGORITHMS)})")
    p.add_argument("--data", type=Path, default=None,
                   help="our dataset folder (default: MNIST, 20 clients, Dirichlet 0.1, generated under experiments/out/data)")
    p.add_argument("--raw-dir", type=Path, default=MNIST_RAW, help="MNIST raw files for the default partition")
    p.add_argument("--test-per-client", type=int, default=0, metavar="N",
                   help="keep at most N test rows per client (a copy under experiments/out/data; 0: all)")
    p.add_argument("--model", default="DNN")
    p.add_argument("--rounds", type=int, default=10, help="-gr of both sides")
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--batch_size", type=int, default=10)
    p.add_argument("--local_epochs", type=int, default=1)
    p.add_argument("--num_clients", type=int, default=20)
    p.add_argument("--seed", type=int, default=0,
                   help="both sides' seed: our --seed; PFLlib's main.py, which has no seed flag and seeds torch with "
                        "0 itself, runs unchanged at 0 and otherwise with every torch.manual_seed offset by the seed "
                        "(it never seeds numpy). The records of a seed other than 0 are '<algo> seed=N'")
    p.add_argument("--flags", default="", help="extra flags for both sides, one string (e.g. '-lam 0.5')")
    p.add_argument("--our-flags", default="",
                   help="extra flags for our side only (e.g. a choice of ours that reproduces PFLlib's reading); the "
                        "record is then '<algo> <our flags>', and PFLlib's run of that algorithm with the same "
                        "flags is reused when there is one")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of each side (PFLlib's through OMP_NUM_THREADS; ours --num_threads)")
    p.add_argument("--records", type=Path, default=RECORDS,
                   help="the JSON file the records accumulate in; the table of all of them goes beside it as .md")
    p.add_argument("--side", choices=["both", "pfllib", "ours"], default="both",
                   help="run one side only and keep the other side of the record (on a loaded machine, one "
                        "invocation per side keeps both lanes busy: PFLlib's side takes about twice as long)")
    p.add_argument("--table-only", action="store_true",
                   help="run nothing: read our results files of the records again and rewrite the table")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per run")
    args = p.parse_args(argv)
    if not (args.pfllib / "system" / "main.py").is_file():
        p.error(f"--pfllib {args.pfllib}: no system/main.py there (give a PFLlib checkout or export)")
    unknown = [a for a in args.only if a not in ALGORITHM_FLAGS]
    if unknown:
        p.error(f"no PFLlib defaults known for {', '.join(unknown)}; known: {', '.join(ALGORITHM_FLAGS)}")
    return args


def cap_test_rows(data: Path, target: Path, per_client: int, seed: int = 1) -> Path:
    """A copy of the partition ``data`` in ``target`` whose clients keep at most ``per_client`` of their
    test rows (drawn without replacement, from ``seed``; the training rows are untouched), so that
    each evaluation, which both sides run over every client's test rows (and PFLlib over every
    training row too) every round, costs less on a loaded machine. Kept when it exists."""
    import shutil

    import numpy as np

    if (target / "config.json").is_file():
        return target
    config = json.loads((data / "config.json").read_text())
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(data / "train", tmp / "train")
    (tmp / "test").mkdir()
    rng = np.random.default_rng(seed)
    sizes = []
    for index in range(int(config["num_clients"])):
        with np.load(data / "test" / f"{index}.npz", allow_pickle=False) as archive:
            x, y = archive["x"], archive["y"]
        keep = np.sort(rng.permutation(len(y))[:per_client])
        np.savez_compressed(tmp / "test" / f"{index}.npz", x=x[keep], y=y[keep])
        sizes.append(len(keep))
    config["test_samples"] = sizes
    config["test_rows_capped"] = {"per_client": per_client, "seed": seed, "from": str(data)}
    (tmp / "config.json").write_text(json.dumps(config))
    os.replace(tmp, target)
    return target


def reread_ours(records: dict[str, dict]) -> None:
    """Each record's curves of ours read again from its results file (after this script learnt to read more)."""
    for rec in records.values():
        ours = rec.get("ours", {})
        if not ours.get("argv"):
            continue
        argv = ours["argv"]
        paths = sorted(Path(argv[argv.index("--results_dir") + 1]).glob("*.h5"))
        if paths:
            ours.update(read_our_results(paths[0]))


def write_tables(records: dict[str, dict], path: Path) -> None:
    """The table and curves of every record, then the summary over seeds where there are several, to
    ``path`` and stdout."""
    order = ["FedAvg", "Local", *DEFAULT_ALGORITHMS]
    lines = table_lines(records, order)
    summary = seed_summary_lines(records, order)
    if summary:
        lines += ["Over the seeds (final: the last evaluation):", "", *summary, ""]
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.table_only:
        records = load_records(args.records)
        reread_ours(records)
        save_records(args.records, records)
        write_tables(records, args.records.with_suffix(".md"))
        return 0
    data = args.data
    if data is None:
        data = OUT / "data" / f"MNIST-dir0.1-{args.num_clients}"
        generate_data("generate_MNIST.py", ["noniid", "-", "dir", "--alpha", "0.1", "--num-clients", str(args.num_clients),
                                            "--raw-dir", str(args.raw_dir), "--out-dir", str(data)])
    data = data.resolve()
    if args.test_per_client:
        data = cap_test_rows(data, OUT / "data" / f"{data.name}-test{args.test_per_client}", args.test_per_client)
    extra = shlex.split(args.flags)
    records = load_records(args.records)
    commit = benchmark.pfllib_commit(args.pfllib)
    with tempfile.TemporaryDirectory(prefix="pfllib-sbs-") as tmp:
        workspace = Path(tmp)
        env = benchmark.pfllib_workspace(args.pfllib.resolve(), data, workspace, python=args.pfllib_python)
        env["OMP_NUM_THREADS"] = str(args.threads)
        for algo in args.only:
            flags = ALGORITHM_FLAGS[algo] + extra
            seed = f"seed={args.seed}" if args.seed else ""
            base = " ".join(filter(None, [algo, args.flags, seed]))  # the record of the run both sides share
            label = " ".join(filter(None, [algo, args.flags, args.our_flags, seed]))
            results = OUT / "results" / "pfllib_side_by_side" / "".join(c if c.isalnum() else "_" for c in label)
            results.mkdir(parents=True, exist_ok=True)
            argv = pfllib_argv(algo, flags, args)
            earlier = records.get(base, {}).get("pfllib", {})
            reuse = bool(args.our_flags) and earlier.get("argv") == argv  # a failed run would fail again
            sides = {"both": "PFLlib and ours", "pfllib": "PFLlib only", "ours": "ours only"}[args.side]
            print(f"{label}: {'ours (PFLlib run reused)' if reuse else sides}, {args.rounds} rounds ...", flush=True)
            with ThreadPoolExecutor(2) as pool:
                theirs = None if reuse or args.side == "ours" else pool.submit(
                    run_pfllib, workspace, env, args.pfllib_python, argv, args.timeout, results / "pfllib_stdout.txt")
                ours = None if args.side == "pfllib" else pool.submit(
                    run_ours, our_argv(algo, flags + shlex.split(args.our_flags), data, results, args), results,
                    args.timeout)
                ran = {"pfllib": theirs and theirs.result(), "ours": ours and ours.result()}
            record = {"flags": flags, "our_flags": shlex.split(args.our_flags), "data": str(data),
                      "pfllib_commit": commit, "model": args.model, "our_model": our_model(algo, args.model)}
            with records_lock(args.records):  # another invocation may have added records (or this one's other side)
                records = load_records(args.records)
                kept = records.get(label, {})
                record["pfllib"] = ran["pfllib"] or (earlier if reuse else kept.get("pfllib", {}))
                record["ours"] = ran["ours"] or kept.get("ours", {})
                records[label] = record
                save_records(args.records, records)
            for side in ("pfllib", "ours"):
                if record[side].get("error"):
                    print(f"  {side}: {record[side]['error']}", flush=True)
    write_tables(records, args.records.with_suffix(".md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
