"""The speed benchmark's configurations P1-P3 and where the repository lies."""
from __future__ import annotations

from pathlib import Path

#: system/ (the benchmark runs from there) and the repository root
HERE = Path(__file__).resolve().parents[1]
REPO = HERE.parent

#: PFLlib itself on the project's 2-core CPU for P1 (README configuration), kept in the JSON
#: for the record only: this shared machine's speed has varied 3-4x between days, so speed-ups are
#: computed against the same-run baseline (``--engines ... pfllib``) alone
PFLLIB_P1 = {"s_per_round": 20.8, "eval_s_per_round": 7.9, "peak_rss_mb": 705.0}
#: the engine name of PFLlib's procedure re-implemented (runner/pfllib_baseline.py)
BASELINE = "pfllib"

CONFIGS: dict[str, dict] = {
    "P1": {
        "title": "MNIST CNN, 20 clients Dir(0.1), B=10, E=1, lr 0.005, all clients, eval every round",
        "algorithm": "FedAvg", "data": "mnist", "join_ratio": 1.0, "eval_gap": 1,
    },
    "P2": {
        "title": "CIFAR-10-shaped CNN, 1000 clients x 50 samples, 50 per round, B=10, E=1",
        "algorithm": "FedAvg", "data": "p2", "join_ratio": 0.05, "eval_gap": None,
    },
    "P3": {
        "title": "SCAFFOLD on P2's 1000 clients (per-client control variates), 50 per round",
        "algorithm": "SCAFFOLD", "data": "p2", "join_ratio": 0.05, "eval_gap": None,
    },
}
