"""GPFL's layers (Zhang et al., ICCV 2023): the category embedding (GCE) and the conditional valve
(CoV) around a model's body and head, and where they lie in the flat vector (``GPFLLayout``).
The algorithm is ``flcore/servers/servergpfl.py`` + ``flcore/clients/clientgpfl.py``."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class CategoryEmbedding(nn.Module):
    """GCE: one trainable vector per class (``nn.Embedding``'s N(0, 1) initialisation); applied to
    features it gives their cosine similarity to every class vector, [B, U]."""

    def __init__(self, num_classes: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_classes, dim))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return F.normalize(features, dim=-1) @ F.normalize(self.weight, dim=-1).T


class ConditionalValve(nn.Module):
    """CoV: ReLU((γ(c) + 1) ⊙ f + β(c)) for features f and a condition vector c."""

    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.LayerNorm(dim))
        self.beta = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.LayerNorm(dim))

    def forward(self, features: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        return F.relu(features * (self.gamma(condition) + 1) + self.beta(condition))


class GPFLModel(nn.Module):
    """body → CoV(·, p_i) → head, with the GCE; ``condition`` holds the personalised condition p_i
    the client is evaluated with (written by the server's ``eval_params``; zero in the global
    vector), so the flat vector a client is evaluated with carries its own condition. It is never
    trained (the loss reads the round's conditions from the context), and it is a parameter
    rather than a buffer so that the batched engine, which refuses float buffers, can train GPFL."""

    def __init__(self, model: nn.Module, num_classes: int):
        super().__init__()
        self.body = model.body
        self.head = model.head
        dim = model.head.in_features
        self.gce = CategoryEmbedding(num_classes, dim)
        self.cov = ConditionalValve(dim)
        self.condition = nn.Parameter(torch.zeros(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.cov(self.body(x), self.condition))


@dataclass(frozen=True)
class GPFLLayout:
    """Where the GPFL parts lie in the flat vector ([start, stop) ranges), set by the server."""

    gce: tuple[int, int]
    decayed: tuple[int, int]  # GCE and CoV, contiguous: what ``-mu`` decays
    condition: tuple[int, int]
    num_classes: int
    dim: int
