"""PFLlib's own ``main.py`` at 10^4 clients, measured beside ours on the same population.

PFLlib (TsingZ0/PFLlib) no longer ships a Synthetic generator (its ``dataset/`` has none), so the
population is ours: FedProx's Synthetic(1, 1), dimension 60 (the input size PFLlib's MLR and DNN
take for a dataset that is neither MNIST nor Cifar10), the small clients of
``experiments/scale.py`` (``--size-log-mean 1 --size-log-std 0.5 --size-min 10``), written by
``dataset/generate_Synthetic.py`` in the npz layout and then in PFLlib's file format
(``train/<i>.npz``, ``test/<i>.npz``, each a pickled ``data`` dict of x and y) in a scratch copy of
PFLlib's ``system/`` with stand-ins for the imports FedAvg never uses
(``speedbench.pfllib.pfllib_workspace``). Then, each one process under GNU time (``/usr/bin/time
-v``: wall, user + system CPU seconds, peak RSS), at ``nice -n 15``:

* PFLlib: ``main.py -data Synthetic -m DNN -algo FedAvg -jr 0.005 -gr 3 -nc 10000 -did 0 -dev cpu``
  (its defaults otherwise: every round evaluates every client; ``--eval_gap`` sets ``-eg`` of both
  runs), stopped by ``timeout`` after ``--timeout`` seconds; its start-up is the time till it prints
  "Finished creating server and clients.", its rounds the 'time cost' lines it prints;
* ours: ``system/main.py`` with the same flags on the same population, in the packed layout the
  generator writes above 1,000 clients and in the npz layout PFLlib's files came from, evaluating
  every client (our default, ``--eval_clients 0``) and a sample of ``--eval_clients`` clients.

    python experiments/pfllib_scale.py --pfllib <pfllib>

Every line a process prints is kept with its time in ``--out``/<run>.log, GNU time's report in
``--out``/<run>.time, its RSS and open data files every 2 s in ``--out``/<run>.samples (so that a
run stopped by its timeout says how far it got); the figures go to ``--out``/pfllib_scale.json and
to stdout as a table.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np

REPO = Path(__file__).resolve().parents[1]
SYSTEM = REPO / "system"
sys.path.insert(0, str(SYSTEM))
from speedbench.pfllib import parse_pfllib_stdout, pfllib_commit  # noqa: E402
GENERATOR = REPO / "dataset" / "generate_Synthetic.py"
#: the small Synthetic clients of experiments/scale.py (10-43 samples); dimension 60 is PFLlib's
POPULATION = ["--size-log-mean", "1", "--size-log-std", "0.5", "--size-min", "10", "--dim", "60"]
#: PFLlib's dataset name for the population: no "MNIST", "Cifar10", "News" or "Shakespeare" in it,
#: so its main.py builds the 60-input MLR and DNN and reads the files as features
NAME = "Synthetic"
#: builds PFLlib's workspace in a process of its own (so that GNU time measures the conversion) and
#: prints the PYTHONPATH its main.py needs
CONVERT = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
           "from speedbench.pfllib import pfllib_workspace; "
           "print(pfllib_workspace(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), dataset=sys.argv[5])"
           "['PYTHONPATH'])")
#: what GNU time -v reports, by the keys of a measurement
TIME_FIELDS = {"user_s": "User time (seconds)", "system_s": "System time (seconds)",
               "peak_rss_mb": "Maximum resident set size (kbytes)"}


def innermost(pid: int) -> int:
    """The last process of the chain nice -> time -> timeout -> the command, from ``pid`` down."""
    while True:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return pid
        if not children:
            return pid
        pid = int(children[-1])


def watch(pid: int, start: float, samples: list, stop: threading.Event, every: float = 2.0) -> None:
    """Every ``every`` seconds till ``stop``: (seconds, RSS MB, the data files it has open) of the
    measured command, so that a run stopped by its timeout says how far it got and how large it was."""
    while not stop.wait(every):
        inner = innermost(pid)
        try:
            status = Path(f"/proc/{inner}/status").read_text().split("\n")
            rss = next(float(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))
            fds = Path(f"/proc/{inner}/fd")
            files = [target for fd in fds.iterdir() if (target := os.readlink(fd)).endswith(".npz")]
        except (OSError, StopIteration):  # it ended between the two reads
            continue
        samples.append((time.perf_counter() - start, rss, ["/".join(Path(f).parts[-2:]) for f in files]))


def measured(name: str, command: list[str], cwd: Path, out: Path, nice: int, cap: int,
             env: dict | None = None) -> dict:
    """One process at ``nice``, under GNU time and ``timeout cap``: its exit status, wall, CPU seconds
    and peak RSS, and every line it printed with the seconds since it started (``out``/name.log)."""
    report = out / f"{name}.time"
    argv = ["nice", "-n", str(nice), "/usr/bin/time", "-v", "-o", str(report), "timeout", str(cap), *command]
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    lines, samples, stop = [], [], threading.Event()
    with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          bufsize=1) as process, (out / f"{name}.log").open("w", buffering=1) as log:
        watcher = threading.Thread(target=watch, args=(process.pid, start, samples, stop), daemon=True)
        watcher.start()
        for line in process.stdout:
            lines.append((time.perf_counter() - start, line.rstrip("\n")))
            log.write(f"{lines[-1][0]:9.2f} {lines[-1][1]}\n")
    wall = time.perf_counter() - start
    stop.set()
    watcher.join()
    (out / f"{name}.samples").write_text("".join(f"{t:9.2f} {rss:8.1f} MB {' '.join(files)}\n"
                                                 for t, rss, files in samples))
    figures = {}
    for row in report.read_text().splitlines():
        key, _, value = row.strip().rpartition(": ")
        for field, label in TIME_FIELDS.items():
            if key == label:
                figures[field] = float(value)
    figures["peak_rss_mb"] /= 1024
    return {"run": name, "command": command, "returncode": process.returncode, "timed_out": process.returncode == 124,
            "wall_s": wall, "cpu_s": figures["user_s"] + figures["system_s"], "peak_rss_mb": figures["peak_rss_mb"],
            "load_before": load_before, "load_after": os.getloadavg()[0], "lines": lines, "samples": samples}


def on_disk(folder: Path) -> dict:
    """Files under ``folder``, their bytes and the bytes their blocks take on disk."""
    files = [path.stat() for path in folder.rglob("*") if path.is_file()]
    return {"files": len(files), "bytes": sum(s.st_size for s in files),
            "disk_bytes": sum(s.st_blocks * 512 for s in files)}


def failed(run: dict) -> str | None:
    """One line saying why a run that had to finish did not, else None."""
    if run["returncode"] == 0:
        return None
    tail = run["lines"][-1][1] if run["lines"] else "no output"
    return f"error: {run['run']} exited {run['returncode']}: {tail}"


def pfllib_figures(run: dict) -> dict:
    """Start-up (till "Finished creating server and clients."), the rounds PFLlib printed and how
    far it got, from its timestamped lines."""
    created = [t for t, line in run["lines"] if line.startswith("Finished creating server and clients")]
    rounds, _ = parse_pfllib_stdout("\n".join(line for _, line in run["lines"]))
    started = [line for _, line in run["lines"] if "Round number" in line]
    last_files = [files for _, _, files in run.get("samples", []) if files]
    return {"startup_s": created[0] if created else None, "round_s": rounds, "rounds_done": len(rounds),
            "rounds_started": len(started), "last_line": run["lines"][-1][1] if run["lines"] else None,
            "last_files_open": last_files[-1] if last_files else None,
            "last_rss_mb": run["samples"][-1][1] if run.get("samples") else None}


def ours_figures(run: dict, results: Path) -> dict:
    """Start-up (the process's wall less its training loop's) and the rounds' times from our h5."""
    (path,) = results.glob("*.h5")
    with h5py.File(path) as f:
        rounds = np.asarray(f["rs_round_time"][()], dtype=float)
        loop = float(f.attrs["wall_time_s"])
    return {"startup_s": run["wall_s"] - loop, "round_s": rounds.tolist(), "rounds_done": len(rounds)}


