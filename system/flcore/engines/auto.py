"""``--engine auto`` (the default): the fastest engine that gives the sequential engine's results.

* On a GPU: the batched engine (``torch.func.vmap`` over the cohort), which turns K launch-bound
  batch-10 steps into one step of K times the work, replayed from a CUDA graph (``capture.py``).
* On a CPU with more than one core: the threaded engine (one client per core, one working model
  per worker). vmap is not used there: on a CPU the per-client convolutions are compute-bound
  already at batch 10 and functorch's grouped convolution was slower than K plain ones (see
  ``batched.py``), while using the cores for different clients was measured 1.2-1.35x faster than
  intra-op threads on one client.
* On a single core, or with ``--num_threads 1`` (and no ``--workers``): the sequential engine.

Why not the sequential engine on PyTorch's intra-op threads (P1's MNIST CNN at B=10 on
the project's 2-core EPYC, torch 2.13): one client's step took 3.05 ms on two threads on the idle
machine, 4.8-5.2 ms on one, but 15.7 ms on two as soon as one other process ran, since OpenMP's
team waits at every operation for whichever thread was descheduled; a round of P1 measured
36.1 s/round that way at a load near 2. Two workers on one thread each cannot lose a core to a
barrier: a busy machine only slows them in proportion. On the idle machine they do the round's
52,490 training samples in about 5,249 x 4.8 ms / 2 = 12.6 s, the compute floor one estimates
estimates (1.3 TFLOP at about 100 GFLOPS), and evaluation spreads its batches the same way
(``flcore/evaluation.py``). The per-step Python (clientbase's hooks, the batch index, the flat
update) was at most 8% of a step under cProfile (which inflates Python calls); the rest is
oneDNN's convolutions and matrix products.

The choice does not depend on the model: a report that the threaded engine is slower than the
sequential one for ``MobileNet-GN`` / ``ResNet10-GN`` on tiny data was checked (2-core machine at a
load of 12-17, FedAvg, 4-6 clients of 30 samples, batch 10, seq/thr interleaved in one process).
Against the sequential engine on one intra-op thread the threaded engine took 0.98-1.22x the time
at 16x16 and 1.01-1.02x at 32x32 (the same setting repeated varied by +-15%; CNN 0.59-1.12x):
with no idle core, two workers cannot beat one thread, and nothing in the engine serialises them
(each worker runs on one intra-op thread; GroupNorm is 5-9% of a step; MobileNet's depthwise
convolutions take half of it in PyTorch's im2col kernel, on any engine). Against the sequential
engine on PyTorch's default two intra-op threads (``--num_threads 0``) it took 0.03-0.15x the
time: OpenMP's team waits for a busy core at every operation. So no size rule is applied.

Other ways to a faster CPU step, measured and not taken (P1's CNN at B=10, one thread,
CPU time, variants interleaved in one process at a load of 5-7,
``experiments/cpu_step_variants.py``): ``torch.compile`` (inductor) of the forward pass, whose
backward it compiles too, took 0.63x the eager step's speed channels-last, 0.65x NCHW, 0.70x under
bf16 autocast and 0.77x with max-pooling left eager (its generated max-pool-with-indices kernel
alone cost 2.2 ms of a 5.7 ms step), after 2-4 CPU s of compiling; a 20-client step under vmap
(grouped convolutions) 0.69x per client-step and the same step written as unfold + batched matrix
products 0.39x (im2col and col2im cost more than the products save); oneDNN's implicit bf16 for fp32
(``torch.backends.mkldnn.*.fp32_precision = "bf16"``) is not applied to convolutions in torch 2.13
(1.05x, within noise); max-pooling before ReLU (the same numbers) 1.00x. The platform's own
per-step work (the hooks, the batch index, decoding uint8 inputs, the flat update) measured nothing
beside a bare loop of the same steps (5.67 vs 5.81 ms). What remains is oneDNN's convolutions
(conv2's forward and backward about 3.0 ms of the step) and the fully connected layer's 2 MB weight
read and written at every step (about 1 ms): at B=10 the step does not get cheaper in fp32 with
these kernels. bf16 autocast (``--precision bf16``) made it 1.30-1.32x faster.

Each of them trains sequentially whatever it cannot handle (a client class that is not
vectorisable, a model with dropout, ...), so ``auto`` changes speed and memory, not results beyond
float rounding (checked by ``tests/engines``). Its choice and any fallback are logged at info level.
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser
from typing import TYPE_CHECKING

from flcore.engines.batched import BatchedEngine
from flcore.engines.sequential import SequentialEngine
from flcore.engines.threaded import ThreadedEngine, worker_count
from flcore.registry import register_engine

if TYPE_CHECKING:
    from flcore.protocol import Runtime

log = logging.getLogger("fl")


def choose_engine(runtime: "Runtime") -> type:
    """The engine class ``auto`` delegates to for this server's device and this machine."""
    if runtime.model.device.type == "cuda":
        return BatchedEngine
    return ThreadedEngine if worker_count(runtime.args) > 1 else SequentialEngine


@register_engine("auto")
class AutoEngine:
    """Not an engine of its own: building it builds the engine ``choose_engine`` picks, which then
    only informs (rather than warns) about what it trains sequentially."""

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        BatchedEngine.add_args(parser)
        ThreadedEngine.add_args(parser)

    def __new__(cls, runtime: "Runtime"):
        chosen = choose_engine(runtime)
        engine = chosen(runtime)
        engine.notice_level = logging.INFO
        log.info("engine auto: %s on %s", chosen.registered_name, runtime.model.device)
        return engine
