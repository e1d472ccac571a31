"""FedNova client (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020, arXiv:2007.07481).

Local training is FedAvg's (``E`` epochs of minibatch SGD, with ``--local_momentum ρ`` if set);
the client also reports the ℓ1 norm of its normalising vector a_i, the sum of the weights its
τ_i local gradients carry in the accumulated update (the paper's momentum-SGD case; the official
code JYWa/FedNova accumulates the same number step by step as ``local_normalizing_vec``):

    plain SGD:         a_i = τ_i
    momentum SGD (ρ):  a_i = [τ_i − ρ(1 − ρ^τ_i)/(1 − ρ)] / (1 − ρ)

(the buffer restarts at zero in every local training, so step k's gradient weighs
(1 − ρ^(τ_i − k))/(1 − ρ); the sum over k is the second line). τ_i is the number of steps this
client really took this round (fewer with ``-tsr`` slow trainers, with fewer samples, or with a
``drop_last`` client that has fewer samples than the batch size: τ_i = 0, a_i = 0). The upload is
the trained model y_i and a_i; the server forms d_i = (x − y_i)/a_i (``serverfednova.py``).
"""
from __future__ import annotations

import torch

from flcore.clients.clientfedavg import FedAvgClient
from flcore.protocol import ClientUpdate, RoundPackage


def normalising_norm(steps: int, momentum: float) -> float:
    """‖a_i‖₁ of ``steps`` local steps of SGD with heavy-ball momentum ``momentum`` (0: plain SGD)."""
    if not momentum:
        return float(steps)
    rho = momentum
    return (steps - rho * (1.0 - rho**steps) / (1.0 - rho)) / (1.0 - rho)


class FedNovaClient(FedAvgClient):
    """FedAvg's local SGD; the upload also carries ‖a_i‖₁ (``extras["a_i"]``, one float)."""
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    hooks_draw_no_rng = True  # end_round only computes a number

    def end_round(
        self, params: torch.Tensor, package: RoundPackage, ctx: dict[str, torch.Tensor], steps: int, loss: float
    ) -> ClientUpdate:
        a_i = torch.tensor(normalising_norm(steps, self.local_momentum), dtype=torch.float32)
        return ClientUpdate(self.index, self.num_train, steps, params, loss, extras={"a_i": a_i})
