"""A small multi-label dataset in the format ``generate_StackOverflow.py --task tag`` writes:
token ids ``[rows, L]`` (0 padding, words 1..V, out-of-vocabulary V + 1) and tag ids ``[rows, T]``
padded with -1, ``"label_type": "multilabel"`` in config.json; npz or packed layout."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS, TAGS, WIDTH, LENGTH = 24, 12, 5, 8


def tag_samples(rng: np.random.Generator, rows: int, skew: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose tags follow their words: tag k is present when word 2k + 1 or 2k + 2 is."""
    x = np.zeros((rows, LENGTH), dtype=np.int64)
    y = np.full((rows, WIDTH), -1, dtype=np.int64)
    for r in range(rows):
        length = int(rng.integers(1, LENGTH + 1))
        words = rng.integers(1, WORDS + 2, length)  # WORDS + 1: out of vocabulary
        words[0] = 1 + (2 * ((skew + r) % TAGS) + int(rng.integers(0, 2))) % WORDS
        x[r, :length] = words
        tags = sorted({(int(w) - 1) // 2 for w in words if 1 <= w <= WORDS})[:WIDTH]
        y[r, :len(tags)] = tags
    return x, y


def make_tag_dataset(root: Path, name: str = "Tags", sizes=(9, 14, 0, 21), test_size: int = 6,
                     layout: str = "npz", seed: int = 0) -> Path:
    """Write ``root/name``; returns the folder. Client 2 (size 0) has no training rows."""
    rng = np.random.default_rng(seed)
    folder = root / name
    parts = {"train": [], "test": []}
    for c, size in enumerate(sizes):
        for split, rows in (("train", size), ("test", test_size)):
            parts[split].append(tag_samples(rng, rows, c))
    for split in parts:
        (folder / split).mkdir(parents=True, exist_ok=True)
    config = {"num_clients": len(sizes), "num_classes": TAGS, "label_type": "multilabel", "max_labels": WIDTH,
              "label_pad": -1, "vocab_size": WORDS + 2, "pad_id": 0, "oov_id": WORDS + 1, "max_len": LENGTH,
              "input_shape": [LENGTH], "dataset": name,
              "train_samples": list(sizes), "test_samples": [test_size] * len(sizes)}
    if layout == "npz":
        for split, blocks in parts.items():
            for c, (x, y) in enumerate(blocks):
                np.savez(folder / split / f"{c}.npz", x=x, y=y)
        config["format"] = "npz-xy-v1"
    else:
        for split, blocks in parts.items():
            np.save(folder / split / "x.npy", np.concatenate([x for x, _ in blocks]))
            np.save(folder / split / "y.npy", np.concatenate([y for _, y in blocks]))
            np.save(folder / split / "offsets.npy", np.cumsum([0, *(len(y) for _, y in blocks)]).astype(np.int64))
            config[f"{split}_rows"] = int(sum(len(y) for _, y in blocks))
        config["format"] = "packed-npy-v1"
        del config["train_samples"], config["test_samples"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder
