"""Issue 28: the CPU compute floor of benchmark P1 (MNIST CNN, 20 clients, B = 10, E = 1, eval every round).

The CPU goals (P1 >= 2.5x PFLlib's own run in fp32, >= 3.5x in bf16) ask for a round of at most
~14.8 s (fp32) on this machine. This script measures what the CNN's arithmetic alone costs here, with
no federated machinery at all, so a round's floor can be set against the goal:

* the machine's dense fp32 rate (one large matrix product), for scale;
* one SGD step of P1's CNN (forward, backward, update) per sample at batch 10 (P1's batch, what every
  client step is), and at larger batches (what no B = 10 client can use, shown as the lower bound);
* one evaluation forward per sample at the evaluation batch (128 on a CPU) and at larger ones.

floor(B) = train_rows x step_per_sample(B) + eval_rows x forward_per_sample(best), with P1's row counts
(train 52,490 = its 5,249 steps x 10; evaluation = the test split plus PFLlib's train loss over every
training row). Run it on an otherwise idle machine:

    python experiments/issue28_cpu_floor.py [--cores 2] [--dtype float32|bfloat16]

Every kernel runs on one thread, as the threaded engine's workers do (one intra-op thread each), and
the floor divides the CPU seconds by ``--cores`` (perfect parallel workers, no Python, no data).
"""
from __future__ import annotations

import argparse
import time

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "system"))
from flcore.frozen import frozen_copy  # noqa: E402  (the CPU evaluation's traced, frozen model)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cores", type=int, default=2, help="workers the floor assumes run in parallel")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="bfloat16: the step under CPU autocast, as --precision bf16 runs it")
    parser.add_argument("--train_rows", type=int, default=52_490)
    parser.add_argument("--eval_rows", type=int, default=52_490 + 17_510)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    autocast = args.dtype == "bfloat16"

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    gemm_rate = 2 * 2048**3 / best_of(lambda: a @ b) / 1e9
    print(f"one thread, torch {torch.__version__}: fp32 GEMM 2048^3 {gemm_rate:.1f} GFLOP/s")

    # channels-last, as the platform's CNN runs on a CPU
    model = cnn().to(memory_format=torch.channels_last)
    flops = 2 * (24 * 24 * 32 * 25 + 8 * 8 * 64 * 32 * 25 + 1024 * 512 + 512 * 10)  # forward, per sample
    optimiser = torch.optim.SGD(model.parameters(), lr=0.005)
    loss_fn = nn.CrossEntropyLoss()
    steps = {}
    for batch in (10, 50, 200, 1000):
        x = torch.randn(batch, 1, 28, 28).to(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (batch,))

        def step():
            optimiser.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = loss_fn(model(x), y)
            loss.backward()
            optimiser.step()
        steps[batch] = best_of(step) / batch
        rate = 3 * flops / steps[batch] / 1e9  # backward ~ twice the forward
        print(f"SGD step, batch {batch:5d}: {steps[batch] * 1e6:7.1f} us/sample ({steps[batch] * batch * 1e3:.2f} ms/step, "
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
        print(f"eval forward ({kind}), batch {batch:5d}: {forwards[batch] * 1e6:7.1f} us/sample")
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
