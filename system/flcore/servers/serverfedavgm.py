"""FedAvgM: FedAvg with server momentum (Hsu, Qi, Brown, 2019, arXiv:1909.06335).

Each round, with Δ = weighted_mean(w_k) − w the averaged model change,

    v ← β · v + Δ,        w ← w + η_s · v        (v starts at zero).

Choices where the sources leave room:

* The mean is PFLlib's sample-weighted mean over the uploads received (``weighted_average``),
  exactly FedAvg's aggregate, so FedAvgM only adds the server step on top of it.
* The momentum acts on the trainable parameters only; float buffers (BatchNorm running
  statistics) take the plain weighted mean as in FedAvg, since momentum on running variances
  could overshoot them. Models without BatchNorm are unaffected.
* Defaults: β = 0.9 (the IGFL baselines' setting), η_s = 1 (Hsu et al.'s ``w ← w − v`` form).
  β = 0 and η_s = 1 is FedAvg.

Flower's FedAvgM (``flwr``) takes the same step: its pseudo-gradient is w − mean = −Δ, its
momentum starts as the first pseudo-gradient (our v ← β·0 + Δ) and w ← w − η_s·momentum, over
the sample-weighted mean of the results received; ``tests/algorithms/test_fedavgm.py`` pins our
update to that recursion. Flower differs only in its default β = 0 (plain FedAvg) and in stepping
every array of the model, BatchNorm statistics included.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedavg import FedAvgClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from cli.flags import add_flag


@register_algorithm("FedAvgM")
class FedAvgMServer(Server):
    """Sample-weighted averaging followed by a heavy-ball step on the server."""
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    #: what persists across rounds (checkpoints): the server momentum
    carried = ("velocity",)

    client_cls = FedAvgClient

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--server_momentum", type=float, default=0.9, low=0, below=1,
                 help="FedAvgM server momentum β in v ← β·v + Δ (0 = FedAvg)")
        add_flag(parser, "-slr", "--server_learning_rate", type=float, default=1.0, above=0,
                 help="FedAvgM server learning rate η_s in w ← w + η_s·v")

    def setup(self) -> None:
        self.velocity = torch.zeros_like(self.global_params[: self.model.num_params])

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        n = self.model.num_params
        mean = weighted_average(updates)
        self.velocity.mul_(self.hp.server_momentum).add_(mean[:n] - self.global_params[:n])
        mean[:n] = self.global_params[:n] + self.hp.server_learning_rate * self.velocity
        self.global_params = mean

    def summary(self) -> dict[str, object]:
        return {"server_momentum": self.hp.server_momentum,
                "server_learning_rate": self.hp.server_learning_rate}
