"""Where a run computes and what it logs: the device ``-dev``/``-did`` name, the process-wide
back-end switches, and the log handler that keeps progress bars intact."""
from __future__ import annotations

import argparse
import logging
import sys

import torch

from utils.allocator import keep_freed_memory
from utils.errors import FLError

log = logging.getLogger("fl")


def resolve_device(args: argparse.Namespace) -> torch.device:
    if args.device == "cuda":
        if not torch.cuda.is_available():
            log.warning("warning: -dev cuda requested but no GPU is available; running on cpu")
            return torch.device("cpu")
        index = int(str(args.device_id).split(",")[0])
        if index >= torch.cuda.device_count():
            raise FLError(f"-did {args.device_id}: only {torch.cuda.device_count()} GPU(s) visible")
        return torch.device(f"cuda:{index}")
    return torch.device("cpu")


def configure_backends(args: argparse.Namespace, device: torch.device) -> None:
    """Process-wide switches the flags ask for, before any data or model is made: where glibc keeps
    freed memory (``--malloc_keep_freed``, so their temporaries reuse it) and, on ``device``, cuDNN's
    timed algorithm choice (``--cudnn_benchmark``)."""
    keep_freed_memory(args.malloc_keep_freed)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)


def setup_logging(quiet: bool) -> None:
    class TqdmHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                from tqdm.auto import tqdm

                stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
                tqdm.write(self.format(record), file=stream)
            except Exception:  # pragma: no cover - never let logging kill a run
                self.handleError(record)

    logger = logging.getLogger("fl")
    logger.handlers[:] = [TqdmHandler()]
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.propagate = False
