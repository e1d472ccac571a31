"""The host's work per client in a P2 round, apart from the compute.

P2 (benchmark.py: CIFAR-shaped clients of 50 training samples, 50 a round, B=10, E=1) with the
compute taken out: the batched engine's cohort step and the sequential engine's ``Client.sgd`` do
nothing, so what a round costs is the per-client and per-round Python and tensor bookkeeping that
a GPU cannot hide (on an H200 the captured steps of a P2 round take ~7 ms). Everything else runs
as in a real round: selection, planning, the hooks, the upload, aggregation, the plug-ins.

Prints process CPU microseconds per client of a round (median, 10th percentile and minimum over
``--rounds``; the minimum is the least disturbed by a shared machine), the rounds split by the
methods that run in them, and with ``--profile N`` cProfile's N costliest functions (cumulative
microseconds per client; cProfile inflates small calls 2-3x, so read the ranking, not the sizes).
Run from the repository root::

    nice -n 10 .venv/bin/python experiments/host_cost_per_client.py --engine batched
    nice -n 10 .venv/bin/python experiments/host_cost_per_client.py --engine sequential --profile 40
    nice -n 10 .venv/bin/python experiments/host_cost_per_client.py --engine batched --algo FedProx
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "system"))

import torch  # noqa: E402

import benchmark  # noqa: E402
from flcore.clients.clientbase import Client  # noqa: E402
from flcore.engines import batched, capture  # noqa: E402
from flcore.servers.serverbase import Server  # noqa: E402

#: the methods a round is split by (owner, name)
SECTIONS = [(Client, "plan_job"), (Client, "seed_round"), (Client, "shuffled_plan"), (Client, "open_job"),
            (Client, "finish_job"), (Client, "check_loss"), (Client, "count_gradient_samples"),
            (Client, "train_job"), (Server, "select_clients"), (Server, "make_package"), (Server, "aggregate"),
            (Server, "_check_finite"), (Server, "after_round"), (batched.BatchedEngine, "_run_steps"),
            (batched.BatchedEngine, "_train_chunk"), (batched.BatchedEngine, "train")]


def without_compute() -> None:
    """The cohort step and the local SGD do nothing (the rest of the round is untouched)."""
    capture._EagerSegment.step = lambda self, fn, inputs: None
    Client.sgd = lambda self, model, package, ctx, plan, lr: 0.0


def timed(owner: type, name: str, totals: dict[str, float]) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        start = time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            label = f"{owner.__name__}.{name}"
            totals[label] = totals.get(label, 0.0) + time.process_time() - start

    setattr(owner, name, wrapper)


def build(engine: str, model: str, clients: int, per_round: int, algorithm: str):
    spec = {"config": "P2", "warmup": 0, "rounds": 1000, "device": "cpu", "seed": 0, "p2_clients": clients,
            "extra": ["-algo", algorithm, "-m", model, "-jr", str(per_round / clients)]}
    server, _, _ = benchmark._build_server(spec, engine)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="batched", choices=["batched", "sequential"])
    parser.add_argument("--algo", default="FedAvg", help="the algorithm (P2's is FedAvg)")
    parser.add_argument("--model", default="MLR", help="the model (its size matters only to stacking and aggregation)")
    parser.add_argument("--clients", type=int, default=200, help="clients of the P2 data (each has 50 samples)")
    parser.add_argument("--per-round", type=int, default=50, help="clients a round (P2: 50)")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--sections", action="store_true", help="also split the rounds by method")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile's N costliest functions")
    args = parser.parse_args()
    torch.set_num_threads(1)
    without_compute()
    totals: dict[str, float] = {}
    if args.sections:
        for owner, name in SECTIONS:
            if args.engine == "batched" or owner is not batched.BatchedEngine:
                timed(owner, name, totals)
    server = build(args.engine, args.model, args.clients, args.per_round, args.algo)
    if args.sections:
        for plugin in server.plugins.values():  # the virtual clock times every upload
            timed(type(plugin), "after_training", totals)
    for rnd in range(3):  # warm-up: the first rounds build functorch's and the allocator's state
        server.run_round(rnd, evaluate=False)
    seconds, split = [], {}
    for rnd in range(3, 3 + args.rounds):
        totals.clear()
        start = time.process_time()
        result = server.run_round(rnd, evaluate=False)
        seconds.append(time.process_time() - start)
        for label, value in totals.items():
            split.setdefault(label, []).append(value)
    count = len(result.cohort)
    ranked = sorted(seconds)
    print(f"{args.engine}, {args.algo}, {args.model}, {count} clients a round, compute stubbed out: host CPU us per client "
          f"median {statistics.median(seconds) / count * 1e6:.0f}, p10 {ranked[len(ranked) // 10] / count * 1e6:.0f}, "
          f"min {ranked[0] / count * 1e6:.0f}")
    for label, values in sorted(split.items(), key=lambda kv: -statistics.median(kv[1])):
        low = sorted(values)[len(values) // 10]
        print(f"  {statistics.median(values) / count * 1e6:8.1f} {low / count * 1e6:8.1f} us/client (median, p10)  {label}")
    if args.profile:
        profile = cProfile.Profile(time.process_time)
        for rnd in range(3 + args.rounds, 3 + 2 * args.rounds):
            profile.enable()
            server.run_round(rnd, evaluate=False)
            profile.disable()
        calls = count * args.rounds
        rows = [(cum, own, n, f"{path.split('/')[-1]}:{line}({name})")
                for (path, line, name), (_, n, own, cum, _) in pstats.Stats(profile).stats.items()]
        print("cProfile: cumulative us/client, own us/client, calls/client, function")
        for cum, own, n, name in sorted(rows, reverse=True)[: args.profile]:
            print(f"  {cum / calls * 1e6:9.1f} {own / calls * 1e6:9.1f} {n / calls:7.2f}  {name}")


if __name__ == "__main__":
    main()
