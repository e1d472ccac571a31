"""A population of 10^5 clients starts without Python work per client: the server builds its
clients when first touched (``LazyClients``), the virtual clock draws a client's speeds when a
round first times it, and the start-up checks read the clients' sizes from the packed offsets.
Algorithms whose every round needs every client refuse a population above their limit in one line."""
from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from fltest import build_server, make_args, random_dataset
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from flcore.servers.serverbase import Server
from runner.checks import validate_with_data
from fldata.loading import load_federated_dataset
from utils.errors import FLError

REPO = Path(__file__).resolve().parents[2]
POPULATION = 100_000
#: bounds on building the server for 10^5 clients (CPU seconds of this process, and the peak of the
#: Python and NumPy allocations tracemalloc sees). Generous: the lazy start-up needs a small fraction of
#: them, while one Client object per client, or one seeded generator per client in the clock, costs
#: several seconds and tens of MB at this population
START_CPU_S = 2.0
START_ALLOC_MB = 30.0


@pytest.fixture(scope="module")
def population(tmp_path_factory) -> Path:
    """10^5 small Synthetic clients (about 13 samples of 2 features), packed, from the real generator."""
    folder = tmp_path_factory.mktemp("large") / "Synthetic"
    done = subprocess.run([sys.executable, str(REPO / "dataset" / "generate_Synthetic.py"), "--num-clients",
                           str(POPULATION), "--dim", "2", "--num-classes", "2", "--size-log-mean", "1",
                           "--size-log-std", "0.5", "--size-min", "10", "--layout", "packed", "--out-dir", str(folder)],
                          cwd=REPO / "dataset", capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return folder


def test_a_large_population_starts_without_work_per_client_and_trains_a_round(population):
    args = make_args("FedAvg", dataset=str(population), join_ratio=0.0005, global_rounds=1, eval_clients=20, batch_size=4,
                     eval_auc=False)
    dataset = load_federated_dataset(str(population), "cpu")
    assert len(dataset.clients) == POPULATION
    tracemalloc.start()
    began = time.process_time()
    validate_with_data(args, dataset)
    server = build_server(args, dataset)
    seconds = time.process_time() - began
    peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    assert seconds < START_CPU_S, f"building the server for {POPULATION} clients took {seconds:.2f} CPU s"
    assert peak_mb < START_ALLOC_MB, f"building the server for {POPULATION} clients allocated {peak_mb:.1f} MB"
    assert server.clients.built == 1
    result = server.run_round(0)
    assert len(result.cohort) == 50 and len(result.updates) == 50
    assert server.clients.built <= 1 + 50 + 20  # the cohort and the evaluated sample
    assert len(server.history.client_acc[-1]) == 20
    clock = server.plugin("clock")
    assert clock.now > 0
    # the clock keeps the speeds and time costs of the clients it timed, not of the population
    assert len(clock._drawn) == len(clock.client_seconds) == len(clock.client_rounds) == 50


@pytest.mark.parametrize("algorithm,flags,why", [
    ("FedFomo", {}, "affinity between every pair of clients"),
    ("APPLE", {}, "every client's core model"),
    ("FedAMP", {"fedamp_pool": "all"}, "--fedamp_pool all"),
    ("pFedMe", {"pfedme_all_clients": True}, "--pfedme_all_clients trains every client every round"),
])
def test_algorithms_that_need_every_client_each_round_refuse_a_population_above_their_limit(
        monkeypatch, algorithm, flags, why):
    data = random_dataset(num_clients=3, dim=2, num_classes=2)
    monkeypatch.setattr(Server, "ALL_CLIENTS_LIMIT", 2)
    with pytest.raises(FLError, match=f"{algorithm} runs on at most 2 clients and the dataset has 3: .*{why}") as err:
        build_server(make_args(algorithm, **flags), data)
    assert "\n" not in str(err.value)
    monkeypatch.setattr(Server, "ALL_CLIENTS_LIMIT", 3)
    build_server(make_args(algorithm, **flags), data)  # at the limit it runs


@pytest.mark.parametrize("algorithm", ["FedAMP", "pFedMe"])
def test_without_the_all_clients_flag_there_is_no_limit(monkeypatch, algorithm):
    monkeypatch.setattr(Server, "ALL_CLIENTS_LIMIT", 2)
    build_server(make_args(algorithm), random_dataset(num_clients=3, dim=2, num_classes=2))
