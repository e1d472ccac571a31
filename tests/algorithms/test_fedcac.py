"""FedCAC: critical masks, overlaps, collaborators and start points by hand, no critical parameter is
FedAvg, the upload holds the mask, partial participation, main."""
from __future__ import annotations

import pytest
import torch

from fltest import (build_server, gradient_descent, make_args, random_dataset, run_main_two_rounds, run_round,
                    trained_server)
from flcore.clients.clientfedcac import critical_mask
from flcore.servers.serverfedcac import overlaps
from utils.errors import FLError


def test_critical_mask_per_tensor():
    s = torch.tensor([0.5, 0.1, 0.3, 0.2, 0.0, 2.0])
    assert critical_mask(s, [0, 4, 6], 0.5).tolist() == [True, False, True, False, False, True]
    assert critical_mask(s, [0, 4, 6], 0.2).tolist() == [False] * 6  # ⌊0.2·4⌋ = ⌊0.2·2⌋ = 0
    # a threshold below 1e-10 becomes the smallest sensitivity above 1e-20: still-parameters are not critical
    still = torch.tensor([0.0, 0.0, 0.0, 3e-5])
    assert critical_mask(still, [0, 4], 0.75).tolist() == [False, False, False, True]


def test_overlaps():
    m = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    o = overlaps(m)
    assert o[0, 1] == pytest.approx(1 - 2 / 4) and o[0, 0] == 1.0 and o[2, 0] == 0.0 and o[0, 2] == pytest.approx(0.5)


def test_two_rounds_by_hand():
    lr, tau, beta = 0.3, 0.5, 3.0
    data = random_dataset(num_clients=3, dim=2, num_classes=2, sizes=[4, 6, 10], seed=1)
    server = build_server(make_args("FedCAC", "-tau", str(tau), "-bt", str(beta), batch_size=16, local_epochs=2,
                                    drop_last=False, local_learning_rate=lr), data)
    bounds = [0, 4, 6]  # head.weight (2x2), head.bias (2)
    xy = [(c.train_x.double(), c.train_y) for c in data.clients]
    w = server.global_params.double()
    masks, customized = [None] * 3, [None] * 3
    for rnd in range(2):
        starts = []
        for i in range(3):
            s = w.clone()
            if masks[i] is not None:
                s[masks[i]] = customized[i][masks[i]]
            starts.append(s)
        trained = [gradient_descent(starts[i], *xy[i], 2, 2, lr) for i in range(3)]
        masks = [critical_mask(((trained[i] - starts[i]) * trained[i]).abs(), bounds, tau) for i in range(3)]
        o = overlaps(torch.stack(masks))
        off = ~torch.eye(3, dtype=torch.bool)
        threshold = o[off].mean() + (rnd + 1) / beta * (o[off].max() - o[off].mean())
        customized = []
        for i in range(3):
            partners = [j for j in range(3) if j == i or o[i, j] >= threshold]
            customized.append(sum(trained[j] for j in partners) / len(partners))
        w = (4 * trained[0] + 6 * trained[1] + 10 * trained[2]) / 20
        updates = run_round(server, rnd).updates
        assert torch.allclose(server.global_params.double(), w, atol=1e-5)
        for i in range(3):
            assert torch.equal(updates[i].extras["critical"], masks[i])
            assert torch.allclose(server.state.get("customized", i).double(), customized[i], atol=1e-5)
            expected = w.clone()
            expected[masks[i]] = customized[i][masks[i]]
            assert torch.allclose(server.eval_params(i).double(), expected, atol=1e-5)
    assert any(m.any() for m in masks) and any((~m).any() for m in masks)


def test_no_critical_parameter_is_fedavg():
    data = random_dataset(num_clients=4, dim=3, num_classes=3, seed=2)
    settings = dict(global_rounds=3, join_ratio=0.5, batch_size=4)
    ours = trained_server(data, "FedCAC", "-tau", "0.01", **settings)  # ⌊0.01·size⌋ = 0 for every tensor
    fedavg = trained_server(data, "FedAvg", **settings)
    assert torch.equal(ours.global_params, fedavg.global_params)
    assert ours.history.test_acc == fedavg.history.test_acc


def test_partial_participation_and_payloads():
    data = random_dataset(num_clients=5, dim=3, num_classes=3, seed=3)
    server = build_server(make_args("FedCAC", join_ratio=0.4, batch_size=4), data)
    round0 = run_round(server, 0)
    assert round0.package.payloads == {}
    for u in round0.updates:
        assert u.extras["critical"].dtype == torch.bool and u.nbytes() == u.params.numel() * 4 + u.params.numel()
    before = {i: server.eval_params(i).clone() for i in range(5)}
    round1 = run_round(server, 1)
    for i in round1.cohort:
        assert ("customized" in round1.package.payload(i)) == (i in round0.cohort)
    for i in set(range(5)) - set(round0.cohort) - set(round1.cohort):
        assert torch.equal(server.eval_params(i), server.global_params)
    for i in set(round0.cohort) - set(round1.cohort):  # the mixture follows the new global model
        assert not torch.equal(server.eval_params(i), before[i])


def test_bad_flags():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    for flags in (("-bt", "0"), ("-tau", "0"), ("-tau", "1.5")):
        with pytest.raises(FLError):
            build_server(make_args("FedCAC", *flags), data)


def test_two_round_run_through_main(tmp_path):
    run_main_two_rounds(tmp_path, "FedCAC")
