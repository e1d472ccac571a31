"""Shared pytest set-up: import paths and locations of the offline data in ../shared."""
import sys
from pathlib import Path

import torch

# Test models are tiny: one thread avoids oversubscribing a small CI machine.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
MNIST_RAW = SHARED / "data" / "MNIST" / "raw"
PFLLIB_SAMPLE = SHARED / "data" / "pfllib-MNIST-dir0.1-20-sample"
FASHION_RAW = Path("/usr/share/datasets/fashion-mnist")

# `system/` is the import root of the simulator (PFLlib runs `python main.py` from there);
# `dataset/` is the generators' import root (their helpers are the package `datagen`, imported
# under that one name everywhere, as the generate_*.py scripts do); tests/system holds shared
# test helpers (fltest, toydata).
for path in (REPO / "tests" / "system", REPO / "dataset", REPO / "system", REPO):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def pytest_configure(config):
    # models of tens of millions of parameters (tests/models) take seconds each on a 2-core CPU:
    # they run with the suite, and `pytest -m "not slow"` leaves them out while developing
    config.addinivalue_line("markers", "slow: builds or trains a model of tens of millions of parameters")
    # the Ray engine's tests start a local Ray instance (seconds): `pytest -m "not ray"` leaves them out
    config.addinivalue_line("markers", "ray: starts a Ray instance on 127.0.0.1 (needs ./prepare.sh --ray)")
