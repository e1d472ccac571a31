"""Long runs: does a run's memory stay flat over thousands of rounds?

Generates scikit-learn's digits (10 clients, Dirichlet 0.5, ``dataset/generate_Digits.py``) into a
temporary folder, then runs each configuration below for ``--rounds`` rounds (default 2000, the
``-gr`` of the README's own command) in a fresh process, one after another, and samples every
``--every`` rounds (default 100) the process's resident set size (``/proc/self/statm``, so Linux
only) and, on a GPU, the memory torch has allocated on it::

    python experiments/soak.py                               # all four configurations, CPU
    python experiments/soak.py --rounds 500 --only fedavg ditto
    python experiments/soak.py --device cuda --json soak.json

Configurations (the demo's model and settings: ``-m DNN -lbs 10 -lr 0.05``, every other flag at
main.py's default, so each round is evaluated):

* ``fedavg``: FedAvg;
* ``ditto``: Ditto, a personalised algorithm (each client keeps a personal model besides the global one);
* ``attack``: FedAvg under ``--attack sign_flip --attack_fraction 0.2`` with ``--robust median``;
* ``fedasync``: FedAsync, asynchronous, with ``--straggler_delay 2`` (uploads arrive up to 2 rounds late).

Printed per configuration: the resident set size at the first sample and at the last, the growth
per 1,000 rounds (least-squares slope over the samples from round ``--every`` on; the first rounds
load libraries and warm caches, and are not counted), the GPU's allocated memory likewise, the
seconds per round between the first sample and the last, and the wall time; each sample is also
printed on stderr as it is taken, so a run stopped early still shows the rounds it reached.
``--json`` also writes every sample. The growth that
``tests/experiments/test_soak.py`` tolerates on a few hundred toy rounds is
:data:`GROWTH_BOUND_KB_PER_ROUND`, measured there by :func:`typical_growth_per_round`, the median of the
growth between consecutive samples, which a single step of the resident set does not move.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SYSTEM = REPO / "system"

#: the growth of the resident set a healthy run stays under, in KiB per round (the memory test's bound)
GROWTH_BOUND_KB_PER_ROUND = 16.0

COMMON = ["-m", "DNN", "-lbs", "10", "-lr", "0.05", "--progress", "False", "-q", "True"]
CONFIGURATIONS: dict[str, list[str]] = {
    "fedavg": ["-algo", "FedAvg"],
    "ditto": ["-algo", "Ditto"],
    "attack": ["-algo", "FedAvg", "--attack", "sign_flip", "--attack_fraction", "0.2", "--robust", "median"],
    "fedasync": ["-algo", "FedAsync", "--straggler_delay", "2"],
}


def rss_mb() -> float:
    """This process's resident set size now, in MiB (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def gpu_allocated_mb() -> float | None:
    """The memory torch has allocated on the current GPU, in MiB (None without one in use)."""
    import torch

    return torch.cuda.memory_allocated() / 2**20 if torch.cuda.is_initialized() else None


def sampled_run(argv: Sequence[str], every: int,
                report: Callable[[dict], None] | None = None) -> list[dict[str, float | None]]:
    """``main.main(argv)`` in this process, with a sample after every ``every``-th training round
    (``round``, ``rss_mb``, ``gpu_mb``, ``seconds`` since the call began), each also handed to
    ``report`` as it is taken; raises SystemExit when the run fails."""
    if str(SYSTEM) not in sys.path:
        sys.path.insert(0, str(SYSTEM))
    import main
    from flcore.servers.serverbase import Server

    samples: list[dict[str, float | None]] = []
    original: Callable = Server.run_round
    started = time.perf_counter()

    def run_round(self, rnd, *args, **kwargs):
        result = original(self, rnd, *args, **kwargs)
        if rnd % every == 0 and rnd > 0:
            samples.append({"round": rnd, "rss_mb": rss_mb(), "gpu_mb": gpu_allocated_mb(),
                            "seconds": time.perf_counter() - started})
            if report is not None:
                report(samples[-1])
        return result

    Server.run_round = run_round
    try:
        code = main.main(list(argv))
    finally:
        Server.run_round = original
    if code != 0:
        raise SystemExit(f"main.py {' '.join(argv)} failed (exit status {code})")
    return samples


