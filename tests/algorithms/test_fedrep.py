"""FedRep: two rounds by hand (head epochs with the body frozen, then body epochs with the head
frozen; bodies averaged), -pls 0 is FedBABU's training, uniform weighting, flags.

Shared with the other partial-sharing algorithms (``test_partial_sharing.py``): the head never
leaves the client, bytes count the body only, state under partial participation, engines."""
from __future__ import annotations

import pytest
import torch

from fltest import build_server, make_args, random_dataset, run_round
from test_partial_sharing import TwoLayer, body_mask, masked_descent, two_layer_server
from utils.errors import FLError


@pytest.mark.parametrize("weighting, weights", [("samples", (0.4, 0.6)), ("uniform", (0.5, 0.5))])
def test_two_rounds_by_hand(weighting, weights):
    # 3 head epochs then 2 body epochs per round, one full-batch step each.
    lr = 0.1
    data, server = two_layer_server("FedRep", "-pls", "3", "--fedrep_weighting", weighting, local_learning_rate=lr)
    w = server.global_params.double()
    body = body_mask(w)
    own = [w.clone(), w.clone()]
    for rnd in range(2):
        trained = []
        for i, c in enumerate(data.clients):
            x, y = c.train_x.double(), c.train_y
            v = masked_descent(torch.where(body, w, own[i]), x, y, 3, lr, trainable=~body)
            trained.append(masked_descent(v, x, y, 2, lr, trainable=body))
        w = torch.where(body, weights[0] * trained[0] + weights[1] * trained[1], w)
        own = trained
        updates = run_round(server, rnd).updates
        assert [u.num_steps for u in updates] == [5, 5]  # 3 head steps, then 2 body steps
        for i in range(2):
            assert torch.allclose(server.eval_params(i).double(), torch.where(body, w, own[i]), atol=1e-6)
        assert torch.allclose(server.global_params.double(), w, atol=1e-6)


@pytest.mark.parametrize("join_ratio", [1.0, 0.5])
def test_no_head_epochs_is_fedbabu_training(join_ratio):
    """With -pls 0 the head never moves and the body phase is FedBABU's local step: the same global
    model bit for bit, and every client is evaluated with FedBABU's global model (no fine-tuning)."""
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=3)
    runs = {}
    for algo, flags in (("FedRep", ("-pls", "0")), ("FedBABU", ("-fte", "0"))):
        torch.manual_seed(0)
        args = make_args(algo, *flags, global_rounds=3, join_ratio=join_ratio, batch_size=4, local_learning_rate=0.1)
        runs[algo] = build_server(args, data, TwoLayer(4, 3, 3))
        runs[algo].train(progress=False)
    assert torch.equal(runs["FedRep"].global_params, runs["FedBABU"].global_params)
    for i in range(4):
        assert torch.equal(runs["FedRep"].eval_params(i), runs["FedBABU"].global_params)
    assert runs["FedRep"].history.test_acc == runs["FedBABU"].history.test_acc


def test_flags():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    server = build_server(make_args("FedRep"), data, TwoLayer())
    assert server.summary() == {"plocal_epochs": 1, "fedrep_weighting": "samples"}
    with pytest.raises(FLError):
        build_server(make_args("FedRep", "-pls", "-1"), data, TwoLayer())


