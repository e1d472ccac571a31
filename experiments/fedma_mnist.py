"""FedMA against FedAvg and FedProx on MNIST at equal communication (Wang et al., ICLR 2020,
whose direction is FedMA ≥ FedAvg on MNIST with LeNet).

Every method runs the same rounds; the table gives each method's accuracy after each round and the
megabytes sent so far (uploads + downloads, ``rs_bytes_up``/``rs_bytes_down``), and, per baseline,
its best accuracy within the bytes FedMA used in all its rounds (equal communication). FedMA's
hidden widths after each round (``rs_widths``) are listed too.

    .venv/bin/python experiments/fedma_mnist.py            # generates MNIST Dir 0.5 over 20 clients
    .venv/bin/python experiments/fedma_mnist.py --model VGG9 --clients 10 --samples 100 --test_rows 100 \
        --methods FedAvg FedMA --rounds 10 --local_epochs 2
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import h5py
import numpy as np

from common import MNIST_RAW, OUT, Run, add_training_flags, generate_data, results_folder, run_variant, write_table
from flcore.registry import load_all  # importable once common has put system/ on the path

ROWS = [("FedAvg", "FedAvg", []), ("FedProx mu 0.01", "FedProx", ["-mu", "0.01"]), ("FedMA", "FedMA", [])]


def with_test_rows(data: Path, rows: int, seed: int = 0) -> Path:
    """A copy of ``data`` whose clients keep at most ``rows`` test samples each (a seeded random
    subset): the generator caps the training samples only, and evaluating a VGG-9 on every other
    sample of a client costs more than its training on a CPU. Written once (config.json last)."""
    out = data.with_name(f"{data.name}_test{rows}")
    if (out / "config.json").is_file():
        return out
    config = json.loads((data / "config.json").read_text())
    rng = np.random.default_rng(seed)
    for split in ("train", "test"):
        (out / split).mkdir(parents=True, exist_ok=True)
    for cid in range(config["num_clients"]):
        with np.load(data / "train" / f"{cid}.npz", allow_pickle=False) as f:
            np.savez(out / "train" / f"{cid}.npz", x=f["x"], y=f["y"])
        with np.load(data / "test" / f"{cid}.npz", allow_pickle=False) as f:
            kept = np.sort(rng.permutation(len(f["y"]))[:rows])
            np.savez(out / "test" / f"{cid}.npz", x=f["x"][kept], y=f["y"][kept])
            config["test_samples"][cid] = len(kept)
    (out / "config.json").write_text(json.dumps(config))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_flags(parser, lr=0.05, lr_help="local learning rate", batch_size=10)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--model", default="LeNet")
    parser.add_argument("--clients", type=int, default=20, help="clients of the Dirichlet 0.5 split")
    parser.add_argument("--samples", type=int, default=300, help="training samples per client")
    parser.add_argument("--test_rows", type=int, default=0, help="test samples kept per client (0: all)")
    parser.add_argument("--methods", nargs="*", default=[label for label, _, _ in ROWS],
                        choices=[label for label, _, _ in ROWS], help="rows of the table")
    parser.add_argument("--only", nargs="*", default=None,
                        help="rows to run (labels); the others are read back from their earlier results")
    parser.set_defaults(times=1)
    args = parser.parse_args()
    load_all()
    data = OUT / "data" / f"MNIST_dir0.5_{args.clients}c_{args.samples}s"
    generate_data("generate_MNIST.py", ["noniid", "-", "dir", "--alpha", "0.5", "--num-clients", str(args.clients),
                                        "--samples-per-client", str(args.samples), "--raw-dir", str(MNIST_RAW),
                                        "--out-dir", str(data)])
    if args.test_rows:
        data = with_test_rows(data, args.test_rows)
    # one folder per seed; the first set-up (LeNet, 20 x 300) keeps its original folder names
    setup = (args.model, args.clients, args.samples)
    experiment = "fedma_mnist" + ("" if setup == ("LeNet", 20, 300) else "_{}_{}c_{}s".format(*setup))
    experiment += f"_test{args.test_rows}" if args.test_rows else ""
    experiment += "" if args.seed == 0 else f"_seed{args.seed}"
    curves = {}
    for label, algo, flags in (row for row in ROWS if row[0] in args.methods):
        earlier = sorted(results_folder(experiment, label).glob("*.h5"))
        if args.only is not None and label not in args.only and earlier:
            run = Run(earlier, float("nan"))
        else:
            run = run_variant(experiment, label, algo, flags, data, args, args.model, args.rounds,
                              extra=["-jr", "1", "--engine", "sequential", "--num_threads", "1"], quiet=True)
        if isinstance(run, str):
            curves[label] = run
            continue
        with h5py.File(run.paths[0]) as f:
            sent = np.cumsum(f["rs_bytes_up"][()] + f["rs_bytes_down"][()]) / 1e6
            seconds = float(f.attrs["wall_time_s"]) if "wall_time_s" in f.attrs else run.seconds()
            curves[label] = (f["rs_test_acc"][()], sent, f["rs_widths"][()] if "rs_widths" in f else None, seconds)
    test = f" ({args.test_rows} test samples each)" if args.test_rows else ""
    lines = [f"model {args.model}, MNIST Dir 0.5, {args.clients} clients x {args.samples} training samples{test}, "
             "all clients every round, E = "
             f"{args.local_epochs}, B = {args.batch_size}, lr = {args.lr}, seed {args.seed}; accuracy in % "
             "(sample-weighted over the clients' test splits) after each round, MB sent so far in parentheses", "",
             "| method | " + " | ".join(f"round {r}" for r in range(1, args.rounds + 1)) + " | time (s) |",
             "|---|" + "---|" * (args.rounds + 1)]
    for label, curve in curves.items():
        if isinstance(curve, str):
            lines.append(f"| {label} | {curve} |")
            continue
        acc, sent, _, seconds = curve
        cells = [f"{100 * a:.2f} ({mb:.0f})" for a, mb in zip(acc[1:], sent)]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {seconds:.0f} |")
    fedma = curves.get("FedMA")
    if not isinstance(fedma, str) and fedma is not None:
        budget = fedma[1][-1]
        lines += ["", f"At equal communication (FedMA's {budget:.0f} MB): FedMA {100 * fedma[0][-1]:.2f}"]
        for label, curve in curves.items():
            if label != "FedMA" and not isinstance(curve, str):
                within = [a for a, mb in zip(curve[0][1:], curve[1]) if mb <= budget + 1e-9]
                best = f"{100 * max(within):.2f}" if within else "– (one round costs more)"
                lines[-1] += f"; {label} best {best}"
        lines += ["", "FedMA's hidden widths after each round: "
                  + ", ".join(str(list(map(int, w))) for w in fedma[2])]
    write_table(experiment, lines)


if __name__ == "__main__":
    main()
