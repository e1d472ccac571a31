"""FedNova (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020, arXiv:2007.07481): normalised averaging.

FedAvg weighs client i's update by p_i whatever the number of local steps τ_i it took, so clients
that take more steps pull the global model towards their own optimum (the paper's objective
inconsistency). FedNova averages the *normalised* updates d_i = (x − y_i)/‖a_i‖₁ (the client's
mean step direction, ``clientfednova.py``) and scales their mean by an effective step count:

    τ_eff = Σ_{i∈S} p_i ‖a_i‖₁,      x ← x − τ_eff · Σ_{i∈S} p_i d_i,      p_i = n_i / Σ_{j∈S} n_j

(the paper's normalised averaging with data-size weights, as its official code JYWa/FedNova and
Flower's ``baselines/niid_bench`` compute it). When every client takes the same τ steps of plain
SGD, ‖a_i‖₁ = τ and the rule is FedAvg's x ← Σ p_i y_i.

Choices:

* S is the uploads actually received (``-cdr`` drops shrink S and renormalise p, as FedAvg here).
* A client that took no step (‖a_i‖₁ = 0) adds 0 to τ_eff and no direction.
* The rule acts on trainable parameters; float buffers (BatchNorm statistics) take FedAvg's
  p-weighted mean.
* The official code's server momentum (``gmf``) and FedNova-with-proximal-term variant are not
  included: the NIID-Bench setting uses neither.
"""
from __future__ import annotations

import numpy as np
import torch

from flcore.clients.clientfednova import FedNovaClient
from flcore.protocol import ClientUpdate, RoundPackage
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average


@register_algorithm("FedNova")
class FedNovaServer(Server):
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    client_cls = FedNovaClient

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        n = self.model.num_params
        counts = np.asarray([u.num_samples for u in updates], dtype=np.float64)
        p = counts / counts.sum() if counts.sum() > 0 else np.full(len(updates), 1 / len(updates))
        new = weighted_average(updates, p)  # the buffers' p-weighted mean
        x = self.global_params[:n]
        norms = [float(u.extras["a_i"]) for u in updates]
        tau_eff = float(np.dot(p, norms))
        direction = torch.zeros_like(x)
        for update, p_i, a_i in zip(updates, p, norms):
            if a_i > 0:
                direction.add_(x - update.params[:n].to(x.device), alpha=float(p_i) / a_i)
        new[:n] = x - tau_eff * direction
        self.global_params = new
