"""FedPer: two rounds by hand (body averaged, each client's head kept), a run through main.

Shared with the other partial-sharing algorithms (``test_partial_sharing.py``): the head never
leaves the client, bytes count the body only, state under partial participation, FedPer with an
empty personal part is FedAvg and with an empty shared part is Local."""
from __future__ import annotations

import h5py

from fltest import run_main_two_rounds
from test_partial_sharing import check_two_rounds_by_hand


def test_two_rounds_by_hand():
    check_two_rounds_by_hand("FedPer", shares_body=True)


def test_two_round_run_through_main(tmp_path):
    path = run_main_two_rounds(tmp_path, "FedPer", "-jr", "0.5")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
        assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
        assert "rs_test_acc_global" not in f  # the shared model's head is only the initial one
