"""User-level central DP: DP-FedAvg (McMahan, Ramage, Talwar, Zhang, ICLR 2018, Algorithm 1).

Each round, with θ the global model sent to the cohort C and θ_k client k's upload::

    Δ_k = (θ_k − θ) · min(1, S / ‖θ_k − θ‖)            flat clipping to S (--dp_update_clip)
    w_k = min(n_k / ŵ, 1)                              the paper's capped weights (--dp_weight_cap ŵ)
    θ  ← θ + (Σ_{k∈C} w_k Δ_k + N(0, (zS)² I)) / (qW)   z = --dp_server_sigma

with W = Σ_k w_k over *all* clients and q = |C| / N the expected fraction of clients per round:
this is the paper's fixed-denominator estimator f̃_f, whose sensitivity is S/(qW) because every
w_k ≤ 1, so the noise N(0, (zS/(qW))²) it adds to the mean is the Gaussian mechanism with noise
multiplier z. (The paper's other estimator, f̃_c, divides by max(qW_min, Σ_{k∈C} w_k) and has
twice the sensitivity; it is not offered.) ŵ defaults to the largest client's sample count, so
w_k ∝ n_k and, with full participation, no clipping and z = 0, the update is FedAvg's
sample-weighted mean (up to float rounding); the paper's experiments cap ŵ lower to bound the
influence of large clients, which a smaller ``--dp_weight_cap`` does.

Accounting: the sampled Gaussian mechanism with noise multiplier z, one step per aggregated
round, at sampling rate q = |C|/N of that round. Our cohorts are drawn without replacement with a
fixed size (``-jr``), while the paper samples users independently with probability q: the reported
ε treats the fixed-size draw as Poisson sampling with the same q, the usual approximation.

The noise of round t comes from ``(seed, "dp-server", t)``. Only algorithms that aggregate with
FedAvg's weighted mean of the uploaded models (the base ``Server.aggregate``) are accepted; for
the others (server optimisers, control variates, generators) clipping the model alone would not
bound what the server releases.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from utils.errors import FLError
from utils.seeding import torch_generator

if TYPE_CHECKING:
    from flcore.protocol import ClientUpdate, RoundPackage


@dataclass(frozen=True)
class DPFedAvg:
    """DP-FedAvg's settings (S, z, ŵ) and its aggregation; holds no state."""

    clip: float
    sigma: float
    weight_cap: float

    def weight(self, num_samples: int) -> float:
        """w_k = min(n_k / ŵ, 1)."""
        return min(num_samples / self.weight_cap, 1.0)

    def aggregate(self, clients: list, seed: int, updates: list["ClientUpdate"], package: "RoundPackage") -> torch.Tensor:
        """The new global model from the round's uploads (the fixed-denominator estimator);
        ``clients``: every client of the run (W sums their weights); ``seed``: the run's."""
        start = package.global_params
        total_weight = sum(self.weight(c.num_train) for c in clients)
        expected_weight = package.cohort_size / len(clients) * total_weight  # qW
        summed = torch.zeros_like(start)
        for update in updates:
            delta = update.params - start
            factor = min(1.0, self.clip / (float(delta.norm()) + 1e-12))
            summed.add_(delta, alpha=self.weight(update.num_samples) * factor)
        if self.sigma > 0:
            generator = torch_generator(seed, "dp-server", package.round, device=start.device)
            noise = torch.randn(start.shape, generator=generator, device=start.device, dtype=start.dtype)
            summed.add_(noise, alpha=self.sigma * self.clip)
        return start + summed / expected_weight


def dp_fedavg_config(flags, clients) -> DPFedAvg | None:
    """The run's DP-FedAvg settings from the privacy plug-in's typed ``flags``, or None when
    ``--dp_update_clip`` is 0 (off)."""
    if flags.dp_update_clip <= 0:
        return None
    cap = flags.dp_weight_cap or float(max(c.num_train for c in clients))
    if cap <= 0:
        raise FLError("--dp_weight_cap: every client has 0 training samples; DP-FedAvg has nothing to weight")
    return DPFedAvg(flags.dp_update_clip, flags.dp_server_sigma, cap)


def check_composable(server_cls: type) -> None:
    """Refuse (one line) an algorithm whose aggregation DP-FedAvg would replace."""
    if "aggregate" in server_cls.capabilities.overrides:
        raise FLError(
            f"--dp_update_clip: DP-FedAvg replaces FedAvg's weighted mean of the uploaded models, but "
            f"{getattr(server_cls, 'registered_name', server_cls.__name__)} aggregates its own way"
        )
