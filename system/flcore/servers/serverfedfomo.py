"""FedFomo (Zhang et al., ICLR 2021, arXiv:2012.08565): PFLlib's ``-algo FedFomo``.

The server keeps each client's latest upload and an affinity matrix P (N x N, the identity at
first). Each selected client i receives the M = ``-M`` models of the clients with the largest
P[i, j] among those that have uploaded (ties: the lower index), as a per-client payload counted
in ``rs_bytes_down``; it uploads its trained model and the raw weights w_n it gave the received
models, which are added to P[i, n] (PFLlib). Round 0 has no uploads yet, so clients train
locally. Clients are evaluated with their personal models; there is no global model.

Deliberate choices (see ``clientfedfomo.py`` for the client's):
* only clients that have uploaded are candidates (PFLlib's top-M may pick never-trained clients'
  initial models) and, with ``--fedfomo_reference trained``, never the client itself;
* exploration: with probability ε_t = max(0, ε − t·δ) (``--fedfomo_epsilon`` ε, default 0 as in
  PFLlib, which always takes the top M; ``--fedfomo_epsilon_decay`` δ per round) a client's M
  models are drawn uniformly among the candidates instead, from (seed, round, client): our reading
  of the paper's ε-greedy selection.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedfomo import FedFomoClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from cli.flags import add_flag
from utils.errors import FLError
from utils.seeding import numpy_rng


@register_algorithm("FedFomo")
class FedFomoServer(Server):
    #: what persists across rounds (checkpoints): the clients' affinities and who has uploaded
    carried = ("affinity", "uploaded")

    client_cls = FedFomoClient
    personalized = True
    has_global_model = False

    @classmethod
    def population_limit(cls, args):
        return cls.ALL_CLIENTS_LIMIT, "it keeps an affinity between every pair of clients (N x N) and ranks every candidate each round"

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--fedfomo_epsilon", type=float, default=0.0, low=0, high=1,
                 help="ε: probability that a client's M models are drawn at random instead of the top M "
                      "by affinity (0: PFLlib's top M only)")
        add_flag(parser, "--fedfomo_epsilon_decay", type=float, default=0.0, low=0, high=1,
                 help="δ: ε decreases by δ per round (ε_t = max(0, ε − t·δ))")

    def setup(self) -> None:
        if self.hp.M < 0:
            raise FLError(f"-M must be >= 0, got {self.hp.M}")
        if not 0 <= self.hp.fedfomo_val_ratio < 1:
            raise FLError(f"--fedfomo_val_ratio must lie in [0, 1), got {self.hp.fedfomo_val_ratio}")
        if not 0 <= self.hp.fedfomo_epsilon <= 1 or self.hp.fedfomo_epsilon_decay < 0:
            raise FLError("--fedfomo_epsilon must lie in [0, 1] and --fedfomo_epsilon_decay be >= 0")
        if self.hp.M > 0 and self.hp.fedfomo_val_ratio == 0:
            raise FLError("FedFomo weighs the received models on a validation split: --fedfomo_val_ratio must be > 0 "
                          "when -M > 0")
        #: P[i, j]: how much client i has gained from client j's models so far
        self.affinity = torch.eye(len(self.clients), dtype=torch.float64)
        #: whether client j has uploaded a model the server can send
        self.uploaded = torch.zeros(len(self.clients), dtype=torch.bool)

    def summary(self) -> dict[str, object]:
        return {"M": self.hp.M, "val_ratio": self.hp.fedfomo_val_ratio, "reference": self.hp.fedfomo_reference,
                "epsilon": self.hp.fedfomo_epsilon, "epsilon_decay": self.hp.fedfomo_epsilon_decay}

    def candidates(self, index: int, rnd: int = 0) -> list[int]:
        """The top-M clients by affinity among those with an upload (never ``index`` itself with the
        ``trained`` reference), or with probability ε_t M of them drawn at random."""
        allowed = self.uploaded.clone()
        if self.hp.fedfomo_reference == "trained":
            allowed[index] = False
        count = min(self.hp.M, int(allowed.sum()))
        if count == 0:
            return []
        epsilon = max(0.0, self.hp.fedfomo_epsilon - rnd * self.hp.fedfomo_epsilon_decay)
        if epsilon > 0:
            rng = numpy_rng(self.args.seed, "fedfomo-explore", rnd, self.clients[index].cid)
            if rng.random() < epsilon:
                pool = torch.nonzero(allowed).flatten().tolist()
                return sorted(int(j) for j in rng.choice(pool, size=count, replace=False))
        scores = torch.where(allowed, self.affinity[index], torch.tensor(float("-inf"), dtype=torch.float64))
        order = torch.sort(scores, descending=True, stable=True).indices
        return [int(j) for j in order[:count]]

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        payloads, sent = {}, {}
        for i in cohort:
            chosen = self.candidates(i, rnd)
            for j in chosen:  # one copy of each model sent this round, whoever receives it
                if j not in sent:
                    sent[j] = self.state.get("latest", j).clone()
            payload = {f"model_{k}": sent[j] for k, j in enumerate(chosen)}
            payload["ids"] = torch.tensor(chosen, dtype=torch.long)
            payloads[i] = payload
        return self.package(rnd, cohort, payloads=payloads)

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        """No global model: keep the uploads and add each client's weights to its row of P."""
        for update in updates:
            ids = update.extras["fomo_ids"]  # the models its weights are of (a late upload's: of its own round)
            self.affinity[update.index, ids] += update.extras["fomo_weights"].to(self.affinity.dtype)
        for update in updates:
            self.state.set("latest", update.index, update.params)
            self.uploaded[update.index] = True

    def eval_params(self, index: int) -> torch.Tensor:
        personal = self.state.get("personal", index)
        return self.global_params if personal is None else personal
