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


def test_a_packed_population_holds_the_pictured_clients_counts_and_summarises_all(tmp_path, monkeypatch, capsys):
    """The packed writer keeps label counts for the clients the picture draws and running figures
    for the rest (the summary's label skew is read back from the written labels): its summary is
    the npz layout's, which holds every client's counts."""
    from datagen import dataset_utils

    held = []
    real = dataset_utils._write_all

    def spy(*args, **kwargs):
        keys, stats = real(*args, **kwargs)
        held.append(stats["labels"].shape)
        return keys, stats

    monkeypatch.setattr(dataset_utils, "_write_all", spy)
    monkeypatch.setattr(dataset_utils, "PICTURE_CLIENTS", 3)
    monkeypatch.setattr(dataset_utils, "SKEW_ENTRIES", 20)  # two clients of 10 classes a block
    summaries = []
    for layout in ("npz", "packed"):
        argv = ["--num-clients", "7", "--layout", layout, "--size-log-mean", "1", "--size-min", "5",
                "--out-dir", str(tmp_path / layout)]
        assert dataset_utils.main_synthetic(argv, tmp_path) == 0
        out = capsys.readouterr().out.splitlines()
        summaries.append(out[next(i for i, line in enumerate(out) if line.startswith("Partition summary")):][:4])
    assert held == [(7, 10), (3, 10)]
    assert summaries[0] == summaries[1] and "over the first" not in summaries[1][3]
    assert "7 clients" in summaries[1][0]