def _series(samples: Sequence[dict[str, float | None]], key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The rounds and ``key``'s values of the samples that have one (None: fewer than two)."""
    points = [(s["round"], s[key]) for s in samples if s[key] is not None]
    return tuple(np.array(points, dtype=float).T) if len(points) >= 2 else None


def growth_per_round(samples: Sequence[dict[str, float | None]], key: str) -> float | None:
    """Least-squares slope of ``key`` (MiB) against the round, in MiB per round (None: fewer than
    two samples or no value)."""
    if (series := _series(samples, key)) is None:
        return None
    rounds, values = series
    return float(np.polyfit(rounds, values, 1)[0])


def typical_growth_per_round(samples: Sequence[dict[str, float | None]], key: str) -> float | None:
    """The median over consecutive samples of ``key``'s growth (MiB) per round between them, in MiB
    per round (None: fewer than two samples or no value). A leak grows in every interval and shows
    here in full; a one-off step (the allocator taking a new arena, a cache filled once) falls in one
    interval and does not, where it tilts the least-squares slope of :func:`growth_per_round`."""
    if (series := _series(samples, key)) is None:
        return None
    rounds, values = series
    return float(np.median(np.diff(values) / np.diff(rounds)))


def generate_digits(folder: Path) -> Path:
    """scikit-learn's digits over 10 clients (Dirichlet 0.5) in ``folder/Digits``, as the demo's."""
    data = folder / "Digits"
    subprocess.run([sys.executable, "generate_Digits.py", "noniid", "-", "dir", "--num-clients", "10",
                    "--alpha", "0.5", "--out-dir", str(data)], cwd=REPO / "dataset", check=True,
                   stdout=subprocess.DEVNULL)
    return data


def child(args: argparse.Namespace) -> None:
    """One configuration in this (fresh) process; its samples as JSON on the last line of stdout."""
    argv = ["-data", args.data, "--results_dir", args.results_dir, "-gr", str(args.rounds), "-dev", args.device,
            *COMMON, *CONFIGURATIONS[args.child]]
    started = time.perf_counter()

    def report(sample: dict) -> None:  # on stderr as it is taken: a run stopped early still has its samples
        print(f"{args.child}: round {sample['round']}, RSS {sample['rss_mb']:.1f} MiB, {sample['seconds']:.0f} s",
              file=sys.stderr, flush=True)

    samples = sampled_run(argv, args.every, report)
    print(json.dumps({"samples": samples, "seconds": time.perf_counter() - started}))


def describe(name: str, record: dict) -> str:
    samples = record["samples"]
    rss = growth_per_round(samples, "rss_mb")
    gpu = growth_per_round(samples, "gpu_mb")
    first, last = samples[0], samples[-1]
    text = (f"{name:9s} rounds {first['round']:>5}..{last['round']:<5} RSS {first['rss_mb']:7.1f} -> "
            f"{last['rss_mb']:7.1f} MiB ({1000 * rss:+.2f} MiB per 1,000 rounds)")
    if gpu is not None:
        text += (f", GPU allocated {first['gpu_mb']:.1f} -> {last['gpu_mb']:.1f} MiB "
                 f"({1000 * gpu:+.3f} MiB per 1,000 rounds)")
    if last["round"] > first["round"]:
        text += f", {(last['seconds'] - first['seconds']) / (last['round'] - first['round']):.3f} s/round"
    return text + f", {record['seconds']:.0f} s"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000, help="training rounds of each run (-gr)")
    parser.add_argument("--every", type=int, default=100, help="rounds between two samples")
    parser.add_argument("--only", nargs="+", choices=list(CONFIGURATIONS), default=list(CONFIGURATIONS))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--json", type=Path, default=None, help="also write every sample to this file")
    parser.add_argument("--child", choices=list(CONFIGURATIONS), help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--results_dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < args.every or args.every < 1:
        parser.error(f"--rounds {args.rounds} must be at least --every {args.every} (and --every at least 1)")
    if args.child:
        child(args)
        return 0
    records = {}
    with tempfile.TemporaryDirectory(prefix="soak-") as scratch:
        data = generate_digits(Path(scratch))
        for name in args.only:
            command = [sys.executable, __file__, "--child", name, "--data", str(data), "--results_dir",
                       str(Path(scratch) / name), "--rounds", str(args.rounds), "--every", str(args.every),
                       "--device", args.device]
            done = subprocess.run(command, stdout=subprocess.PIPE, text=True)  # its samples, errors: on stderr
            if done.returncode != 0:
                print(f"error: {name} failed (exit status {done.returncode}); its error output is above", file=sys.stderr)
                return 1
            records[name] = json.loads(done.stdout.strip().splitlines()[-1])
            print(describe(name, records[name]), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"rounds": args.rounds, "every": args.every, "device": args.device,
                                         "runs": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
