"""Shared pytest set-up: import paths and locations of the offline data in ../shared."""
import signal
import sys
from pathlib import Path

import pytest
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


@pytest.fixture(autouse=True)
def signal_handlers_left_as_found(request):
    """A test that leaves a SIGINT or SIGTERM handler of its own behind fails (the handler is put
    back): the stop tests of later files depend on the process's handlers (a simulated Ctrl-C calls
    whatever handler is installed), so a leak shows where it happens, not as their failure."""
    found = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    left = {signum: handler for signum, handler in found.items() if signal.getsignal(signum) != handler}
    for signum, handler in left.items():
        signal.signal(signum, handler)
    if left:
        pytest.fail(f"{request.node.nodeid} left its own handler for "
                    + ", ".join(signal.Signals(signum).name for signum in left)
                    + "; restore the one it found (later tests depend on it)", pytrace=False)