def flags(args) -> list[str]:
    """The training flags both main.py's are given."""
    return ["-m", args.model, "-algo", "FedAvg", "-jr", repr(args.join_ratio), "-gr", str(args.rounds),
            "-nc", str(args.clients), "-eg", str(args.eval_gap), "-did", "0", "-dev", "cpu"]


def markdown(rows: list[dict]) -> str:
    def num(value, fmt):
        return "–" if value is None else format(value, fmt)

    lines = ["| run | exit | wall s | CPU s | peak RSS MB | start-up s | rounds done | s/round | load |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        rounds = ", ".join(f"{t:.2f}" for t in r.get("round_s", []))
        lines.append(f"| {r['run']} | {r['returncode']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['peak_rss_mb']:.0f} | "
                     f"{num(r.get('startup_s'), '.1f')} | {r.get('rounds_done', '–')} | {rounds or '–'} | "
                     f"{r['load_before']:.1f} → {r['load_after']:.1f} |")
    lines += [f"\n{r['run']} stopped after {r['wall_s']:.0f} s: {r['rounds_done']} rounds done, last line "
              f"{r['last_line']!r}, open then: {' '.join(r['last_files_open'] or []) or 'no data file'}, RSS "
              f"{num(r['last_rss_mb'], '.0f')} MB" for r in rows if r.get("timed_out") and "rounds_done" in r]
    return "\n".join(lines)


def refusal(args) -> str | None:
    """One line saying what is wrong with the arguments, else None."""
    if not (args.pfllib / "system" / "main.py").is_file():
        return f"error: --pfllib {args.pfllib}: no system/main.py there (give a PFLlib checkout)"
    if args.clients < 2 or min(args.rounds, args.eval_gap, args.timeout) < 1 or not 0 < args.join_ratio <= 1:
        return "error: --clients must be at least 2, --rounds, --eval_gap and --timeout at least 1, --join-ratio in (0, 1]"
    if int(args.clients * args.join_ratio) < 1:
        return "error: --join-ratio times --clients is below one client (PFLlib would select none)"
    if not 0 < args.eval_clients <= args.clients:
        return "error: --eval_clients must be between 1 and --clients"
    if not Path("/usr/bin/time").is_file() or shutil.which("timeout") is None:
        return "error: the figures are measured with GNU time (/usr/bin/time) and timeout; install time and coreutils"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pfllib", type=Path, required=True, help="a PFLlib checkout (its system/main.py is run)")
    parser.add_argument("--clients", type=int, default=10000, help="population (default 10,000)")
    parser.add_argument("--join-ratio", type=float, default=0.005, help="-jr of both runs (default 0.005: 50 of 10^4)")
    parser.add_argument("--rounds", type=int, default=3, help="-gr of both runs (PFLlib trains gr + 1 rounds, we gr: docs/features.md)")
    parser.add_argument("--model", default="DNN", choices=["DNN", "MLR"])
    parser.add_argument("--eval_gap", type=int, default=1,
                        help="-eg of both runs (default 1, PFLlib's: every round evaluates; both evaluate round 0)")
    parser.add_argument("--eval_clients", type=int, default=1000, help="our sampled evaluation's clients")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds after which PFLlib's run is stopped")
    parser.add_argument("--nice", type=int, default=15, help="niceness of every measured process")
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "out" / "pfllib_scale")
    args = parser.parse_args(argv)
    if (line := refusal(args)) is not None:
        print(line, file=sys.stderr)
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    folders = {layout: out / f"Synthetic_{args.clients}_{layout}" for layout in ("npz", "packed")}
    rows = []
    for layout, folder in folders.items():
        run = measured(f"generate_{layout}", [sys.executable, str(GENERATOR), "--num-clients", str(args.clients),
                                              "--layout", layout, *POPULATION, "--out-dir", str(folder)],
                       REPO / "dataset", out, args.nice, args.timeout)
        if (line := failed(run)) is not None:
            print(line, file=sys.stderr)
            return 1
        rows.append(run | on_disk(folder) | {"skipped": any("skipped" in text for _, text in run["lines"])})
    workspace = out / "pfllib_workspace"
    shutil.rmtree(workspace, ignore_errors=True)
    run = measured("write_pfllib_format", [sys.executable, "-c", CONVERT, str(SYSTEM), str(args.pfllib.resolve()),
                                           str(folders["npz"]), str(workspace), NAME], REPO, out, args.nice, args.timeout)
    if (line := failed(run)) is not None:
        print(line, file=sys.stderr)
        return 1
    rows.append(run | on_disk(workspace / "dataset" / NAME))
    env = dict(os.environ, PYTHONPATH=run["lines"][-1][1], PYTHONUNBUFFERED="1")
    run = measured("pfllib", [sys.executable, "main.py", "-data", NAME, *flags(args)], workspace / "system", out,
                   args.nice, args.timeout, env)
    rows.append(run | pfllib_figures(run) | {"pfllib_commit": pfllib_commit(args.pfllib)})
    for layout, folder in reversed(folders.items()):
        for eval_clients in (0, args.eval_clients):
            name = f"ours_{layout}_eval{eval_clients}"
            results = out / "results" / name
            shutil.rmtree(results, ignore_errors=True)
            run = measured(name, [sys.executable, str(SYSTEM / "main.py"), "-data", str(folder), *flags(args),
                                  "--eval_clients", str(eval_clients), "--results_dir", str(results),
                                  "--save_model", "False", "--progress", "False", "-q", "True"],
                           SYSTEM, out, args.nice, args.timeout)
            if (line := failed(run)) is not None:
                print(line, file=sys.stderr)
                return 1
            rows.append(run | ours_figures(run, results))
    (out / "pfllib_scale.json").write_text(json.dumps([{k: v for k, v in r.items() if k not in ("lines", "samples")} for r in rows],
                                                      indent=1) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
