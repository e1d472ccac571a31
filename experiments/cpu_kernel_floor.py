"""The CPU compute floor of benchmark P1 (MNIST CNN, 20 clients, B = 10, E = 1, eval every round).

The CPU goals (P1 >= 2.5x PFLlib's own run in fp32, >= 3.5x in bf16) ask for a round of at most
PFLlib's round / 2.5 (/ 3.5) on the same machine (PFLlib's own round moves with the machine's load, so
set the floor beside a PFLlib run made at the same time; docs/results/performance.md). This script measures what the CNN's arithmetic alone costs here, with
no federated machinery at all, so a round's floor can be set against the goal:

* the machine's dense fp32 rate (one large matrix product), for scale;
* one SGD step of P1's CNN (forward, backward, update) per sample at batch 10 (P1's batch, what every
  client step is), and at larger batches (what no B = 10 client can use, shown as the lower bound);
* one evaluation forward per sample at the evaluation batch (128 on a CPU) and at larger ones.

floor(B) = train_rows x step_per_sample(B) + eval_rows x forward_per_sample(best), with P1's row counts
(train 52,490 = its 5,249 steps x 10; evaluation = the test split plus PFLlib's train loss over every
training row). Run it on an otherwise idle machine:

    python experiments/cpu_kernel_floor.py [--cores 2] [--dtype float32|bfloat16]

Every kernel runs on one thread, as the threaded engine's workers do (one intra-op thread each), and
the floor divides the per-worker seconds by ``--cores``. Two things make the bare figures honest:

* the allocator is set as ``main.py`` sets it (``--malloc_keep_freed``, on by default): with glibc's
  defaults the bare step refaults ~1,000 pages a step (docs/results/performance.md), which the platform's runs do not pay;
* each figure is measured twice, alone and beside ``--cores`` - 1 busy neighbours (processes running
  the same batch-10 step), because P1's workers share the cores' caches and memory: one worker's step
  is slower when the other trains too. The floor uses the loaded figures.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "system"))
from flcore.frozen import frozen_copy  # noqa: E402  (the CPU evaluation's traced, frozen model)
from utils.allocator import MODES, keep_freed_memory  # noqa: E402


def cnn() -> nn.Module:
    # P1's model: the registry's "CNN" (McMahan et al.'s FedAvgCNN) for 1x28x28 input
    return nn.Sequential(
        nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10))


def best_of(fn, seconds: float = 2.0, repeats: int = 3) -> float:
    """Median of ``repeats`` timings, each the mean of as many calls as fill ``seconds``."""
    fn()
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < seconds / 4:
        fn()
        calls += 1
    calls = max(1, int(calls * 4 / repeats))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return sorted(times)[len(times) // 2]


def sgd_step(model: nn.Module, batch: int, autocast: bool):
    """One local step of P1's procedure (forward, cross-entropy, backward, SGD) on random inputs."""
    optimiser = torch.optim.SGD(model.parameters(), lr=0.005)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, 1, 28, 28).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,))

    def step():
        optimiser.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(model(x), y)
        loss.backward()
        optimiser.step()
    return step


class Neighbours:
    """``count`` processes running P1's batch-10 step until closed: the other workers of a round."""

    def __init__(self, count: int, argv: list[str]):
        self.procs = [subprocess.Popen([sys.executable, __file__, "--busy", *argv]) for _ in range(count)]
        time.sleep(3.0 if count else 0.0)  # past their imports and warm-up

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def measure(args, autocast: bool, gemm_rate: float, flops: float) -> tuple[dict, dict]:
    """Per-sample seconds of the SGD step at each batch and of the evaluation forward at each batch."""
    model = cnn().to(memory_format=torch.channels_last)  # channels-last, as the platform's CNN runs on a CPU
    steps = {}
    for batch in (10, 50, 200, 1000):
        steps[batch] = best_of(sgd_step(model, batch, autocast)) / batch
        rate = 3 * flops / steps[batch] / 1e9  # backward ~ twice the forward
        print(f"  SGD step, batch {batch:5d}: {steps[batch] * 1e6:7.1f} us/sample ({steps[batch] * batch * 1e3:.2f} ms/step, "
              f"{rate:.1f} GFLOP/s = {rate / gemm_rate:.0%} of the GEMM rate)")
    forwards = {}
    model.eval()
    for batch in (128, 512, 2048):
        x = torch.randn(batch, 1, 28, 28).to(memory_format=torch.channels_last)
        frozen = None if autocast else frozen_copy(model, x)

        def forward():
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                (frozen or model)(x)
        forwards[batch] = best_of(forward) / batch
        kind = "eager under autocast" if autocast else "traced and frozen, as --eval_frozen"
        print(f"  eval forward ({kind}), batch {batch:5d}: {forwards[batch] * 1e6:7.1f} us/sample")
    return steps, forwards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cores", type=int, default=2, help="workers the floor assumes run in parallel")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="bfloat16: the step under CPU autocast, as --precision bf16 runs it")
    parser.add_argument("--malloc_keep_freed", choices=MODES, default="on",
                        help="the allocator setting, as main.py's flag of that name (default on, as main.py's)")
    parser.add_argument("--train_rows", type=int, default=52_490)
    parser.add_argument("--eval_rows", type=int, default=52_490 + 17_510)
    parser.add_argument("--busy", action="store_true", help=argparse.SUPPRESS)  # a neighbour: step until killed
    args = parser.parse_args()
    keep_freed_memory(args.malloc_keep_freed)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    autocast = args.dtype == "bfloat16"
    if args.busy:
        step = sgd_step(cnn().to(memory_format=torch.channels_last), 10, autocast)
        while True:
            step()

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    gemm_rate = 2 * 2048**3 / best_of(lambda: a @ b) / 1e9
    print(f"one thread, torch {torch.__version__}, --malloc_keep_freed {args.malloc_keep_freed}: "
          f"fp32 GEMM 2048^3 {gemm_rate:.1f} GFLOP/s")
    flops = 2 * (24 * 24 * 32 * 25 + 8 * 8 * 64 * 32 * 25 + 1024 * 512 + 512 * 10)  # forward, per sample
    print("alone:")
    measure(args, autocast, gemm_rate, flops)
    neighbours = max(0, args.cores - 1)
    print(f"beside {neighbours} busy neighbour(s) (the other workers of a round):")
    busy = Neighbours(neighbours, ["--dtype", args.dtype, "--malloc_keep_freed", args.malloc_keep_freed])
    try:
        steps, forwards = measure(args, autocast, gemm_rate, flops)
    finally:
        busy.close()
    best_forward = min(forwards.values())
    for batch in (10, min(steps, key=steps.get)):
        train = args.train_rows * steps[batch] / args.cores
        evaluate = args.eval_rows * best_forward / args.cores
        print(f"P1 floor with training at batch {batch}: train {train:.2f} s + eval {evaluate:.2f} s = {train + evaluate:.2f} s/round")
    print(f"P1 eval at batch 128: {args.eval_rows * forwards[128] / args.cores:.2f} s")
    ideal = (3 * args.train_rows + args.eval_rows) * flops / (gemm_rate * 1e9) / args.cores
    print(f"P1 arithmetic at the GEMM rate (no kernel reaches it at these shapes): {ideal:.2f} s/round")


if __name__ == "__main__":
    main()
