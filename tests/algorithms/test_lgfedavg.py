"""LG-FedAvg: two rounds by hand (head averaged, each client's body kept).

Shared with the other partial-sharing algorithms (``test_partial_sharing.py``): the body never
leaves the client, bytes count the head only, state under partial participation, LG-FedAvg with
an empty local part (a parameterless body) is FedAvg."""
from __future__ import annotations


from test_partial_sharing import check_two_rounds_by_hand


def test_two_rounds_by_hand():
    check_two_rounds_by_hand("LG-FedAvg", shares_body=False)

