"""FedCross (Hu et al., ICDE 2024): middleware models, their assignment and cross-aggregation."""
from __future__ import annotations

import pytest
import torch

from flcore.servers.serverfedcross import collaborators
from fltest import assert_same_training, build_server, make_args, random_dataset, run_round
from fltest import one_thread  # noqa: F401
from utils.errors import FLError


def server_for(*flags: str, **settings):
    data = random_dataset(num_clients=4, dim=3, num_classes=2, sizes=[6, 9, 12, 7], seed=4)
    base = dict(batch_size=3, local_learning_rate=0.1, eval_auc=False, save_model=False, global_rounds=3)
    base.update(settings)
    return build_server(make_args("FedCross", *flags, **base), data)


def test_collaborator_strategies():
    sim = torch.tensor([[1.0, 0.2, -0.5], [0.2, 1.0, 0.9], [-0.5, 0.9, 1.0]], dtype=torch.float64)
    assert collaborators(sim, 1, 0) == [2, 0, 0]  # least similar other model
    assert collaborators(sim, 2, 0) == [1, 2, 1]  # most similar other model, never itself
    assert collaborators(sim, 0, 0) == [1, 2, 0]  # in order, offset t mod (K-1) + 1
    assert collaborators(sim, 0, 1) == [2, 0, 1]
    assert collaborators(sim[:1, :1], 1, 0) == [0]


@pytest.mark.parametrize("strategy", [0, 1, 2])
def test_one_round_by_hand(strategy):
    server = server_for("-ca", "0.7", "-cmss", str(strategy), join_ratio=0.75)
    w0 = server.global_params.clone()
    result = run_round(server, 0)
    assert len(result.cohort) == 3
    # every selected client started from its assigned middleware model (all equal to w0 in round 0)
    slots = server.assignment
    assert sorted(slots.values()) == [0, 1, 2]
    trained = torch.zeros(3, w0.numel())
    for update in result.updates:
        trained[slots[update.index]] = update.params
    p = server.model.num_params
    unit = trained[:, :p].double() / trained[:, :p].double().norm(dim=1, keepdim=True)
    partner = collaborators(unit @ unit.T, strategy, 0)
    expected = torch.stack([0.7 * trained[j] + 0.3 * trained[partner[j]] for j in range(3)])
    assert torch.allclose(server.middleware, expected, atol=1e-6)
    assert torch.allclose(server.global_params, expected.mean(0), atol=1e-6)
    # next round: each client starts from the middleware model it is assigned
    package = server.make_package(1, result.cohort)
    for client in result.cohort:
        assert torch.equal(package.payload(client)["start"], server.middleware[server.assignment[client]])


def test_first_stage_is_fedavg_exactly():
    data = random_dataset(num_clients=4, dim=3, num_classes=2, sizes=[6, 9, 12, 7], seed=4)
    flags = dict(batch_size=3, local_learning_rate=0.1, eval_auc=False, save_model=False, global_rounds=3, join_ratio=0.5)
    cross = build_server(make_args("FedCross", "-fsb", "10", **flags), data)
    avg = build_server(make_args("FedAvg", **flags), data)
    cross.train(progress=False)
    avg.train(progress=False)
    assert_same_training(avg, cross, exact=True)


def test_uploads_global_is_pfllib_reading():
    server = server_for("--fedcross_global", "uploads", join_ratio=0.5)
    result = run_round(server, 0)
    weights = torch.tensor([u.num_samples for u in result.updates], dtype=torch.float64)
    mean = sum(float(w) * u.params for w, u in zip(weights / weights.sum(), result.updates))
    assert torch.allclose(server.global_params, mean, atol=1e-6)


def test_a_varying_cohort_is_refused():
    with pytest.raises(FLError, match="-rjr"):
        server_for("-rjr", "True")
