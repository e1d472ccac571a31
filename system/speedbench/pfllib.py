"""PFLlib's own ``main.py`` run on the same partition (its file format, its code in a scratch
workspace with stand-ins for imports P1 never uses), timed beside ours."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from speedbench.tables import fmt


#: PFLlib's FedAvg flags for P1, the same as ours (README set-up); ``-gr`` and ``-dev`` are added
PFLLIB_P1_FLAGS = ["-data", "MNIST", "-m", "CNN", "-algo", "FedAvg", "-nc", "20", "-ncl", "10", "-lbs", "10",
                   "-ls", "1", "-lr", "0.005", "-jr", "1", "-eg", "1", "-did", "0"]
#: stand-ins for imports PFLlib's main.py makes but P1 never uses (FedPAC's solver; a memory pretty-printer)
PFLLIB_STUBS = {"cvxpy": "# stand-in: only PFLlib's FedPAC uses cvxpy\n",
                "torchvision": "# stand-in: PFLlib's main.py uses torchvision only for models P1 does not build\n",
                "calmsize": "def size(num_bytes):  # stand-in for calmsize.size (memory printing only)\n"
                            "    return float(num_bytes)\n"}


def _module_missing(name: str, python: str | None = None) -> bool:
    """Whether ``name`` cannot be imported by this interpreter (or by the interpreter ``python``)."""
    import importlib.util

    if python is None:  # (a venv's python links to its base interpreter: only the path tells venvs apart)
        return importlib.util.find_spec(name) is None
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({name!r}) is None)"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode != 0


def pfllib_commit(pfllib: Path) -> str | None:
    """The short commit of ``pfllib`` when that folder is itself a git checkout (not a copy inside
    another repository), else None."""
    try:
        top = subprocess.run(["git", "-C", str(pfllib), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
        if top.returncode == 0 and Path(top.stdout.strip()).resolve() == pfllib.resolve():
            return subprocess.run(["git", "-C", str(pfllib), "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True).stdout.strip() or None
    except OSError:
        pass
    return None


def write_pfllib_partition(data_folder: Path, target: Path) -> int:
    """Our partition in ``data_folder`` written in PFLlib's file format under ``target``
    (``train/<i>.npz`` and ``test/<i>.npz``, each an archive of one ``data`` dict of x and y), so that
    PFLlib trains on exactly our clients' data; nothing of PFLlib's is read here. Returns the number
    of clients."""
    import numpy as np

    config = json.loads((data_folder / "config.json").read_text())
    clients = int(config.get("num_clients", 20))
    for split in ("train", "test"):
        (target / split).mkdir(parents=True)
        for index in range(clients):
            with np.load(data_folder / split / f"{index}.npz", allow_pickle=False) as archive:
                x, y = np.asarray(archive["x"], dtype=np.float32), np.asarray(archive["y"], dtype=np.int64)
            np.savez_compressed(target / split / f"{index}.npz", data={"x": x, "y": y})
    return clients


def pfllib_workspace(pfllib: Path, data_folder: Path, root: Path, dataset: str = "MNIST",
                     python: str | None = None) -> dict[str, str]:
    """A runnable copy of PFLlib in ``root``: ``root/system`` (its code), ``root/dataset/<dataset>``
    (our partition in its format) and ``root/stubs`` (stand-ins for the imports of
    :data:`PFLLIB_STUBS` that ``python``, default this interpreter, lacks). Returns the environment
    to run its ``main.py`` with, from ``root/system``."""
    import shutil

    shutil.copytree(pfllib / "system", root / "system", ignore=shutil.ignore_patterns("__pycache__"))
    stubs = root / "stubs"
    stubs.mkdir()
    for module, text in PFLLIB_STUBS.items():
        if _module_missing(module, python):
            (stubs / f"{module}.py").write_text(text)
    write_pfllib_partition(data_folder, root / "dataset" / dataset)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(stubs), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def parse_pfllib_stdout(stdout: str) -> tuple[list[float], list[float]]:
    """(seconds of each round, test accuracy of each evaluation) from what PFLlib's ``main.py``
    prints: its per-round line is '-' * 25, 'time cost', '-' * 25, seconds (FD, FedProto, FedPCL,
    FedPAC and APPLE print '-' * 50, seconds; the summary's "Average time cost" is neither), and
    every evaluation prints "Averaged Test Accuracy: 0.xxxx"."""
    times = []
    for line in stdout.splitlines():
        words = line.split()
        if line.startswith("-" * 25) and words[-1].replace(".", "", 1).isdigit() and (
                "time cost" in line or len(words) == 2):
            times.append(float(words[-1]))
    accs = [float(line.split(":")[-1]) for line in stdout.splitlines() if line.startswith("Averaged Test Accuracy")]
    return times, accs


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's finished child processes so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pfllib_own_run(pfllib: Path, data_folder: Path | None, device: str, rounds: int, warmup: int,
                   timeout: int, threads: int = 0) -> dict:
    """PFLlib's own ``main.py`` on P1's partition with P1's flags; its per-round times (stdout's
    'time cost' lines, which include its evaluation as ours do) after ``warmup`` rounds.
    ``threads`` > 0 runs it with ``OMP_NUM_THREADS`` = ``threads`` (PFLlib sets no thread count of
    its own; on a loaded machine its default two threads wait for each other at every operation:
    once three rounds did not finish in 2,400 s, against 418 s a round on one thread).

    Runs in a temporary copy of ``pfllib/system`` whose ``../dataset/MNIST`` holds our P1
    partition written in PFLlib's file format (:func:`pfllib_workspace`), so PFLlib trains on
    exactly our clients' data."""
    import tempfile

    result: dict = {"config": "P1", "engine": "PFLlib main.py", "pfllib_dir": str(pfllib)}
    if not (pfllib / "system" / "main.py").is_file():
        return result | {"error": f"--pfllib {pfllib}: no system/main.py there (give a PFLlib checkout)"}
    if data_folder is None:
        return result | {"error": "P1 has no real MNIST partition here (see --mnist-raw), so PFLlib cannot run it"}
    result["pfllib_commit"] = pfllib_commit(pfllib)
    with tempfile.TemporaryDirectory(prefix="pfllib-run-") as tmp:
        root = Path(tmp)
        env = pfllib_workspace(pfllib, data_folder, root)
        if threads > 0:
            env["OMP_NUM_THREADS"] = str(threads)
            result["threads"] = threads
        argv = [sys.executable, "main.py", *PFLLIB_P1_FLAGS, "-gr", str(warmup + rounds - 1), "-dev", device]
        started, children_cpu, result["load_avg_before"] = time.perf_counter(), _children_cpu_s(), os.getloadavg()
        try:
            done = subprocess.run(argv, cwd=root / "system", capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return result | {"error": f"PFLlib's main.py timed out after {timeout} s"}
        result["wall_s"] = time.perf_counter() - started
        result["load_avg_after"] = os.getloadavg()
        # its CPU seconds (all threads), start-up and data loading included: a load-independent figure
        result["cpu_s_total"] = _children_cpu_s() - children_cpu
        result["cpu_s_per_round"] = result["cpu_s_total"] / (warmup + rounds)
    times, accs = parse_pfllib_stdout(done.stdout)
    if done.returncode != 0 or len(times) <= warmup:
        tail = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
        return result | {"error": f"PFLlib's main.py exit {done.returncode}: {tail}"}
    timed = times[warmup:]
    return result | {"round_times": times, "s_per_round": statistics.median(timed), "timed_rounds": len(timed),
                     "final_test_acc": accs[-1] if accs else None, "argv": argv[1:]}


def pfllib_lines(own: dict, results: list[dict]) -> list[str]:
    """The speed-up of each of our P1 runs over PFLlib's own run on the same machine."""
    if "error" in own:
        return [f"  P1 PFLlib's own main.py: {own['error']}"]
    threads = f", OMP_NUM_THREADS={own['threads']}" if own.get("threads") else ""
    lines = [f"  P1 PFLlib's own main.py ({own.get('pfllib_commit') or own['pfllib_dir']}{threads}): {own['s_per_round']:.2f} s/round "
             f"(median of {own['timed_rounds']}; rounds " + ", ".join(f"{t:.2f}" for t in own["round_times"]) + ")"]
    if own.get("cpu_s_per_round") is not None:
        lines.append(f"  P1 PFLlib's own main.py: {own['cpu_s_per_round']:.2f} CPU s/round (its whole run's CPU seconds, "
                     f"start-up included, over its {len(own['round_times'])} rounds); "
                     f"load {fmt(own['load_avg_before'][0], '.1f')} before, {fmt(own['load_avg_after'][0], '.1f')} after")
    for r in results:
        if r["config"] == "P1" and "error" not in r and r.get("s_per_round") and not r.get("interleaved"):
            line = (f"  P1 {r['engine']} vs PFLlib's own main.py: speed-up {own['s_per_round'] / r['s_per_round']:.2f}x "
                    f"per round ({r['s_per_round']:.3f} vs {own['s_per_round']:.2f} s)")
            if own.get("cpu_s_per_round") and r.get("cpu_s_per_round"):
                line += (f", {own['cpu_s_per_round'] / r['cpu_s_per_round']:.2f}x in CPU seconds "
                         f"({r['cpu_s_per_round']:.2f} vs {own['cpu_s_per_round']:.2f})")
            lines.append(line)
    return lines
