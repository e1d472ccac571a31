"""Issue 24's directional runs: the knowledge-transfer algorithms (FedProto, FD, FedPCL, FedGH, FedPAC,
FML, FedKD) against Local and FedAvg, personalised accuracy, mean ± std over seeds.

Every row runs ``main.main`` ``--times`` times (seeds seed..seed+times-1) on one partition (default:
MNIST, Dirichlet 0.1, 20 clients, generated under ``experiments/out/data``) with the same flags
(PFLlib's defaults: B = 10, E = 1, lr 0.005, every client every round) and each algorithm's PFLlib
defaults, ours where PFLlib's switch the method off (none of these seven). FedProto's
nearest-prototype accuracy (``rs_test_acc_proto``) is reported beside its personal-head accuracy.

    python experiments/knowledge_directional.py --rounds 10 --data DIR [--only FedProto FD]

The table is printed and written to ``experiments/out/knowledge_directional.md``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import h5py
import numpy as np

from common import MNIST_RAW, OUT, add_only_and_data_flags, add_training_flags, generate_data, mean_std, run_variant, \
    write_table
from flcore.registry import load_all  # noqa: E402  (common puts system/ on the path)

#: row label -> (algorithm, its flags)
ROWS: dict[str, tuple[str, list[str]]] = {
    "Local": ("Local", []), "FedAvg": ("FedAvg", []),
    "FedProto": ("FedProto", ["-lam", "1.0"]), "FD": ("FD", ["-lam", "1.0"]), "FedPCL": ("FedPCL", ["-tau", "1.0"]),
    "FedGH": ("FedGH", ["-slr", "1.0"]), "FedPAC": ("FedPAC", ["-lam", "1.0"]),
    "FML": ("FML", ["-al", "1.0", "-bt", "0.0"]), "FedKD": ("FedKD", ["-mlr", "0.005", "-Ts", "0.95", "-Te", "0.98"]),
}


def curve_stats(paths: list[Path], name: str = "rs_test_acc") -> tuple[list[float | None], list[float | None]]:
    """(final, best) value of the series ``name`` in each results file (None where it is missing)."""
    finals, bests = [], []
    for path in paths:
        with h5py.File(path, "r") as f:
            values = np.asarray(f[name][()], dtype=float) if name in f else np.zeros(0)
        values = values[np.isfinite(values)]
        finals.append(float(values[-1]) if len(values) else None)
        bests.append(float(values.max()) if len(values) else None)
    return finals, bests


def main_(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_flags(parser, lr=0.005, lr_help="local learning rate (PFLlib's default)", batch_size=10)
    add_only_and_data_flags(parser, f"rows to run (default: {' '.join(ROWS)})")
    parser.add_argument("--rounds", type=int, default=50, help="-gr of every run (issue 24: 50+)")
    parser.add_argument("--model", default="DNN")
    args = parser.parse_args(argv)
    load_all()
    data = args.data
    if data is None:
        data = OUT / "data" / "MNIST-dir0.1-20"
        generate_data("generate_MNIST.py", ["noniid", "-", "dir", "--alpha", "0.1", "--num-clients", "20",
                                            "--raw-dir", str(MNIST_RAW), "--out-dir", str(data)])
    lines = ["| algorithm | final personalised acc. (%) | best (%) | runs | s/run |", "|---|---|---|---|---|"]
    for label in args.only or list(ROWS):
        algo, flags = ROWS[label]
        run = run_variant("knowledge_directional", label, algo, flags, Path(data).resolve(), args, args.model,
                          args.rounds, extra=["--engine", "sequential", "--num_threads", "1"], quiet=True)
        if isinstance(run, str):
            lines.append(f"| {label} | {run} | | | |")
            continue
        finals, bests = curve_stats(run.paths)
        lines.append(f"| {label} | {mean_std(finals)} | {mean_std(bests)} | {len(run.paths)} | "
                     f"{run.seconds() / max(len(run.paths), 1):.0f} |")
        if algo == "FedProto":
            finals, bests = curve_stats(run.paths, "rs_test_acc_proto")
            lines.append(f"| {label} (nearest prototype) | {mean_std(finals)} | {mean_std(bests)} | {len(run.paths)} | |")
        print(lines[-1], flush=True)
    write_table("knowledge_directional" + ("" if not args.only else "_" + "_".join(args.only)), lines)


if __name__ == "__main__":
    main_()
