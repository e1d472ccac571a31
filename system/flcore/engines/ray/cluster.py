"""Starting a local Ray instance on loopback, or attaching to a cluster; one-line errors."""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Iterator

from utils.errors import FLError

#: the import root the actors need on their path (``system/``)
SYSTEM_DIR = Path(__file__).resolve().parents[3]
#: the smallest object store Ray accepts is 75 MB; a little more leaves room for packages
MIN_OBJECT_STORE = 96 * 1024**2

MISSING_RAY = "--engine ray needs the ray package: run ./prepare.sh --ray (or pip install -r requirements-ray.txt)"


def check_ray_installed() -> None:
    """One clear line when ray is missing, without importing it (importing fixes the addresses
    its local node will use; :func:`use_loopback` comes first)."""
    if importlib.util.find_spec("ray") is None:
        raise FLError(MISSING_RAY)


def import_ray():
    """The ray module, or one clear line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise FLError(MISSING_RAY) from None
    return ray


def actor_path_env(extra_paths: tuple[str, ...] = ()) -> dict:
    """The runtime environment that lets actors import the simulator (``system/`` on their path,
    then ``extra_paths``, e.g. the tests' helpers, then the driver's ``PYTHONPATH``)."""
    paths = [str(SYSTEM_DIR), *map(str, extra_paths), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}}


def use_loopback() -> None:
    """Make Ray's local node use 127.0.0.1: ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` for the processes
    Ray starts, and the constant Ray read from it at import when ray is imported already."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """``ray.init`` puts its own SIGTERM handler in place of the process's (ray 2.60.0: one that
    exits where the process stands) and leaves it after ``ray.shutdown``; the platform's handlers
    (``utils.interrupts``, ``runner.run_control.StopOnSignal``: SIGTERM stops a run after its round,
    keeping its results) are put back when Ray has started."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers belong to the main thread
        return
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            if handler is not None:
                signal.signal(signum, handler)


def ray_init(**kwargs) -> None:
    """``ray.init`` without taking the process's signal handlers (:func:`signal_handlers_kept`)."""
    ray = import_ray()
    with signal_handlers_kept():
        ray.init(**kwargs)


def start_local_ray(num_cpus: int, object_store_bytes: int = MIN_OBJECT_STORE, num_gpus: int | None = None,
                    extra_paths: tuple[str, ...] = (), **init_kwargs) -> None:
    """A Ray instance on this machine, bound to 127.0.0.1 only, without the dashboard.

    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is what makes Ray 2.60 bind its services (GCS, raylet,
    object manager) to loopback instead of the machine's interface address."""
    use_loopback()
    ray_init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
             object_store_memory=max(int(object_store_bytes), MIN_OBJECT_STORE), runtime_env=actor_path_env(extra_paths),
             logging_level=logging.WARNING, **init_kwargs)


def first_line(exc: BaseException) -> str:
    """One line for an error: Ray's errors carry the remote traceback, whose last ``...Error: ...``
    line names the cause (e.g. a module the actors cannot import); else the message's first line."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(exc).splitlines()]
    causes = [line for line in lines if re.match(r"^[\w.]*(Error|Exception): ", line)]
    if causes:
        return causes[-1]
    return next((line for line in lines if line), type(exc).__name__)
