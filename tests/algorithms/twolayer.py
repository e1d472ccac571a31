"""A two-layer model (linear body, linear head) and its forward pass by hand, for the tests of the
algorithms that treat the body and the head differently (PFL-DA, FedDBE)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fltest import build_server, make_args, random_dataset

DIM, HIDDEN, CLASSES = 2, 3, 2
#: the flat vector is [body.W, body.b, head.W, head.b]: body.b starts at A, head.W at B, head.b at C
A, B = DIM * HIDDEN, DIM * HIDDEN + HIDDEN
C = B + HIDDEN * CLASSES
HEAD = slice(B, None)


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(DIM, HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.head(self.body(x))


def features(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return x @ w[:A].view(HIDDEN, DIM).T + w[A:B]


def logits(w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return z @ w[B:C].view(CLASSES, HIDDEN).T + w[C:]


def grad_of(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """∇ of the cross-entropy of the model with flat parameters w on (x, y)."""
    w = w.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(F.cross_entropy(logits(w, features(w, x)), y), w)
    return g


def two_layer_server(algorithm: str, *flags: str, num_clients: int = 2, seed: int = 1, **settings):
    """(dataset, server) with the two-layer model: clients of 4, 6, 5 and 7 samples (the first two:
    sample weights 0.4 / 0.6), one full batch per epoch and two local epochs by default."""
    data = random_dataset(num_clients=num_clients, dim=DIM, num_classes=CLASSES, sizes=[4, 6, 5, 7][:num_clients],
                          seed=seed)
    settings = {"batch_size": 8, "local_epochs": 2, "drop_last": False, **settings}
    torch.manual_seed(0)
    return data, build_server(make_args(algorithm, *flags, **settings), data, TwoLayer())


def trained_two_layer(data, algorithm: str, *flags: str, **settings):
    """A whole ``Server.train`` run of ``algorithm`` with the two-layer model (the same initial weights
    for every algorithm) on ``data``."""
    torch.manual_seed(0)
    server = build_server(make_args(algorithm, *flags, **settings), data, TwoLayer())
    server.train(progress=False)
    return server
