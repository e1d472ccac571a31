"""Speed benchmark of the training engines: seconds per round, samples per second, peak memory.

Run from ``system/``::

    python benchmark.py                       # P1 P2 P3, sequential and batched, 5 timed rounds each
    python benchmark.py --quick               # smoke run: 1 warm-up + 2 timed rounds
    python benchmark.py --only P1 --engines sequential threaded pfllib   # against PFLlib's procedure
    python benchmark.py --only P3 --engines threaded --fill-state --state-dtype float16
    python benchmark.py --only P3 --engines threaded --fill-state --state-device disk
    python benchmark.py --device cuda         # GPU (peak GPU memory reported too)
    python benchmark.py --device cuda --only P1 --engines batched batched+eager --pfllib ../PFLlib
                                              # captured vs eager cohort step, and PFLlib's own main.py
    python benchmark.py --only P1 --engines batched+bf16 --rounds 19   # 20 rounds of bf16 (--precision)
    python benchmark.py --only P2 P3 --engines sequential threaded ray   # Ray actors (needs ./prepare.sh --ray)

Engines: ``sequential``, ``threaded``, ``batched``, ``auto``, ``ray`` (the platform's engines, see
``flcore/engines``; ``ray`` starts a local Ray instance in the warm-up round, whose start-up cost
the JSON records as ``startup_s``, with the actors' state and peak memory) and ``pfllib``: PFLlib's FedAvg procedure re-implemented
(``runner/pfllib_baseline.py``), run on the same data, initial model, seed and threads, so that the
speed-up over PFLlib is measured in one run rather than against a figure from another day.

Configurations:

* **P1**: PFLlib's README set-up: MNIST, ``CNN``, 20 clients, Dirichlet 0.1, batch 10, 1 local
  epoch, lr 0.005, full participation, evaluation every round (as PFLlib). The data are real
  MNIST partitioned by ``dataset/generate_MNIST.py`` (generated once into ``--data-dir``); where
  the generator or the raw files are missing, random class-prototype images of the same shapes
  and Dirichlet(0.1) sizes are used instead, and the table says ``synthetic``.
* **P2**: cross-device: CIFAR-10-shaped inputs [3, 32, 32], 10 classes, 1,000 clients with 50
  training samples each (plus 10 test samples), 50 clients per round, batch 10, 1 epoch, ``CNN``.
  ``--p2-data FOLDER`` uses a generated dataset folder (e.g. real CIFAR-10) instead of random
  tensors. Evaluated every ``--p2-eval-gap`` rounds (default: only outside the timed rounds, so
  the times compare training).
* **P3**: scale: P2's clients with SCAFFOLD (per-client control variates in the state store).
  The JSON records, round by round, the state bytes and the process RSS, so one sees that memory
  grows with the per-client state, not with model copies. ``--fill-state`` gives every client its
  control variate after the warm-up (as after a long run; needs ``--warmup`` >= 1), so the timed
  rounds show the memory of the full state; ``--state-dtype float16`` stores it in half the bytes
  and ``--state-device disk`` in files, outside the process's memory.

Each (configuration, engine) runs in a fresh subprocess so that the peak RSS is its own. Only
rounds are timed (``Server.train``'s per-round times: evaluation + training + aggregation); the
median is taken after ``--warmup`` rounds (the first round pays one-off costs such as functorch's
set-up). Results are printed as a table with the batched/sequential ratios and written to
``results/benchmark-<timestamp>.json``. Timings on a machine shared with other work are noisy;
the JSON stores the load average before and after each run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from speedbench.configs import BASELINE, CONFIGS, PFLLIB_P1  # noqa: E402
from speedbench.data import prepare_mnist, synthetic_mnist, synthetic_p2  # noqa: E402, F401
from speedbench.pfllib import (PFLLIB_P1_FLAGS, PFLLIB_STUBS, _module_missing, parse_pfllib_stdout, pfllib_commit,  # noqa: E402, F401
                               pfllib_lines, pfllib_own_run, pfllib_workspace, write_pfllib_partition)
from speedbench.tables import device_name, print_table  # noqa: E402
from speedbench.worker import (BACKEND_VARIANTS, EVAL_VARIANTS, PRECISION_VARIANTS, STEP_RUNNER_VARIANTS,  # noqa: E402, F401
                               _build_server, run_worker, split_variant)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per configuration (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--quick", action="store_true", help="smoke run: 1 warm-up + 2 timed rounds")
    p.add_argument("--only", nargs="+", default=list(CONFIGS), choices=list(CONFIGS), metavar="CFG",
                   help="configurations to run (P1 P2 P3)")
    p.add_argument("--engines", nargs="+", default=["sequential", "batched"],
                   help=f"engines to compare (sequential, batched, auto; {BASELINE}: PFLlib's FedAvg procedure "
                        "re-implemented, the same-run baseline, P1/P2 on the CPU only)")
    p.add_argument("--chunk", type=int, default=0, help="--cohort_chunk of the batched engines (0 = whole cohort)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads in each run (0 = torch's default)")
    p.add_argument("--workers", type=int, default=0, help="--workers of the threaded/auto engines (0 = one per core)")
    p.add_argument("--ray-workers", type=int, default=0, help="--ray_workers of the ray engine (0 = one per core)")
    p.add_argument("--state-dtype", default=None, choices=["float32", "float16", "bfloat16"],
                   help="--state_dtype of the runs (per-client state storage; P3)")
    p.add_argument("--state-device", default=None, choices=["auto", "cpu", "disk"],
                   help="--state_device of the runs (disk: per-client state in files, P3)")
    p.add_argument("--fill-state", action="store_true",
                   help="after the warm-up, give every client the state vectors (P3: SCAFFOLD's control variate) "
                        "as after a long run, so the timed rounds show the memory of the full state")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", type=Path, default=REPO / "dataset" / "benchmark",
                   help="where P1's generated MNIST folder is kept")
    p.add_argument("--mnist-raw", type=Path, default=REPO.parent / "shared" / "data" / "MNIST" / "raw",
                   help="MNIST IDX files for generate_MNIST.py --raw-dir")
    p.add_argument("--synthetic-mnist", action="store_true", help="use random MNIST-shaped data for P1")
    p.add_argument("--p2-data", type=str, default=None,
                   help="dataset folder for P2/P3 (e.g. CIFAR-10 with 1000 clients); default random tensors")
    p.add_argument("--p2-clients", type=int, default=1000,
                   help="clients of the synthetic P2/P3 data (the issue's 1000; fewer for a smoke run)")
    p.add_argument("--p2-eval-gap", type=int, default=0,
                   help="evaluate P2/P3 every N rounds (0 = only outside the timed rounds)")
    p.add_argument("--interleave", action="store_true",
                   help="also run the engines in one process taking turns round by round (time ratios that a "
                        "changing load on a shared machine cannot bias; the peak memory is then shared)")
    p.add_argument("--interleave-only", action="store_true", help="only the interleaved runs (no memory figures)")
    p.add_argument("--precision", default="fp32", choices=list(PRECISION_VARIANTS),
                   help="--precision of our runs (an --engines entry's +bf16 etc. overrides it)")
    p.add_argument("--pfllib", type=Path, default=None, metavar="DIR",
                   help="a PFLlib checkout: also run its own main.py on P1's partition (same flags, after ours) "
                        "and print our speed-up over it")
    p.add_argument("--pfllib-rounds", type=int, default=None,
                   help="timed rounds of PFLlib's own run (default --rounds)")
    p.add_argument("--pfllib-threads", type=int, default=0,
                   help="OMP_NUM_THREADS of PFLlib's own run (0 = its default, one per core; 1 is fair on a "
                        "loaded machine, where the CPU-second ratio is the figure to read)")
    p.add_argument("--timeout", type=int, default=3600, help="seconds allowed per (configuration, engine) run")
    p.add_argument("--out", type=Path, default=None, help="JSON file (default results/benchmark-<timestamp>.json)")
    p.add_argument("--worker", type=str, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup = 2, 1
    if args.pfllib is not None and args.warmup + (args.pfllib_rounds or args.rounds) < 2:
        # PFLlib's -gr N runs rounds 0..N, so one round would be -gr 0, which its summary divides by
        print("error: --pfllib needs --warmup + --pfllib-rounds (or --rounds) of at least 2 "
              "(PFLlib cannot run a single round); e.g. --warmup 1 --rounds 1", file=sys.stderr)
        raise SystemExit(2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker is not None:
        print("BENCHMARK-RESULT " + json.dumps(run_worker(json.loads(args.worker))), flush=True)
        return 0
    notes: dict[str, str] = {}
    data_paths: dict[str, str | None] = {}
    for name in args.only:
        if CONFIGS[name]["data"] == "mnist":
            folder, note = (None, "synthetic (--synthetic-mnist)") if args.synthetic_mnist else prepare_mnist(
                args.data_dir, args.mnist_raw)
            data_paths[name] = str(folder) if folder else None
        else:
            data_paths[name] = args.p2_data
            note = f"data {args.p2_data}" if args.p2_data else "synthetic CIFAR-10-shaped tensors (no CIFAR-10 here)"
            if not args.p2_data and args.p2_clients != 1000:
                note += f", {args.p2_clients} clients"
        notes[name] = note
    jobs: list[tuple[str, list[str]]] = []
    for name in args.only:
        if not args.interleave_only:
            jobs += [(name, [engine]) for engine in args.engines]
        if (args.interleave or args.interleave_only) and len(args.engines) > 1:
            jobs.append((name, list(args.engines)))
    results = []
    for name, engines in jobs:
        spec = {"config": name, "engines": engines, "device": args.device, "rounds": args.rounds,
                "warmup": args.warmup, "seed": args.seed, "chunk": args.chunk, "threads": args.threads,
                "workers": args.workers, "ray_workers": args.ray_workers, "state_dtype": args.state_dtype, "fill_state": args.fill_state,
                "state_device": args.state_device, "p2_clients": args.p2_clients,
                "data_path": data_paths[name], "eval_gap": args.p2_eval_gap or None, "precision": args.precision}
        load_before = os.getloadavg()
        print(f"running {name} with {' and '.join(engines)}{' interleaved' if len(engines) > 1 else ''} ...",
              file=sys.stderr, flush=True)
        try:
            done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                                  cwd=HERE, capture_output=True, text=True, timeout=args.timeout)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("BENCHMARK-RESULT ")]
            if done.returncode != 0 or not lines:
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
                got = [{"config": name, "engine": e, "error": f"exit {done.returncode}: {tail}"} for e in engines]
            else:
                got = json.loads(lines[-1][len("BENCHMARK-RESULT "):])["results"]
        except subprocess.TimeoutExpired:
            got = [{"config": name, "engine": e, "error": f"timed out after {args.timeout} s"} for e in engines]
        for result in got:
            result["load_avg_before"], result["load_avg_after"] = load_before, os.getloadavg()
            result["data"] = notes[name]
            results.append(result)
    own = None
    if args.pfllib is not None and "P1" in args.only:
        print("running PFLlib's own main.py on P1 ...", file=sys.stderr, flush=True)
        own = pfllib_own_run(args.pfllib.resolve(), Path(data_paths["P1"]) if data_paths.get("P1") else None,
                             args.device, args.pfllib_rounds or args.rounds, args.warmup, args.timeout,
                             args.pfllib_threads)
    print_table(results, args.device, notes)
    if own is not None:
        print("\n".join(pfllib_lines(own, results)))
    out = args.out or REPO / "results" / f"benchmark-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    import torch

    meta = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "device": device_name(args.device), "host": platform.node(),
        "python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
        "argv": sys.argv[1:], "rounds": args.rounds, "warmup": args.warmup, "pfllib_p1_reference": PFLLIB_P1,
        "configs": {k: CONFIGS[k] | {"data": notes[k]} for k in args.only},
        "pfllib_own_run": own,
    }
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str))
    print(f"written: {out}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

