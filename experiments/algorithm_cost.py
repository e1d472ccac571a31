"""The cost of a round of every registered algorithm, relative to FedAvg's on the same data, model and
engine (the aim: every pFL algorithm's round within 1.3x FedAvg's).

Each algorithm runs ``-gr 4`` rounds through ``main.main`` with evaluation only before the first and
after the last round (``-eg 100``), so the rounds timed (the 2nd to 4th, after a warm-up round) are
training and aggregation only; the figure is their median ``rs_round_time``. Every algorithm sees
the same partition and flags; those that need more (KT-pFL's public data) get it from ``NEEDS``.
``VARIANTS`` adds rows of an algorithm with other flags, where its defaults skip its costly part
(APPLE's -dlr 0 never learns the DR vectors, so it skips their gradient: the row "APPLE -dlr 0.01"
times the learning method; FedNTD's -bt 0 weights its distillation 0 and skips it: "FedNTD -bt 1").
The runs' result files go to a temporary folder (only their round times are read), so two runs of
this script can go side by side, e.g. ``--malloc_keep_freed on`` against ``off``.

    python experiments/algorithm_cost.py                      # every algorithm, MNIST CNN, 20 clients
    python experiments/algorithm_cost.py --only FedAvg Ditto --engine threaded
    python experiments/algorithm_cost.py --only pFedEff --profile 25     # and where each run's time went

FedAvg, the baseline, is measured fairly: one untimed FedAvg run first warms the process up (imports,
oneDNN's kernel caches, the allocator; the first run of a process was 15-20% slow), then FedAvg is
timed both before and after every other algorithm, and the ratios are against the mean of those two
(both are printed, so a drift of the machine during the run shows).

The table (slowest first) is printed and written to ``experiments/out/algorithm_cost.md``. Times
are wall-clock seconds: run it on an otherwise idle machine, and compare ratios from one run only.
On a loaded machine, ``--clock cpu`` times each training round by the CPU seconds of this process
instead (with one thread and the sequential engine: the round's own work, whatever else runs).
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import h5py

from common import MNIST_RAW, OUT, generate_data, main, write_table
from flcore.registry import ALGORITHMS, load_all
from flcore.servers.serverbase import Server

#: flags an algorithm cannot run without, on top of the common ones
NEEDS = {"KT-pFL": ["--public_data", "0.05"], "Sageflow": ["--public_data", "0.05"]}
#: extra rows: name -> (algorithm, its flags)
VARIANTS = {"APPLE -dlr 0.01": ("APPLE", ["-dlr", "0.01"]), "FedNTD -bt 1": ("FedNTD", ["-bt", "1"]),
            "FedRep -pls 5": ("FedRep", ["-pls", "5"])}


def round_seconds(row: str, data: Path, args: argparse.Namespace) -> float:
    """Median seconds of rounds 2..N of one run of the table's ``row`` (rounds without evaluation)."""
    algorithm, flags = VARIANTS.get(row, (row, []))
    folder = args.results  # a temporary folder: only the round times are read back
    argv = ["-data", str(data), "-m", args.model, "-algo", algorithm, "-gr", str(args.rounds), "-eg", "100",
            "-lbs", "10", "-ls", "1", "-lr", "0.01", "-jr", "1", "-dev", "cpu", "--engine", args.engine,
            "--num_threads", str(args.threads), "--results_dir", str(folder), "-go", "cost", "--overwrite",
            "--progress", "False", "-q", "True", "--save_model", "False", *NEEDS.get(algorithm, []), *flags]
    if args.malloc_keep_freed:
        argv += ["--malloc_keep_freed", args.malloc_keep_freed]
    cpu_times: list[float] = []
    run_round = Server.run_round

    def cpu_timed(server, rnd, evaluate=True, train=True, cohort=None):
        """``Server.run_round``, recording the CPU seconds of every training round (as rs_round_time)."""
        start = time.process_time()
        result = run_round(server, rnd, evaluate, train, cohort)
        if train:
            cpu_times.append(time.process_time() - start)
        return result

    timing = mock.patch.object(Server, "run_round", cpu_timed) if args.clock == "cpu" else contextlib.nullcontext()
    profiler = cProfile.Profile() if args.profile else None
    with contextlib.redirect_stdout(io.StringIO()), timing:
        code = profiler.runcall(main.main, argv) if profiler else main.main(argv)
    if profiler:  # where the run's time went, for telling a method's own work from overhead
        report = io.StringIO()
        pstats.Stats(profiler, stream=report).sort_stats("tottime").print_stats(args.profile)
        profile_path = OUT / "algorithm_cost_profiles" / f"{row.replace(' ', '_')}.txt"
        profile_path.parent.mkdir(parents=True, exist_ok=True)
        profile_path.write_text(report.getvalue())
    if code != 0:
        raise RuntimeError(f"{algorithm}: main.py exited with {code}")
    path = folder / f"{data.name}_{algorithm}_cost_0.h5"
    with h5py.File(path) as f:
        times = cpu_times if args.clock == "cpu" else list(f["rs_round_time"][()])
    return statistics.median(times[1:])


