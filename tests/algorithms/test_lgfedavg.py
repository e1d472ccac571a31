"""LG-FedAvg: two rounds by hand (head averaged, each client's body kept), a run through main.

Shared with the other partial-sharing algorithms (``test_partial_sharing.py``): the body never
leaves the client, bytes count the head only, state under partial participation, LG-FedAvg with
an empty local part (a parameterless body) is FedAvg."""
from __future__ import annotations

import h5py

from fltest import run_main_two_rounds
from test_partial_sharing import check_two_rounds_by_hand


def test_two_rounds_by_hand():
    check_two_rounds_by_hand("LG-FedAvg", shares_body=False)


def test_two_round_run_through_main(tmp_path):
    path = run_main_two_rounds(tmp_path, "LG-FedAvg", "-jr", "0.5")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
        assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
        assert "rs_test_acc_global" not in f
