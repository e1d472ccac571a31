"""pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020, arXiv:2006.08848): server step with β.

The server averages the uploaded local models w_i (sample-weighted over the uploads received, as
PFLlib) and moves the global model part of the way:

    w ← (1 − β) w + β · Σ_i (n_i / n) w_i

β = 1 is plain averaging (FedAvg's server). ``-bt`` defaults to 1.0 here: PFLlib's default 0.0
freezes the global model for ever (every round is then local training from the initial model),
while the paper uses β ∈ [1, 2]. The mix covers float buffers as well (PFLlib mixes parameters
only). Clients are evaluated with their personalised models θ_i (the global model before a
client's first participation); the global model's accuracy is recorded as ``rs_test_acc_global``.
``rs_train_loss`` is the plain cross-entropy of θ_i on the client's training data (PFLlib adds
0.5·λ·‖w_i − θ_i‖, unsquared).

Who trains each round, two readings:

* Default (PFLlib's): only the sampled cohort of S = ⌊jr·N⌋ clients trains and uploads; a client
  keeps the θ_i of its last participation (the global model before its first).
* ``--pfedme_all_clients`` (the paper's Algorithm 1): the server sends w to all N clients, every one
  of them updates w_i and θ_i, and only the sampled cohort (the same draw as by default) uploads its
  w_i. The other clients run the round after the cohort, from the same w, and their w_i are never
  sent. Cost: local training grows from S to N clients a round (N/S times the compute and round
  time, e.g. 10x with ``-jr 0.1``) and the server sends N models instead of S (``rs_bytes_down``
  stays the cohort's; the broadcast to the others is ``rs_bytes_down_unsampled``). Uploads and the
  global model are unchanged (without ``-ld``, whose decay counts every round a client trains).
  With full participation both readings are one.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientpfedme import PFedMeClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from cli.flags import add_flag, hyperparameters
from utils.errors import FLError


@register_algorithm("pFedMe")
class PFedMeServer(Server):
    client_cls = PFedMeClient
    personalized = True

    @classmethod
    def population_limit(cls, args):
        if hyperparameters(args, cls).pfedme_all_clients:
            return cls.ALL_CLIENTS_LIMIT, "--pfedme_all_clients trains every client every round"
        return None

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-bt", "--beta", type=float, default=1.0, low=0,
                 help="pFedMe: server step β in w ← (1−β)w + β·mean(w_i); 1 = averaging "
                      "(PFLlib's default 0 freezes the global model; paper 1–2)")
        add_flag(parser, "--pfedme_all_clients", type=bool, default=False,
                 help="pFedMe: every client updates its personal model each round and only the sampled cohort "
                      "uploads (the paper's Algorithm 1); costs N/S times the local training and downloads")

    def setup(self) -> None:
        hp = self.hp
        if hp.K < 1 or hp.p_learning_rate <= 0 or hp.lamda < 0 or hp.beta < 0:
            raise FLError("pFedMe needs -K >= 1, -lrp > 0, -lam >= 0 and -bt >= 0")

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        beta = self.hp.beta
        self.global_params = (1 - beta) * package.global_params + beta * weighted_average(updates)

    def after_round(self, rnd: int, package: RoundPackage, updates: list[ClientUpdate]) -> None:
        super().after_round(rnd, package, updates)
        if self.hp.pfedme_all_clients:
            self.train_unsampled_clients(package)

    def train_unsampled_clients(self, package: RoundPackage) -> None:
        """The paper's Algorithm 1: the clients outside the cohort update w_i and θ_i from the round's w
        too (their randomness is keyed by (seed, round, client), so the order does not matter);
        their w_i stay on the client, as the server samples only the cohort for upload."""
        cohort = set(package.cohort)
        unsampled = [client for client in self.clients if client.index not in cohort]
        if unsampled:
            self.engine.train(unsampled, package)
        self.history.add_series("bytes_down_unsampled", sum(package.nbytes(c.index) for c in unsampled))

    def eval_params(self, index: int) -> torch.Tensor:
        personal = self.state.get("personal", index)
        return self.global_params if personal is None else personal

    def summary(self) -> dict[str, object]:
        hp = self.hp
        return {"beta": hp.beta, "lamda": hp.lamda, "K": hp.K, "p_learning_rate": hp.p_learning_rate,
                "pfedme_mu": hp.pfedme_mu, "pfedme_all_clients": hp.pfedme_all_clients}
