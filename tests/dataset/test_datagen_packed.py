"""A natural text dataset (token ids, int64) written in the packed layout reads as its npz files do."""
import subprocess
import sys

import torch
from conftest import REPO
from datagen_helpers import write_leaf_json

from fldata.loading import load_federated_dataset


def test_natural_text_clients_in_either_layout_are_the_same_token_ids(tmp_path):
    text = "To be, or not to be, that is the question: Whether 'tis nobler in the mind" * 3
    write_leaf_json(tmp_path / "leaf", {f"PLAY_{role}": ([text[i:i + 80] for i in range(6 + k)],
                                                        [text[i + 80] for i in range(6 + k)])
                                        for k, role in enumerate(["A", "B", "C"])})
    loaded = []
    for layout in ("npz", "packed"):
        out = tmp_path / layout
        proc = subprocess.run([sys.executable, "generate_Shakespeare.py", "--raw-dir", str(tmp_path / "leaf"), "--out-dir", str(out),
                               "--layout", layout], cwd=REPO / "dataset", capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        loaded.append(load_federated_dataset(str(out)))
    for split in ("train", "test"):
        (xa, ya), (xb, yb) = loaded[0].split(split), loaded[1].split(split)
        assert xa.dtype == xb.dtype == torch.int64 and torch.equal(xa, xb) and torch.equal(ya, yb)
    assert loaded[1].config["client_names"] == loaded[0].config["client_names"]
