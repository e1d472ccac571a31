"""FedAsync (Xie, Koyejo & Gupta 2019, "Asynchronous Federated Optimization", arXiv:1903.03934), in rounds.

Every upload that reaches the server is mixed into the global model on its own, in the order the
server receives them (``features/stragglers.py``: oldest start round first, then by client)::

    x ← (1 − α_t) x + α_t x_new,      α_t = α · s(t − τ)

where x_new was trained from the global model of round τ and t is the current round. Staleness
functions ``--staleness_fn`` (the paper's): ``constant`` s = 1; ``polynomial``
s = (t − τ + 1)^(−a); ``hinge`` s = 1 if t − τ ≤ b else 1 / (a (t − τ − b) + 1), with
a = ``--staleness_a`` and b = ``--staleness_b``.

Defaults, and where they come from:

* s: ``polynomial`` with a = 0.5 and α = 0.8, the Sageflow paper's FedAsync baseline (its
  supplementary A.1). The FedAsync paper's own experiments use a = 0.5 for the polynomial
  function and a = 10, b = 4 for the hinge, so ``--staleness_a`` left unset is 0.5 for
  ``polynomial`` and 10 for ``hinge``, and b defaults to 4. They report α ∈ {0.6, 0.9} on
  CIFAR-10; 0.8 is the Sageflow baseline's.
* The workers' regularised objective f(x; z) + ρ/2 ‖x − x_τ‖² (the paper's Algorithm 1; the
  client, ``clients/clientfedasync.py``): ρ = ``--async_rho``, default 0.005, the paper's CIFAR-10
  value; 0 gives plain local SGD.
* The "decayed γ" of the Sageflow paper's FedAsync baseline is the workers' learning rate (γ in
  Xie et al.'s notation), with no schedule given: the generic ``--learning_rate_decay`` flags.
* α decay: the paper's update rule has a constant α, but the authors' code (xcgoner/async_fl,
  ``train_cifar10_mxnet_fedasync_singlethread_impl.py`` and its ``experiment_script_1.sh``: 2,000
  server updates, α = 0.8, ``--alpha-decay 0.5 --alpha-decay-epoch 800``) halves α once, from the
  800th server update on. ``--async_alpha_decay_at N`` reproduces it: every upload mixed after N
  earlier ones (N server updates, t of Algorithm 1, whatever ``--staleness_unit``) uses
  α · ``--async_alpha_decay`` (0.5). Off by default (N = 0), as the paper states no schedule.

What t − τ counts, ``--staleness_unit``: ``round`` (the default) counts rounds, as the Sageflow
paper defines FedAsync's staleness ("the difference between the current round t and the past round
τ when the device first received the global model"). ``upload`` counts the server's model updates,
as t in Xie et al.'s Algorithm 1 (the updater's step index): an upload's staleness is the number of
uploads mixed in since the global model it started from, so the k-th upload mixed in a round is at
least k − 1 stale even when it is fresh in rounds, and a round of many uploads is no longer
dominated by its last few at α = 0.8. Stragglers come from ``--straggler_delay S``; without it
every upload is fresh (τ = t), and with α = 1, ρ = 0 and one client a round FedAsync is sequential
SGD in the server's order.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.clients.clientfedasync import FedAsyncClient
from flcore.protocol import ClientUpdate, RoundPackage
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from cli.flags import add_flag
from utils.errors import FLError

STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge")
STALENESS_UNITS = ("round", "upload")
#: a of the staleness functions in the FedAsync paper's experiments (``--staleness_a`` left unset)
PAPER_A = {"constant": 0.0, "polynomial": 0.5, "hinge": 10.0}


def staleness_weight(kind: str, staleness: int, a: float, b: float) -> float:
    """s(t − τ) of the paper."""
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((staleness + 1) ** (-a))
    return 1.0 if staleness <= b else 1.0 / (a * (staleness - b) + 1.0)


def mix_uploads(model: torch.Tensor, uploads: list[tuple[torch.Tensor, float]], alpha: float) -> torch.Tensor:
    """x ← (1 − α·s) x + α·s x_new for each (x_new, s) in the order given; a new tensor."""
    for params, weight in uploads:
        model = model * (1 - alpha * weight) + params * (alpha * weight)
    return model


@register_algorithm("FedAsync")
class FedAsync(Server):
    """One mixing step per upload received (module docstring)."""

    #: what persists across rounds (checkpoints): the mixing steps taken and the model version each round sent
    carried = ("mixes", "version_at_round")

    client_cls = FedAsyncClient

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--async_alpha", type=float, default=0.8, above=0, high=1, help="FedAsync: mixing weight alpha in (0, 1]")
        add_flag(parser, "--staleness_fn", type=str, default="polynomial", choices=list(STALENESS_FUNCTIONS),
                 help="FedAsync: staleness function s(t - tau)")
        add_flag(parser, "--staleness_a", type=float, default=None, low=0,
                 help="FedAsync: a of the polynomial/hinge functions (unset: the paper's, 0.5 polynomial, 10 hinge)")
        add_flag(parser, "--staleness_b", type=float, default=4.0, low=0,
                 help="FedAsync: b of the hinge function (in --staleness_unit)")
        add_flag(parser, "--async_alpha_decay_at", type=int, default=0, low=0,
                 help="FedAsync: multiply alpha by --async_alpha_decay for every upload mixed after this many "
                      "server updates (the authors' code: 800 of 2000; 0: constant alpha, the paper's rule)")
        add_flag(parser, "--async_alpha_decay", type=float, default=0.5, above=0, high=1,
                 help="FedAsync: the factor of --async_alpha_decay_at (the authors' code: 0.5)")
        add_flag(parser, "--staleness_unit", type=str, default="round", choices=list(STALENESS_UNITS),
                 help="FedAsync: what t - tau counts: rounds (the Sageflow paper's definition) or the server's "
                      "model updates, one per upload mixed (t of Xie et al.'s Algorithm 1)")

    def setup(self) -> None:
        if not 0 < self.hp.async_alpha <= 1:
            raise FLError(f"--async_alpha must be in (0, 1], got {self.hp.async_alpha}")
        a = self.hp.staleness_a
        self.staleness_a = PAPER_A[self.hp.staleness_fn] if a is None else a
        if self.staleness_a < 0 or self.hp.staleness_b < 0:
            raise FLError("--staleness_a and --staleness_b must be >= 0")
        #: model updates so far (uploads mixed), and that count when each round's package was made:
        #: the version of the global model a client of that round starts from (--staleness_unit upload)
        self.mixes = 0
        self.version_at_round: dict[int, int] = {}

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        self.version_at_round[rnd] = self.mixes
        return super().make_package(rnd, cohort)

    def staleness(self, start: int, package: RoundPackage) -> int:
        """t − τ of an upload that started from round ``start``'s global model, in ``--staleness_unit``."""
        if self.hp.staleness_unit == "round":
            return package.round - start
        return self.mixes - self.version_at_round.get(start, self.mixes)

    def alpha_factor(self) -> float:
        """α's decay factor for the next upload, from the server updates made so far (module docstring)."""
        decay_at = self.hp.async_alpha_decay_at
        return self.hp.async_alpha_decay if decay_at and self.mixes >= decay_at else 1.0

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        weighted = []
        for update in updates:  # each upload's staleness counts the mixes before it (--staleness_unit upload)
            start, _ = update.origin(package)
            s = staleness_weight(self.hp.staleness_fn, self.staleness(start, package), self.staleness_a,
                                 self.hp.staleness_b)
            weighted.append((update.params, s * self.alpha_factor()))  # α_t = (α · decay) · s(t − τ)
            self.mixes += 1
        self.global_params = mix_uploads(self.global_params, weighted, self.hp.async_alpha)

    def summary(self) -> dict[str, object]:
        return {"async_alpha": self.hp.async_alpha, "staleness_fn": self.hp.staleness_fn,
                "staleness_a": self.staleness_a, "staleness_b": self.hp.staleness_b,
                "staleness_unit": self.hp.staleness_unit, "async_alpha_decay_at": self.hp.async_alpha_decay_at,
                "async_alpha_decay": self.hp.async_alpha_decay}
