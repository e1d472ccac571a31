"""FedAdam, FedYogi and FedAdagrad: adaptive server optimizers (Reddi et al., ICLR 2021, arXiv:2003.00295).

Clients run FedAvg's local SGD. The server treats the averaged model change as a pseudo-gradient
(Reddi et al., Algorithm 2)::

    Δ = Σ_k p_k (w_k − w)                       p_k ∝ n_k over the uploads received
    m ← β1 · m + (1 − β1) · Δ
    v ← β2 · v + (1 − β2) · Δ²                  FedAdam
    v ← v − (1 − β2) · Δ² · sign(v − Δ²)        FedYogi
    v ← v + Δ²                                  FedAdagrad
    w ← w + η · m / (√v + τ)

Choices (all documented where they differ from a source):

* Δ uses PFLlib's sample-weighted mean (``weighted_average``); the paper's Algorithm 2 writes the
  uniform mean over the sampled clients.
* m starts at 0 and v at τ² (the paper requires v_{-1} ≥ τ²).
* The paper has no bias correction; ``--fedopt_bias_correction`` divides m by 1 − β1^t and (FedAdam,
  FedYogi) v by 1 − β2^t, t the number of server steps taken. Default off (the paper's rule).
* Defaults: η = 0.01 (10^-2, the server learning rate the paper most often found best for FedAdam
  and FedYogi), β2 = 0.99, τ = 1e-3 (the paper's default adaptivity; the IGFL baselines tuned
  τ ∈ {0.1, 0.01}).
* β1 is a per-algorithm default: 0.9 for FedAdam and FedYogi, **0 for FedAdagrad**. Algorithm 2
  gives all three the momentum m, but Adagrad has none, the authors ran FedAdagrad with Keras'
  Adagrad (no momentum), and Flower's FedAdagrad fixes β1 = 0; with β1 = 0 our FedAdagrad is the
  method whose results and tuned η/τ grids the paper reports, and it agrees with Flower's. With
  β1 = 0, m = Δ and the step is η·Δ/(√v + τ). ``--beta1 0.9`` gives Algorithm 2's momentum.
* The adaptive step acts on trainable parameters only; float buffers (BatchNorm statistics) take
  the plain weighted mean, as an η = 0.01 sign-like step would leave them near their initial values.

Where Flower's strategies (``flwr`` FedAdam, FedYogi, FedAdagrad) differ from these rules, which
follow the paper:

* v starts at 0 in Flower (here τ², the paper's v_{-1} ≥ τ²); FedYogi's first step there is then
  v = (1 − β2)·Δ².
* Flower's FedAdam always bias-corrects, as η_t = η·√(1 − β2^(t+1)) / (1 − β1^(t+1)) with t its
  1-based round number (so exponent 2 at the first step) and τ added to the uncorrected √v; the
  paper, and this file by default, do not correct. ``--fedopt_bias_correction`` is Adam's
  (Kingma & Ba) correction with exponent t and τ added after it, so it is not Flower's either.
  Flower's FedYogi and FedAdagrad do not correct.
* Flower's defaults are η = 0.1, τ = 1e-9; it steps every array of the model, BatchNorm
  statistics included, and its FedAdagrad has no β1 flag.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedavg import FedAvgClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from cli.flags import add_flag


class FedOptServer(Server):
    """Server Adam-type step on the pseudo-gradient; subclasses define the second moment."""

    #: what persists across rounds (checkpoints): the server optimiser's moments and step count
    carried = ("first_moment", "second_moment", "server_steps")

    client_cls = FedAvgClient

    #: whether v is an exponential average (bias-corrected by 1 − β2^t when asked)
    averaged_second_moment = True

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        # PFLlib's -slr/--server_learning_rate (one destination for every algorithm), with the paper's
        # default for this step; --server_lr stays as an older spelling.
        add_flag(parser, "-slr", "--server_learning_rate", "--server_lr", type=float, default=0.01, above=0,
                 help="server learning rate η of the adaptive step")
        add_flag(parser, "--beta2", type=float, default=0.99, low=0, below=1, help="second-moment decay β2 (FedAdam, FedYogi)")
        add_flag(parser, "-tau", "--tau", type=float, default=1e-3, above=0,
                 help="adaptivity τ (ε) in m/(√v + τ); v starts at τ²")
        add_flag(parser, "--fedopt_bias_correction", type=bool, default=False,
                 help="Adam-style bias correction of m and v (the paper has none)")

    def setup(self) -> None:
        params = self.global_params[: self.model.num_params]
        tau = self.hp.tau
        self.first_moment = torch.zeros_like(params)
        self.second_moment = torch.full_like(params, tau * tau)
        self.server_steps = 0

    def update_second_moment(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        hp, n = self.hp, self.model.num_params
        beta1 = hp.beta1
        mean = weighted_average(updates)
        delta = mean[:n] - self.global_params[:n]
        self.first_moment.mul_(beta1).add_(delta, alpha=1 - beta1)
        self.second_moment = self.update_second_moment(self.second_moment, delta * delta)
        self.server_steps += 1
        m, v = self.first_moment, self.second_moment
        if hp.fedopt_bias_correction:
            m = m / (1 - beta1 ** self.server_steps)
            if self.averaged_second_moment:
                v = v / (1 - hp.beta2 ** self.server_steps)
        mean[:n] = self.global_params[:n] + hp.server_learning_rate * m / (v.sqrt() + hp.tau)
        self.global_params = mean

    def summary(self) -> dict[str, object]:
        hp = self.hp
        return {"server_learning_rate": hp.server_learning_rate, "beta1": hp.beta1, "beta2": hp.beta2, "tau": hp.tau,
                "bias_correction": hp.fedopt_bias_correction}


def add_beta1_flag(parser: ArgumentParser, default: float, why: str) -> None:
    """``--beta1``, declared by each variant with its own default (β1 is a per-algorithm choice)."""
    add_flag(parser, "--beta1", type=float, default=default, low=0, below=1, help=f"first-moment decay β1 ({why})")


@register_algorithm("FedAdam")
class FedAdamServer(FedOptServer):
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_beta1_flag(parser, 0.9, "Adam's momentum, the paper's setting")

    def update_second_moment(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        beta2 = self.hp.beta2
        return v * beta2 + (1 - beta2) * delta_sq


@register_algorithm("FedYogi")
class FedYogiServer(FedOptServer):
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_beta1_flag(parser, 0.9, "Yogi's momentum, the paper's setting")

    def update_second_moment(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        return v - (1 - self.hp.beta2) * delta_sq * torch.sign(v - delta_sq)


@register_algorithm("FedAdagrad")
class FedAdagradServer(FedOptServer):
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    averaged_second_moment = False

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_beta1_flag(parser, 0.0, "0: Adagrad has no momentum, as in the paper's experiments and Flower; "
                                    "0.9 = Algorithm 2's momentum")

    def update_second_moment(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        return v + delta_sq