def main_(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=None, help="algorithms (or VARIANTS rows) to time (FedAvg is always timed)")
    parser.add_argument("--engine", default="sequential", choices=["sequential", "threaded", "batched", "auto"])
    parser.add_argument("--threads", type=int, default=1, help="--num_threads of each run")
    parser.add_argument("--model", default="CNN")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per run (the first is not timed)")
    parser.add_argument("--data", type=Path, default=None, help="dataset folder (default: MNIST, 20 clients x 300)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall-clock seconds of a round (rs_round_time), or the CPU seconds of this process")
    parser.add_argument("--malloc_keep_freed", choices=["on", "off"], default=None,
                        help="main.py's --malloc_keep_freed for every run (default: main.py's); the first run sets "
                             "it for the whole process, so compare on and off in two processes")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile every run (cProfile; the times include its overhead) and write its N "
                             "costliest functions to experiments/out/algorithm_cost_profiles/<row>.txt")
    args = parser.parse_args(argv)
    if args.profile < 0:
        parser.error(f"--profile {args.profile}: give the number of functions to list (0 = no profile)")
    data = args.data
    if data is None:
        data = OUT / "data" / "cost_MNIST"
        generate_data("generate_MNIST.py", ["noniid", "-", "dir", "--num-clients", "20", "--samples-per-client",
                                            "300", "--raw-dir", str(MNIST_RAW), "--out-dir", str(data)])
    load_all()
    names = args.only or [*ALGORITHMS.names(), *VARIANTS]
    others = [n for n in names if n != "FedAvg"]
    seconds, failed, baseline = {}, {}, []
    with tempfile.TemporaryDirectory(prefix="algorithm_cost-") as results:  # two runs may go side by side
        args.results = Path(results)
        round_seconds("FedAvg", data, args)  # warm-up, untimed: the first run of a process is slower
        for name in ["FedAvg", *others, "FedAvg"]:
            started = time.perf_counter()
            try:
                seconds[name] = round_seconds(name, data, args)
            except Exception as exc:  # noqa: BLE001 - one algorithm's failure is reported, the table goes on
                failed[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
            if name == "FedAvg" and name in seconds:
                baseline.append(seconds[name])
            print(f"{name:>14}: {seconds.get(name, float('nan')):.3f} s/round "
                  f"({time.perf_counter() - started:.0f} s for the run)", flush=True)
    if not baseline:
        raise SystemExit(f"FedAvg failed: {failed.get('FedAvg')}")
    failed.pop("FedAvg", None)  # one of the two timings suffices
    base = seconds["FedAvg"] = statistics.mean(baseline)
    lines = [f"{'CPU s' if args.clock == 'cpu' else 'Seconds'} per training round ({args.model}, MNIST 20 clients x 300 samples, B = 10, E = 1, all clients, "
             f"engine {args.engine}, {args.threads} thread(s); median of rounds 2-{args.rounds}); FedAvg timed before "
             f"and after the others: {' and '.join(f'{b:.3f}' for b in baseline)} s, their mean is the baseline", "",
             "| algorithm | s/round | x FedAvg |", "|---|---:|---:|"]
    for name in sorted(seconds, key=seconds.get, reverse=True):
        lines.append(f"| {name} | {seconds[name]:.3f} | {seconds[name] / base:.2f} |")
    lines += [f"| {name} | failed: {why} | |" for name, why in failed.items()]
    write_table("algorithm_cost", lines)


if __name__ == "__main__":
    main_()
