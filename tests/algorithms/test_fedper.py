"""FedPer: two rounds by hand (body averaged, each client's head kept).

Shared with the other partial-sharing algorithms (``test_partial_sharing.py``): the head never
leaves the client, bytes count the body only, state under partial participation, FedPer with an
empty personal part is FedAvg and with an empty shared part is Local."""
from __future__ import annotations


from test_partial_sharing import check_two_rounds_by_hand


def test_two_rounds_by_hand():
    check_two_rounds_by_hand("FedPer", shares_body=True)

