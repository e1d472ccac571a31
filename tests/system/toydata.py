"""Small federated datasets in the platform's on-disk format, written by tests."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def make_dataset(
    root: Path,
    name: str = "Toy",
    num_clients: int = 4,
    input_shape: tuple[int, ...] = (1, 28, 28),
    num_classes: int = 10,
    train_sizes: list[int] | None = None,
    test_size: int = 12,
    seed: int = 0,
    eight_bit: bool = False,
) -> Path:
    """Write ``root/name`` with learnable class-dependent inputs; returns the folder.

    ``eight_bit``: inputs are normalised 8-bit pixels as the image generators write them
    (``k / 127.5 - 1`` in float32, k = 0..255)."""
    rng = np.random.default_rng(seed)
    folder = root / name
    (folder / "train").mkdir(parents=True, exist_ok=True)
    (folder / "test").mkdir(parents=True, exist_ok=True)
    train_sizes = train_sizes or [30 + 7 * i for i in range(num_clients)]
    prototypes = rng.normal(size=(num_classes, *input_shape)).astype(np.float32)
    stats = []
    for cid in range(num_clients):
        labels_seen = {}
        for split, size in (("train", train_sizes[cid]), ("test", test_size)):
            # Each client sees a skewed subset of labels so algorithms differ.
            y = rng.choice(np.arange(cid, cid + 3) % num_classes, size=size).astype(np.int64)
            x = (prototypes[y] + 0.5 * rng.normal(size=(size, *input_shape))).astype(np.float32)
            if eight_bit:
                pixels = np.clip(np.round((x + 3) / 6 * 255), 0, 255)
                x = (pixels.astype(np.float32) / np.float32(127.5) - np.float32(1)).astype(np.float32)
            np.savez_compressed(folder / split / f"{cid}.npz", x=x, y=y)
            for label in y:
                labels_seen[int(label)] = labels_seen.get(int(label), 0) + 1
        stats.append(sorted([k, v] for k, v in labels_seen.items()))
    config = {
        "num_clients": num_clients, "num_classes": num_classes, "non_iid": True, "balance": False,
        "partition": "dir", "alpha": 0.1, "batch_size": 10, "Size of samples for labels in clients": stats,
        "dataset": name, "input_shape": list(input_shape), "format": "npz-xy-v1",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder
