"""Memory of the run: peak process RSS always, the CUDA allocator's peak and room on a GPU."""
from __future__ import annotations

import resource
import sys

import torch


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / 1024**2 if sys.platform == "darwin" else peak / 1024


def peak_gpu_mb(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 1024**2


#: raised by an allocation the device cannot serve (``torch.OutOfMemoryError`` from torch 2.5 on)
OUT_OF_MEMORY: type[Exception] = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


def device_room(device: torch.device) -> tuple[int, int] | None:
    """(bytes still available, total bytes) of a CUDA device, counting the blocks PyTorch's caching
    allocator holds but does not use as available; None for other devices."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return free + cached, total
