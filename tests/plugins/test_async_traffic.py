"""Upload traffic: ``rs_bytes_up`` counts every upload the round's clients sent, in the round they
sent it; ``rs_bytes_up_arrived`` what reached the server in the round (a straggler's upload in the
round it arrives, a ``-cdr`` drop-out never). Hand counts on 4 clients, 2 rounds, seed 0."""
from __future__ import annotations

import h5py
import numpy as np

from fltest import run_main_two_rounds
from flcore.features.stragglers import delay_of
from utils.seeding import numpy_rng


def series(path) -> tuple[np.ndarray, np.ndarray, dict]:
    with h5py.File(path, "r") as f:
        return f["rs_bytes_up"][()], f["rs_bytes_up_arrived"][()], dict(f.attrs)


def test_fedasync_counts_what_stragglers_sent_apart_from_what_arrived(tmp_path, capsys):
    # the drawn delays (rounds late) of clients 0..3: round 0 [1, 0, 2, 0], round 1 [0, 0, 0, 1]
    assert [delay_of(0, 2, 0, c) for c in range(4)] == [1, 0, 2, 0]
    assert [delay_of(0, 2, 1, c) for c in range(4)] == [0, 0, 0, 1]
    sent, arrived, attrs = series(run_main_two_rounds(tmp_path, "FedAsync", "--straggler_delay", "2"))
    upload = sent[0] // 4  # one client's model, in bytes
    assert upload > 0 and list(sent) == [4 * upload, 4 * upload]  # all 4 clients upload in each round
    # round 0: clients 1 and 3 arrive; round 1: clients 0, 1, 2 and client 0's upload of round 0.
    # Client 2's upload of round 0 (due in round 2) and client 3's of round 1 (due in 2) never arrive.
    assert list(arrived) == [2 * upload, 4 * upload]
    assert attrs["total_bytes_up"] == 8 * upload and attrs["total_bytes_up_arrived"] == 6 * upload
    line = next(line for line in capsys.readouterr().out.splitlines() if "uploaded" in line)
    assert line.endswith(f"uploaded {8 * upload / 1e6:.1f} MB ({6 * upload / 1e6:.1f} MB arrived)")


def test_fedasync_ignoring_stragglers_sends_them_but_receives_none(tmp_path):
    sent, arrived, _ = series(run_main_two_rounds(tmp_path, "FedAsync", "--straggler_delay", "2",
                                                  "--straggler_policy", "ignore"))
    upload = sent[0] // 4
    assert list(sent) == [4 * upload, 4 * upload]
    assert list(arrived) == [2 * upload, 3 * upload]  # only the uploads with no delay


def test_synchronous_fedavg_sends_what_arrives(tmp_path, capsys):
    sent, arrived, attrs = series(run_main_two_rounds(tmp_path, "FedAvg"))
    assert (sent > 0).all() and np.array_equal(sent, arrived)
    assert attrs["total_bytes_up"] == attrs["total_bytes_up_arrived"] == sent.sum()
    assert "arrived" not in capsys.readouterr().out  # the summary line names one figure


def test_client_drop_outs_sent_but_did_not_arrive(tmp_path):
    kept = [int((numpy_rng(0, "drop", rnd).random(4) >= 0.5).sum()) for rnd in range(2)]
    assert kept == [3, 3]  # one of the 4 uploads drops out in each round
    sent, arrived, _ = series(run_main_two_rounds(tmp_path, "FedAvg", "-cdr", "0.5"))
    upload = sent[0] // 4
    assert list(sent) == [4 * upload, 4 * upload] and list(arrived) == [3 * upload, 3 * upload]


def test_uploads_the_time_threshold_rejects_were_sent_and_arrived(tmp_path):
    """``-tth`` discards an upload after the server waited for it: sent and arrived, not aggregated."""
    path = run_main_two_rounds(tmp_path, "FedAvg", "-tth", "1e-9")
    sent, arrived, _ = series(path)
    with h5py.File(path, "r") as f:
        assert list(f["rs_clients_per_round"][()]) == [0, 0]  # every upload rejected
    assert (sent > 0).all() and np.array_equal(sent, arrived)

