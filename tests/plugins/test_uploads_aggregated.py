"""Uploads that arrive and uploads the algorithm puts into the model are counted apart; FedBuff warns
when its buffer is larger than the run can fill (the model would never move)."""
from __future__ import annotations

import logging

import torch

from fltest import build_server, make_args, random_dataset


def data():
    return random_dataset(num_clients=5, dim=3, num_classes=3, sizes=[8] * 5, seed=3)


def test_a_buffer_the_run_cannot_fill_is_said_and_counted(caplog):
    with caplog.at_level(logging.WARNING, logger="fl"):
        server = build_server(make_args("FedBuff", buffer_size=1000, global_rounds=3, engine="sequential"), data())
    assert "--buffer_size 1000 exceeds the 15 uploads this run can deliver (5 a round over -gr 3)" in caplog.text
    start = server.global_params.clone()
    server.train(progress=False)
    assert torch.equal(server.global_params, start)  # no server step: the initial model
    series = server.history.extra_series["uploads_aggregated"]
    assert series == [0, 0, 0] and server.history.clients_per_round == [5, 5, 5]


def test_a_buffer_of_the_cohort_puts_every_upload_in(caplog):
    with caplog.at_level(logging.WARNING, logger="fl"):
        server = build_server(make_args("FedBuff", buffer_size=5, global_rounds=2, engine="sequential"), data())
    assert "exceeds" not in caplog.text
    server.train(progress=False)
    assert server.history.extra_series["uploads_aggregated"] == [5, 5]


def test_fedavg_records_no_separate_count():
    server = build_server(make_args("FedAvg", global_rounds=1, engine="sequential"), data())
    server.train(progress=False)
    assert "uploads_aggregated" not in server.history.extra_series
