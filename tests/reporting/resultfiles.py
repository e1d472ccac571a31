"""Result files with known contents for the summary and report tests, in both layouts.

``write_ours`` writes what main.py writes (the extra series, the attributes and the JSON
configuration); ``write_pfllib`` only PFLlib's three datasets and no attribute.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np


def write_ours(folder: Path, dataset: str, algo: str, goal: str, run: int, acc: list[float], *,
               eval_gap: int = 1, round_time: float = 0.5, bytes_up: int = 1000,
               global_acc: list[float] | None = None, finished: bool | None = True,
               clients: int = 4, extra_series: dict[str, list[float]] | None = None,
               attrs: dict[str, Any] | None = None, personalized: bool | None = False) -> Path:
    """A run evaluated every ``eval_gap`` rounds with test accuracies ``acc`` (round 0 first);
    ``personalized=None`` leaves that attribute out, as files written before it existed."""
    acc_arr = np.asarray(acc, dtype=float)
    evals = acc_arr.size
    rounds = (evals - 1) * eval_gap  # training rounds; the last evaluation follows the last one
    path = folder / f"{dataset}_{algo}_{goal}_{run}.h5"
    spread = np.linspace(-0.1, 0.1, clients)
    with h5py.File(path, "w") as handle:
        handle.create_dataset("rs_test_acc", data=acc_arr)
        handle.create_dataset("rs_test_auc", data=np.clip(acc_arr + 0.05, 0, 1))
        handle.create_dataset("rs_train_loss", data=2.0 - acc_arr)
        handle.create_dataset("rs_test_acc_std", data=np.full(evals, 0.01))
        handle.create_dataset("rs_eval_rounds", data=np.arange(evals, dtype=np.int64) * eval_gap)
        handle.create_dataset("rs_round_time", data=np.full(rounds, round_time))
        handle.create_dataset("rs_bytes_up", data=np.full(rounds, bytes_up, dtype=np.int64))
        handle.create_dataset("rs_bytes_down", data=np.full(rounds, 2 * bytes_up, dtype=np.int64))
        handle.create_dataset("rs_clients_per_round", data=np.full(rounds, clients, dtype=np.int64))
        handle.create_dataset("rs_client_acc", data=np.clip(acc_arr[:, None] + spread[None, :], 0, 1))
        if global_acc is not None:
            handle.create_dataset("rs_test_acc_global", data=np.asarray(global_acc, dtype=float))
            handle.create_dataset("rs_test_auc_global", data=np.asarray(global_acc, dtype=float))
        for name, values in (extra_series or {}).items():
            handle.create_dataset(name, data=np.asarray(values, dtype=float))
        config = {"dataset": dataset, "algorithm": algo, "goal": goal, "eval_gap": eval_gap,
                  "global_rounds": rounds, "seed": run, "local_learning_rate": 0.05}
        handle.attrs.update({
            "algorithm": algo, "dataset": dataset, "goal": goal, "run": run, "seed": run,
            "config": json.dumps(config), "peak_rss_mb": 100.0 + 10 * run,
        })
        if finished is not None:
            handle.attrs["finished"] = finished
        if personalized is not None:
            handle.attrs["personalized"] = personalized
        handle.attrs.update(attrs or {})
    return path


def write_pfllib(folder: Path, dataset: str, algo: str, goal: str, run: int, acc: list[float]) -> Path:
    """A result file as PFLlib writes it: three datasets, no attributes."""
    acc_arr = np.asarray(acc, dtype=float)
    path = folder / f"{dataset}_{algo}_{goal}_{run}.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("rs_test_acc", data=acc_arr)
        handle.create_dataset("rs_test_auc", data=acc_arr)
        handle.create_dataset("rs_train_loss", data=1.0 - acc_arr)
    return path


# Three FedAvg repeats (11 evaluations, rounds 0..10), two Ditto repeats with the shared model's
# accuracy, two PFLlib-format FedProx files, one unfinished SCAFFOLD run on another dataset.
FEDAVG = [
    [0.10, 0.40, 0.55, 0.65, 0.70, 0.74, 0.78, 0.80, 0.82, 0.84, 0.85],
    [0.10, 0.35, 0.50, 0.62, 0.69, 0.73, 0.77, 0.81, 0.83, 0.83, 0.86],
    [0.10, 0.45, 0.58, 0.66, 0.72, 0.76, 0.79, 0.82, 0.84, 0.86, 0.87],
]
DITTO = [[0.1, 0.6, 0.8, 0.9], [0.1, 0.5, 0.7, 0.88]]
DITTO_GLOBAL = [[0.1, 0.3, 0.5, 0.6], [0.1, 0.35, 0.45, 0.62]]
FEDPROX = [[0.1, 0.3, 0.5, 0.6], [0.2, 0.4, 0.6, 0.7]]


def write_folder(folder: Path) -> Path:
    """The results folder the reporting tests share (see the constants above)."""
    folder.mkdir(parents=True, exist_ok=True)
    for run, acc in enumerate(FEDAVG):
        # The virtual clock (flcore/features/clock.py) runs 2 s per round: rs_virtual_time is its reading.
        write_ours(folder, "MNIST", "FedAvg", "test", run, acc, bytes_up=1_000_000 * (run + 1),
                   extra_series={"rs_virtual_time": 2.0 * np.arange(1, len(acc))})
    for run, (acc, glob) in enumerate(zip(DITTO, DITTO_GLOBAL)):
        write_ours(folder, "MNIST", "Ditto", "test", run, acc, global_acc=glob, personalized=True,
                   extra_series={"rs_dp_epsilon": [0.5, 1.0, 1.5 + run]})
    for run, acc in enumerate(FEDPROX):
        write_pfllib(folder, "MNIST", "FedProx", "test", run, acc)
    write_ours(folder, "Cifar10", "SCAFFOLD", "test", 0, [0.1, 0.2, 0.3], finished=False)
    return folder
