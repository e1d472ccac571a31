"""Helpers of the knowledge-transfer algorithms' tests (FedProto, FD, FedGH): a tiny model whose
body has parameters, its forward pass written out on a flat vector, and by-hand per-class means."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from fltest import build_server, make_args, random_dataset
from utils.errors import FLError

HIDDEN = 3


class HiddenBody(nn.Module):
    """body = tanh(Linear(dim, 3)), head = Linear(3, classes): the representation depends on the weights."""

    def __init__(self, dim: int, num_classes: int):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim, HIDDEN), nn.Tanh())
        self.head = nn.Linear(HIDDEN, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def hidden_server(algorithm: str, data, *flags: str, **settings):
    """A server of ``algorithm`` on ``data`` with :class:`HiddenBody`; by default each local step is
    one full-batch step and there are two local epochs."""
    torch.manual_seed(0)
    module = HiddenBody(data.input_shape[0], data.num_classes)
    settings = {"batch_size": 6, "local_epochs": 2, "drop_last": False, **settings}
    return build_server(make_args(algorithm, *flags, **settings), data, module)


def hand_forward(v: torch.Tensor, x: torch.Tensor, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(representation, logits) of HiddenBody with flat parameters v = [W1, b1, W2, b2]."""
    dim = x.shape[1]
    w1, b1, w2, b2 = torch.split(v[: HIDDEN * dim + HIDDEN + classes * HIDDEN + classes],
                                 [HIDDEN * dim, HIDDEN, classes * HIDDEN, classes])
    z = torch.tanh(x @ w1.view(HIDDEN, dim).T + b1)
    return z, z @ w2.view(classes, HIDDEN).T + b2


def per_class_sums(values: torch.Tensor, y: torch.Tensor, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-class sums of ``values``, per-class counts), by a loop over the samples."""
    sums = torch.zeros(classes, values.shape[1], dtype=values.dtype)
    seen = torch.zeros(classes, dtype=values.dtype)
    for value, label in zip(values, y.tolist()):
        sums[label] += value
        seen[label] += 1
    return sums, seen


def refusal(algorithm: str, *flags: str, module: nn.Module | None = None) -> str:
    """The one-line message with which building ``algorithm``'s server (flags, model) is refused."""
    data = random_dataset(num_clients=2, dim=3, num_classes=2, sizes=[4, 6])
    with pytest.raises(FLError) as caught:
        build_server(make_args(algorithm, *flags), data, module)
    return str(caught.value)
