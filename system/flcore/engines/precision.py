"""``--precision fp32|tf32|bf16``: the arithmetic of local training (opt-in lower precision).

* ``fp32`` (default): PyTorch's own settings, unchanged (on NVIDIA GPUs that includes cuDNN's
  TF32 convolutions, which PyTorch enables by default; matrix products stay fp32).
* ``tf32``: TF32 tensor cores for matrix products and convolutions (CUDA, compute capability 8.0
  or newer). Inputs are rounded to 10 mantissa bits inside the products; everything else is fp32.
* ``bf16``: ``torch.autocast`` to bfloat16 for the forward and backward passes of local training
  (CUDA with bf16 support, or a CPU: fast where it has AVX512-BF16/AMX). The weights, gradients,
  updates, per-client state and aggregation stay fp32 (autocast casts copies of the weights per
  operation and returns fp32 gradients for fp32 parameters), so only the products round to bf16.

Only local training is affected: evaluation, aggregation and the servers' own optimisation
(FedGen's generator, ...) run in fp32. The engines apply it around each client's local sequence
(the sequential engine, and clients any engine trains sequentially: their hooks run inside it
too), around the SGD loop in each worker thread (the threaded engine; autocast is per thread), or
inside the vmapped step (the batched engine, captured with it); the Ray engine's actors run a
sequential or threaded engine, which apply it there (the driver refuses what the actors' device
cannot run before Ray starts). bf16 pays on a CPU with AVX512-BF16; on a GPU the platform's
batch-10 CNNs are launch-bound and autocast only adds casts (the figures, at equal accuracy:
``docs/results/performance.md``, "bf16 against fp32"). DP-SGD (``-dp``) is refused: its
per-sample gradients and clipping bound the sensitivity that the accountant's ε assumes, and
that bound is not checked in bf16.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from utils.errors import FLError

PRECISIONS = ("fp32", "tf32", "bf16")


def check_precision(args, device: torch.device) -> str:
    """``--precision`` for this run on ``device``; one-line FLError where it cannot apply."""
    precision = str(args.precision)
    if precision not in PRECISIONS:
        raise FLError(f"--precision {precision}: choose one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return precision
    if precision == "tf32":
        if device.type != "cuda":
            raise FLError(f"--precision tf32 needs an NVIDIA GPU (compute capability 8.0+), not {device.type}; "
                          "use --precision bf16 or fp32")
        major, _ = torch.cuda.get_device_capability(device)
        if major < 8:
            raise FLError(f"--precision tf32: {torch.cuda.get_device_name(device)} has no TF32 "
                          "(compute capability 8.0+ needed); use fp32")
    if precision == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise FLError(f"--precision bf16: {torch.cuda.get_device_name(device)} has no bfloat16 support; use fp32")
        if device.type not in ("cuda", "cpu"):
            raise FLError(f"--precision bf16 runs on CUDA or the CPU, not {device.type}; use fp32")
    return precision


@contextlib.contextmanager
def precision_context(precision: str, device: torch.device) -> Iterator[None]:
    """The arithmetic of ``precision`` inside the block (autocast is per thread: enter it in the
    thread that trains)."""
    if precision == "bf16":
        # no weight-cast cache: the batched step passes fresh parameter views each call, and a
        # cache must not outlive a captured CUDA graph
        with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False):
            yield
        return
    if precision == "tf32":
        before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
        return
    yield
