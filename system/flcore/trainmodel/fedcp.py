"""FedCP's layers (Zhang et al., KDD 2023): the conditional policy network (CPN) that splits each
feature between a personalised and a frozen global head, and where the heads lie in the flat
vector (``FedCPLayout``). The algorithm is ``flcore/servers/serverfedcp.py`` + ``flcore/clients/clientfedcp.py``."""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


#: τ of the Gumbel softmax (fixed to 1 in the authors' code)
TEMPERATURE = 1.0


class FrozenLinear(nn.Linear):
    """A linear layer that passes no gradient to its own weights: FedCP's global head, frozen
    during local training and changed only by the server's aggregation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.detach(), self.bias.detach())


class PolicyNetwork(nn.Module):
    """CPN: from the conditional input h ⊙ v, the share s of each feature that goes to the
    personalised head (``noise`` = logistic noise, 0 for the noise-free policy)."""

    def __init__(self, dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, 2 * dim), nn.LayerNorm(2 * dim), nn.ReLU())

    def forward(self, conditional: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        logits = self.net(conditional).unflatten(-1, (2, -1))  # [..., {personal, global}, D]
        return torch.sigmoid((logits[..., 0, :] - logits[..., 1, :] + noise) / TEMPERATURE)


def personal_condition(head_weight: torch.Tensor) -> torch.Tensor:
    """v_i: the L2-normalised sum of the personalised head's rows (detached: it is no parameter)."""
    return F.normalize(head_weight.detach().sum(0), dim=0)


class FedCPModel(nn.Module):
    """body, personalised head, frozen global head (initially a copy of the head) and CPN; the
    forward pass is the evaluated one (noise-free policy)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.body = model.body
        self.head = model.head
        self.global_head = FrozenLinear(model.head.in_features, model.head.out_features)
        self.global_head.load_state_dict(copy.deepcopy(model.head.state_dict()))
        self.policy = PolicyNetwork(model.head.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        share = self.policy(h * personal_condition(self.head.weight), torch.zeros((), dtype=h.dtype, device=h.device))
        return self.head(h * share) + self.global_head(h * (1 - share))


@dataclass(frozen=True)
class FedCPLayout:
    """Where the heads lie in the flat vector ([start, stop) of weight and bias together), set by the server."""

    head: tuple[int, int]
    global_head: tuple[int, int]
    classes: int
    dim: int
