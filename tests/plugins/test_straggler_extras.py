"""A late upload arrives whole: what the client sent besides its model (``extras``: SCAFFOLD's
control variate change, FedNova's normalising steps, FedProto's prototypes) and whether it sent the
model at all travel with it, and survive a checkpoint while in flight. Without them the server's
aggregation failed on the first late upload (SCAFFOLD, FedNova) or counted a model that was never
sent (FedProto)."""
from __future__ import annotations

import h5py
import pytest
import torch

from fltest import one_thread  # noqa: F401  (fixture)
from fltest import run_main_two_rounds, run_round
from flcore.features.stragglers import delay_of
from runner import checkpoint
from test_async import server


@pytest.mark.parametrize("algorithm", ["SCAFFOLD", "FedNova", "FedProto"])
def test_late_uploads_keep_what_they_sent(tmp_path, algorithm):
    # the drawn delays (rounds late) of clients 0..3: round 0 [1, 0, 2, 0], round 1 [0, 0, 0, 1]
    assert [delay_of(0, 2, 0, c) for c in range(4)] == [1, 0, 2, 0]
    path = run_main_two_rounds(tmp_path, algorithm, "--straggler_delay", "2")
    with h5py.File(path, "r") as f:
        sent, arrived = f["rs_bytes_up"][()], f["rs_bytes_up_arrived"][()]
    upload = sent[0] // 4  # every client's upload has the same size here
    assert list(sent) == [4 * upload, 4 * upload]
    # round 1 receives clients 0, 1, 2 and client 0's upload of round 0, each of the same size
    assert list(arrived) == [2 * upload, 4 * upload]


def test_a_run_with_scaffold_uploads_in_flight_resumes_exactly():
    flags = dict(straggler_delay=2)
    whole = server("SCAFFOLD", **flags)
    for rnd in range(5):
        run_round(whole, rnd)
    first = server("SCAFFOLD", **flags)
    for rnd in range(2):
        run_round(first, rnd)
    pending = first.plugin("stragglers").pending
    assert pending and all(p["extras"] for p in pending)  # in flight with their control variate change
    saved = checkpoint.server_state(first, 2)
    resumed = server("SCAFFOLD", **flags)
    assert checkpoint.load_server_state(resumed, saved) == 2
    for rnd in range(2, 5):
        run_round(resumed, rnd)
    assert torch.equal(resumed.global_params, whole.global_params)


def test_fedfomo_adds_a_late_uploads_weights_to_the_models_of_its_own_round(tmp_path):
    """FedFomo's upload names the models its weights are of (``fomo_ids``): a late one arrives after other
    packages were sent, whose models it never weighed (it failed with a shape error before)."""
    path = run_main_two_rounds(tmp_path, "FedFomo", "--straggler_delay", "2", "-gr", "3")
    with h5py.File(path, "r") as f:
        assert len(f["rs_test_acc"][()]) == 4
    flags = dict(straggler_delay=2)
    srv = server("FedFomo", **flags)
    for rnd in range(4):
        result = run_round(srv, rnd)
        for update in result.updates:
            assert len(update.extras["fomo_ids"]) == len(update.extras["fomo_weights"])
