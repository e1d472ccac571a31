"""Does a frozen evaluation copy (``--eval_frozen``, ``system/flcore/frozen.py``) cost memory that is never
given back? Two measurements (docs/results/performance.md, "Frozen evaluation copies"):

* ``bare``: P1's CNN alone (channels-last, batch 128, one thread). The evaluation's CPU seconds per 70,000 rows of
  each way to a faster forward (eager; one trace reused; one trace + freeze reused; the weights as graph inputs,
  frozen and optimised; a traced, frozen, optimised copy per pass), whether each sees weights loaded in place, and
  RSS over 20 copies built through ``frozen_copy`` (a unit of its own, released) or torch.jit's global compilation
  unit, each traced on a batch of 128 rows (what a copy keeps grows with its example: ~18 MB a copy on 128 rows,
  ~3 MB on the evaluator's 2).
* ``run``: FedAvg through ``main.main`` on a dataset folder, RSS and glibc's ``mallinfo2`` (live and free heap
  bytes) after every evaluation; ``--no-trim`` skips the heap trim after each pass, to show what it is for.

    python experiments/frozen_eval_memory.py bare
    python experiments/frozen_eval_memory.py run --data experiments/out/data/MNIST_shard100_global_150s \
        --eval_frozen True
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "system"))
from flcore import evaluation, frozen  # noqa: E402

ROWS = 70_000  # a P1 evaluation


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class MallInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_mb() -> tuple[float, float]:
    """(malloc's live bytes, its free heap bytes) in MB (glibc 2.33+; NaN elsewhere)."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = MallInfo
        info = libc.mallinfo2()
    except (AttributeError, OSError):
        return float("nan"), float("nan")
    return (info.uordblks + info.hblkhd) / 2**20, info.fordblks / 2**20


def cnn() -> nn.Module:
    """P1's model (the registry's CNN, McMahan et al.'s) for 1x28x28 input."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10)).to(memory_format=torch.channels_last).eval()


class WeightsAsInputs(nn.Module):
    """The same CNN with its parameters as forward inputs (``functional_call`` refuses tracing)."""

    def forward(self, x, w1, b1, w2, b2, w3, b3, w4, b4):
        x = F.max_pool2d(F.relu(F.conv2d(x, w1, b1)), 2)
        x = F.max_pool2d(F.relu(F.conv2d(x, w2, b2)), 2).flatten(1)
        return F.linear(F.relu(F.linear(x, w3, b3)), w4, b4)


def global_unit_copy(model: nn.Module, x: torch.Tensor):
    """What --eval_frozen built before: trace, freeze, optimise, in torch.jit's global compilation unit."""
    return torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(model, x, check_trace=False)))


def variants(model: nn.Module, x: torch.Tensor) -> dict:
    params = tuple(p.detach() for p in model.parameters())
    as_inputs = torch.jit.optimize_for_inference(torch.jit.freeze(
        torch.jit.trace(WeightsAsInputs(), (x, *params), check_trace=False).eval()))
    return {"eager": model,
            "one trace, reused": torch.jit.trace(model, x, check_trace=False),
            "one trace + freeze, reused": torch.jit.freeze(torch.jit.trace(model, x, check_trace=False)),
            "weights as inputs, frozen + optimised": lambda inp: as_inputs(inp, *params),
            "a frozen, optimised copy per pass": global_unit_copy(model, x)}


def cpu_seconds_per_evaluation(forward, x: torch.Tensor, batches: int = 100) -> float:
    for _ in range(5):
        forward(x)
    start = time.process_time()
    for _ in range(batches):
        forward(x)
    return (time.process_time() - start) / (batches * len(x)) * ROWS


@torch.no_grad()
def bare() -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model, x = cnn(), torch.randn(128, 1, 28, 28).to(memory_format=torch.channels_last)
    forwards = variants(model, x)
    for name, forward in forwards.items():  # new weights loaded in place, as the evaluator's model.load does
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
        sees = torch.allclose(forward(x), model(x), rtol=0, atol=1e-5 * float(model(x).abs().max()))
        print(f"{name:>40}: sees weights loaded in place: {sees}")
    for repeat in range(2):  # interleaved, so a change of the machine's load shows
        for name, forward in forwards.items():
            print(f"{name:>40}: {cpu_seconds_per_evaluation(forward, x):.2f} CPU s per {ROWS:,} rows", flush=True)
    del forwards
    # traced on a whole batch: what a copy keeps grows with the example (2 rows, as the evaluator traces: ~3 MB)
    for name, build in (("frozen_copy (own unit, released)", frozen.frozen_copy), ("global unit", global_unit_copy)):
        for i in range(20):
            copy = build(model, x)
            for _ in range(40):  # about 5,000 rows
                copy(x)
            if hasattr(copy, "release"):
                copy.release()
            del copy
            gc.collect()
            if i in (0, 9, 19):
                print(f"{name:>40}: RSS after copy {i + 1:2d}: {rss_mb():.0f} MB; functions in torch.jit's "
                      f"global unit: {len(torch.jit._state._python_cu.get_functions())}", flush=True)


def run(args: argparse.Namespace, rest: list[str]) -> None:
    import main

    if args.no_trim:
        frozen.return_free_heap_pages = lambda: None
    evaluate = evaluation.Evaluator.evaluate

    def reported(self, *a, **k):
        out = evaluate(self, *a, **k)
        gc.collect()
        live, free = heap_mb()
        print(f"evaluation: RSS {rss_mb():.0f} MB, malloc live {live:.0f} MB, free {free:.0f} MB, "
              f"{time.process_time():.1f} CPU s", file=sys.stderr, flush=True)
        return out

    evaluation.Evaluator.evaluate = reported
    with tempfile.TemporaryDirectory() as folder:
        argv = ["-data", str(args.data), "-m", "CNN", "-algo", "FedAvg", "-gr", str(args.rounds), "-eg", "1",
                "-jr", str(args.join_ratio), "-lbs", "10", "-dev", "cpu", "--engine", "sequential",
                "--num_threads", "1",
                "--results_dir", folder, "--overwrite", "--progress", "False", "-q", "True", "--save_model", "False",
                "--eval_frozen", args.eval_frozen, *rest]
        raise SystemExit(main.main(argv))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["bare", "run"])
    parser.add_argument("--data", type=Path, help="run: a dataset folder (e.g. 100 MNIST clients)")
    parser.add_argument("--eval_frozen", choices=["True", "False"], default="True")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--join_ratio", type=float, default=0.05)
    parser.add_argument("--no-trim", dest="no_trim", action="store_true", help="run: keep the heap's free pages")
    known, extra = parser.parse_known_args()
    if known.part == "bare":
        bare()
    elif known.data is None:
        parser.error("run needs --data")
    else:
        run(known, extra)
