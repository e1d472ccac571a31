"""Scale benchmark: what a population costs, from 10^3 to 10^6 synthetic clients.

For each population it generates FedProx's Synthetic data in the packed layout
(``dataset/generate_Synthetic.py --layout packed``, small clients: ``--size-log-mean 1
--size-log-std 0.5 --size-min 10``, about 13 samples each) and reports the generator's wall time
and peak RSS; then, for each cohort and model, runs ``main.py -algo FedAvg`` for ``--rounds``
rounds with ``--eval_clients`` and reports

* start-up: the process's wall time less the training loop's (``wall_time_s`` in the h5): imports,
  mapping the data, building the server; the process's wall and CPU time and peak RSS;
* peak RSS (GNU time) and peak private memory: the anonymous resident memory of the process,
  sampled every 20 ms, i.e. the RSS less the pages of the mapped dataset it touched;
* s/round: the mean time of the rounds that did not evaluate (``-eg`` past the last round, so only
  round 0 and the end are evaluated), and the evaluated round 0 beside it.

Every figure is one process measured with ``/usr/bin/time`` (GNU time, for the peak RSS)::

    python experiments/scale.py --populations 1000 10000 100000 --cohorts 100 1000 --models MLR DNN

A folder generated before with the same options is reused (the generator skips it), and its
generation is then reported as skipped. Rows go to stdout as a markdown table and to
``--out``/scale.json.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

REPO = Path(__file__).resolve().parents[1]
GENERATOR = REPO / "dataset" / "generate_Synthetic.py"
MAIN = REPO / "system" / "main.py"
#: small Synthetic clients (about 13 samples; FedProx's own sizes average ~450)
SIZES = ["--size-log-mean", "1", "--size-log-std", "0.5", "--size-min", "10"]


def private_kb(pid: int) -> int:
    """The resident anonymous memory of process ``pid`` and its descendants (KiB): its heap and
    tensors, without the file pages it maps (the packed dataset's rows); 0 once it has ended."""
    total = 0
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
        total = int(fields.get("RssAnon", "0 kB").split()[0])
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except (OSError, ValueError):
        return total
    return total + sum(private_kb(int(child)) for child in children)


def timed(command: list[str], cwd: Path) -> tuple[float, float, float, float, str]:
    """(wall s, CPU s (user + system), peak RSS MB, peak private MB, stdout) of one process: GNU
    time's figures, and the peak of its anonymous resident memory sampled every 20 ms (the RSS
    less the mapped data pages it touched); exits on failure."""
    with tempfile.TemporaryDirectory() as folder:
        log, out, err = Path(folder) / "time", Path(folder) / "out", Path(folder) / "err"
        start = time.perf_counter()
        with open(out, "w") as stdout, open(err, "w") as stderr:
            process = subprocess.Popen(["/usr/bin/time", "-f", "%U %S %M", "-o", str(log), *command], cwd=cwd,
                                       stdout=stdout, stderr=stderr, text=True)
            peak_private = 0
            while process.poll() is None:
                peak_private = max(peak_private, private_kb(process.pid))
                time.sleep(0.02)
        wall = time.perf_counter() - start
        if process.returncode != 0:
            sys.exit(f"error: {' '.join(command)} failed ({process.returncode}): {err.read_text().strip()[-500:]}")
        user, system, peak_kb = (float(v) for v in log.read_text().split()[-3:])
        printed = out.read_text()
    return wall, user + system, peak_kb / 1024, peak_private / 1024, printed


def generate(population: int, out: Path, dim: int) -> dict:
    """Generate (or reuse) the population's folder; the generator's figures."""
    folder = out / f"Synthetic_{population}"
    wall, cpu, rss, private, stdout = timed([sys.executable, str(GENERATOR), "--num-clients", str(population), "--layout", "packed",
                               "--dim", str(dim), *SIZES, "--out-dir", str(folder)], REPO / "dataset")
    skipped = "skipped" in stdout
    config = json.loads((folder / "config.json").read_text())
    return {"population": population, "folder": str(folder), "samples": config["train_rows"] + config["test_rows"],
            "gen_s": None if skipped else wall, "gen_cpu_s": None if skipped else cpu,
            "gen_rss_mb": None if skipped else rss, "gen_private_mb": None if skipped else private}


def train(folder: str, population: int, cohort: int, model: str, rounds: int, eval_clients: int, out: Path) -> dict:
    """One ``main.py`` run; start-up, peak RSS and seconds per round."""
    results = out / "results" / f"{population}_{cohort}_{model}"
    shutil.rmtree(results, ignore_errors=True)
    command = [sys.executable, str(MAIN), "-data", folder, "-m", model, "-algo", "FedAvg", "-dev", "cpu",
               "-jr", repr(min(1.0, cohort / population)), "-gr", str(rounds), "-eg", str(rounds + 1),
               "--eval_clients", str(eval_clients), "--results_dir", str(results), "--save_model", "False",
               "--progress", "False", "-q", "True"]
    wall, cpu, rss, private, _ = timed(command, REPO / "system")
    (path,) = results.glob("*.h5")
    with h5py.File(path) as f:
        round_time = np.asarray(f["rs_round_time"][()], dtype=float)
        loop = float(f.attrs["wall_time_s"])
    return {"population": population, "cohort": cohort, "model": model, "startup_s": wall - loop,
            "process_s": wall, "process_cpu_s": cpu, "run_rss_mb": rss,
            "run_private_mb": private, "round_s": float(round_time[1:].mean()) if len(round_time) > 1 else None,
            "evaluated_round_s": float(round_time[0]), "eval_clients": eval_clients}


def markdown(generated: list[dict], runs: list[dict]) -> str:
    def num(value, fmt):
        return "–" if value is None else format(value, fmt)

    lines = ["| population | samples | generation s | CPU s | generation RSS MB | private MB |", "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {g['population']:,} | {g['samples']:,} | {num(g['gen_s'], '.1f')} | {num(g['gen_cpu_s'], '.1f')} | "
              f"{num(g['gen_rss_mb'], '.0f')} | {num(g['gen_private_mb'], '.0f')} |" for g in generated]
    lines += ["", "| population | cohort | model | start-up s | process s | process CPU s | peak RSS MB | private MB | "
              "s/round | round 0 with evaluation s |", "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['population']:,} | {r['cohort']:,} | {r['model']} | {r['startup_s']:.1f} | {r['process_s']:.1f} | "
              f"{r['process_cpu_s']:.1f} | {r['run_rss_mb']:.0f} | {r['run_private_mb']:.0f} | {num(r['round_s'], '.3f')} | "
              f"{r['evaluated_round_s']:.3f} |" for r in runs]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--populations", type=int, nargs="+", default=[1000, 10000, 100000, 1000000])
    parser.add_argument("--cohorts", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--models", nargs="+", default=["MLR", "DNN"], choices=["MLR", "DNN"])
    parser.add_argument("--rounds", type=int, default=3, help="training rounds per run (at least 2)")
    parser.add_argument("--eval_clients", type=int, default=1000, help="clients sampled per evaluation")
    parser.add_argument("--dim", type=int, default=60, help="Synthetic's feature dimension")
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "out" / "scale")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()  # the generator and main.py run in their own folders
    if args.rounds < 2 or min(args.populations) < 1 or min(args.cohorts) < 1 or args.eval_clients < 0:
        print("error: --rounds must be at least 2, populations and cohorts at least 1", file=sys.stderr)
        return 2
    if not Path("/usr/bin/time").is_file():
        print("error: the peak RSS is measured with GNU time (/usr/bin/time); install it (apt-get install time)",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    generated, runs = [], []
    for population in args.populations:
        generated.append(generate(population, args.out, args.dim))
        for cohort in args.cohorts:
            if cohort > population:
                continue
            for model in args.models:
                runs.append(train(generated[-1]["folder"], population, cohort, model, args.rounds,
                                  args.eval_clients, args.out))
                print(json.dumps(runs[-1]), flush=True)
    (args.out / "scale.json").write_text(json.dumps({"generated": generated, "runs": runs}, indent=1) + "\n")
    print(markdown(generated, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
