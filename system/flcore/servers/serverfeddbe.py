"""FedDBE (Zhang et al., NeurIPS 2023, arXiv:2311.14975): FedAvg with the Domain Bias Eliminator.

The server is FedAvg's but for the consensus mean z̄ᵍ of the representations. Before the first
round (lazily, in its first ``make_package``, so a resumed run restores it instead) it runs the
warm-up: every client trains one local round as FedAvg's client from the initial model, on its
own minibatch stream (round −1), and uploads its running mean r_i; z̄ᵍ = Σ_i (n_i/n) r_i,
sample-weighted as in PFLlib (a client without one full minibatch has no r_i and is left out,
where PFLlib averages in its zero vector), fixed for the rest of training and sent with every package
(``extras["dbe_consensus"]``). The warm-up's models are discarded and its time is not on the
virtual clock; it costs one local round of every client.

Clients are evaluated with the global model and their own bias b_i (``clientfeddbe.py``):
head(z + b_i) = W z + (W b_i + c) for the model's linear head (W, c), so the evaluated model is
the global model with the head's bias c replaced by W b_i + c, exact up to rounding. The global
model without b_i is recorded too (``rs_test_acc_global``, the paper's generalisation).
"""
from __future__ import annotations

import logging

import torch

from flcore.protocol import RoundPackage
from flcore.clients.clientfeddbe import FedDBEClient
from flcore.common.labelmeans import require_linear_head
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from utils.errors import FLError

log = logging.getLogger("fl")

WARMUP_ROUND = -1  # the warm-up's (seed, round, client) streams differ from every training round's


@register_algorithm("FedDBE")
class FedDBEServer(Server):
    #: what persists across rounds (checkpoints): the consensus of the clients' mean representations
    carried = ("consensus",)

    client_cls = FedDBEClient
    personalized = True

    def setup(self) -> None:
        require_linear_head(self.model.module, "FedDBE", self.args.model)
        if not 0 < self.hp.momentum <= 1:
            raise FLError(f"-mo must be in (0, 1], got {self.hp.momentum}")
        if self.hp.kl_weight == 0:
            log.warning("warning: FedDBE with -klw 0 (PFLlib's default) has no mean regularisation; "
                        "set -klw, e.g. 1")
        segments = {seg.name: seg for seg in self.model.segments}
        weight, bias = segments["head.weight"], segments["head.bias"]
        #: where the head's weight W (out x in) and bias c lie in the flat vector
        self.head_weight = (weight.start, weight.stop, weight.shape[0], weight.shape[1])
        self.head_bias = (bias.start, bias.stop)
        #: z̄ᵍ, computed by the warm-up before round 0
        self.consensus: torch.Tensor | None = None

    def summary(self) -> dict[str, object]:
        return {"momentum": self.hp.momentum, "kl_weight": self.hp.kl_weight, "prbm": self.hp.dbe_prbm}

    def warm_up(self) -> torch.Tensor:
        """Every client's running mean after one FedAvg round from the initial model, sample-weighted."""
        package = self.package(WARMUP_ROUND, list(range(len(self.clients))))
        updates = [u for u in self.engine.train(self.clients, package) if "running_mean" in u.extras]
        if not updates:
            raise FLError("FedDBE's warm-up found no client with a full minibatch; lower -lbs")
        total = sum(u.num_samples for u in updates)
        return sum(u.extras["running_mean"] * (u.num_samples / total) for u in updates)

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        if self.consensus is None:
            self.consensus = self.warm_up()
        return self.package(rnd, cohort, extras={"dbe_consensus": self.consensus})

    def eval_params(self, index: int) -> torch.Tensor:
        bias = self.state.get("dbe_bias", index)
        if bias is None:
            return self.global_params
        params = self.global_params.clone()
        start, stop, rows, cols = self.head_weight
        weight = params[start:stop].view(rows, cols)
        params[self.head_bias[0] : self.head_bias[1]] += weight @ bias.to(params.dtype)
        return params
