"""FedROD: two rounds by hand (balanced softmax on body + generic head, cross-entropy of the
personalised prediction on the personal head only), both personal-head starts, the shared vector is
the generic model, a client missing classes, flags.

Shared with the other partial-sharing algorithms (``test_partial_sharing.py``): the personal head
never leaves the client, bytes count body + generic head only, state under partial participation."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fltest import build_server, dataset_from_arrays, make_args, random_dataset, run_round
from test_partial_sharing import TwoLayer, masked_descent, two_layer_server, unpack
from utils.errors import FLError

SHARED = 17  # TwoLayer's body (9) and generic head (8); the personal head follows (8)


def rod_logits(w: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features, generic logits, personal head's output) of the wrapped TwoLayer w = [body, head, personal]."""
    W1, b1, W2, b2 = unpack(w)
    PW, Pb = w[SHARED : SHARED + 6].view(2, 3), w[SHARED + 6 :]
    features = x @ W1.T + b1
    return features, features @ W2.T + b2, features.detach() @ PW.T + Pb


def rod_loss(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
    _, generic, personal = rod_logits(w, x)
    return F.cross_entropy(generic + log_prior, y) + F.cross_entropy(generic.detach() + personal, y)


@pytest.mark.parametrize("init", ["head", "zero"])
def test_two_rounds_by_hand(init):
    lr = 0.1
    data, server = two_layer_server("FedROD", "--fedrod_phead_init", init, local_learning_rate=lr)
    w = server.global_params.double()
    assert w.numel() == SHARED + 8 and torch.equal(w[SHARED:], torch.zeros(8, dtype=w.dtype))
    own = [w[9:SHARED].clone() if init == "head" else torch.zeros(8, dtype=w.dtype) for _ in range(2)]
    for rnd in range(2):
        trained = []
        for i, c in enumerate(data.clients):
            x, y = c.train_x.double(), c.train_y
            log_prior = torch.bincount(y, minlength=2).double().log()
            start = torch.cat([w[:SHARED], own[i]])
            trained.append(masked_descent(start, x, y, 2, lr, loss=lambda v, x, y: rod_loss(v, x, y, log_prior)))
        w = torch.cat([0.4 * trained[0][:SHARED] + 0.6 * trained[1][:SHARED], w[SHARED:]])
        own = [t[SHARED:] for t in trained]
        run_round(server, rnd)
        assert torch.allclose(server.global_params.double(), w, atol=1e-6)
        assert not server.global_params[SHARED:].any()  # the shared vector is the generic model
        for i in range(2):
            assert torch.allclose(server.eval_params(i).double(), torch.cat([w[:SHARED], own[i]]), atol=1e-6)


def test_model_forward_is_personalised_and_the_shared_vector_is_generic():
    data, server = two_layer_server("FedROD", local_learning_rate=0.1)
    run_round(server, 0)
    x = data.clients[0].test_x
    with torch.no_grad():
        for params in (server.global_params, server.eval_params(0)):
            server.model.load(params)
            _, generic, personal = rod_logits(params.double(), x.double())
            assert torch.allclose(server.model.module(x).double(), generic + personal, atol=1e-6)
    assert server.history.extra_series == {}  # nothing evaluated yet; evaluation records both accuracies
    server.evaluate(1)
    assert "test_acc_global" in server.history.extra_series


def test_a_client_missing_classes_trains_finitely():
    """Classes a client lacks have log prior −inf in the balanced softmax: no NaN anywhere."""
    g = torch.Generator().manual_seed(0)
    clients = [(torch.randn(12, 4, generator=g), torch.zeros(12, dtype=torch.long),
                torch.randn(4, 4, generator=g), torch.randint(0, 3, (4,), generator=g)),
               (torch.randn(12, 4, generator=g), torch.randint(0, 3, (12,), generator=g),
                torch.randn(4, 4, generator=g), torch.randint(0, 3, (4,), generator=g))]
    data = dataset_from_arrays(clients, 3)
    torch.manual_seed(0)
    server = build_server(make_args("FedROD", batch_size=4, local_learning_rate=0.1), data, TwoLayer(4, 3, 3))
    for rnd in range(2):
        updates = run_round(server, rnd).updates
        assert all(torch.isfinite(u.params).all() and math.isfinite(u.loss) for u in updates)
    assert torch.isfinite(server.eval_params(0)).all()


def test_flags_and_model_check():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    server = build_server(make_args("FedROD"), data, TwoLayer())
    assert server.summary() == {"fedrod_phead_init": "head"}
    with pytest.raises(FLError, match="body and head"):
        build_server(make_args("FedROD"), data, nn.Linear(2, 2))

