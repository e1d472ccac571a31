"""FedAsync's α decay (the authors' code's schedule, ``--async_alpha_decay_at``): by hand on one round."""
from __future__ import annotations

import torch

from fltest import build_server, make_args, random_dataset
from fltest import one_thread  # noqa: F401  (fixture)
from flcore.servers.serverfedasync import mix_uploads

CLIENTS = 6


def server(**flags):
    data = random_dataset(num_clients=CLIENTS, dim=4, num_classes=3, seed=4, sizes=[10] * CLIENTS)
    flags = {"batch_size": 5, "global_rounds": 2, "async_alpha": 0.5, "staleness_fn": "constant", **flags}
    return build_server(make_args("FedAsync", engine="sequential", num_clients=CLIENTS, **flags), data)


def test_alpha_is_multiplied_by_the_decay_from_the_given_server_update_on():
    srv = server(async_alpha_decay_at=4, async_alpha_decay=0.25)
    before = srv.global_params.clone()
    updates = srv.run_round(0, evaluate=False).updates
    assert len(updates) == CLIENTS and srv.mixes == CLIENTS
    # uploads 0-3 follow 0..3 earlier updates: α = 0.5; uploads 4 and 5 follow 4 and 5: α = 0.5 · 0.25
    expected = before
    for k, update in enumerate(updates):
        alpha = 0.5 if k < 4 else 0.125
        expected = (1 - alpha) * expected + alpha * update.params
    assert torch.allclose(srv.global_params, expected, atol=1e-6)
    constant = mix_uploads(before, [(u.params, 1.0) for u in updates], 0.5)
    assert not torch.allclose(srv.global_params, constant, atol=1e-4)  # the decay changed the result
    assert srv.summary()["async_alpha_decay_at"] == 4


def test_no_decay_point_means_the_papers_constant_alpha():
    srv = server()
    before = srv.global_params.clone()
    updates = srv.run_round(0, evaluate=False).updates
    assert torch.equal(srv.global_params, mix_uploads(before, [(u.params, 1.0) for u in updates], 0.5))
