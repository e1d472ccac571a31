"""FedGC (Niu & Deng, AAAI 2022, arXiv:2112.07246): PFLlib's ``-algo FedGC``.

The server averages the uploaded bodies (sample-weighted, FedAvg) and keeps every client's head
rows W_k[c] for the classes c it holds (state ``fedgc_head``, from its last upload). After each
aggregation it corrects the heads by one gradient step, learning rate ``-lr``·``-lam`` (PFLlib's
server learning rate), on the regulariser

    R = Σ_c n_c · −log( exp(‖e_c‖²) / (exp(‖e_c‖²) + Σ_{j ∌ c} Σ_{c' ∈ j} exp(W_j[c']·e_c)) ),

where e_c is the mean of the rows of class c over the n_c clients holding it (a constant, as in
PFLlib, which builds it from ``.data``): the rows of the clients that lack class c are pushed away
from its consensus embedding, which a client cannot do alone since it never sees that class. The
terms are summed once per (client, class) row, as PFLlib's loop does (the n_c factor), and the
log is evaluated as a log-sum-exp (PFLlib's explicit exponentials overflow for large norms). The
corrected head is sent to the client the next time it is selected (a per-client payload).

Each client is evaluated with the global body and its corrected head, over its own classes
(``clientfedgc.py``); a client never selected with the initial model. Only clients that have
uploaded take part in R (PFLlib includes every client, with the random heads of those never
trained). ``rs_fedgc_reg`` records R before each step.
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedgc import FedGCClient
from flcore.common.labelmeans import require_linear_head
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from cli.flags import add_flag
from utils.errors import FLError

log = logging.getLogger("fl")


def correction_loss(rows: torch.Tensor, holds: torch.Tensor) -> torch.Tensor:
    """R for the heads ``rows`` [K, C, F] of K clients holding the classes ``holds`` [K, C]."""
    held = holds.to(rows.dtype)
    counts = held.sum(0)
    present = counts > 0
    consensus = (held[:, :, None] * rows).sum(0).detach() / counts.clamp_min(1)[:, None]  # e_c
    scores = torch.einsum("kif,cf->kic", rows, consensus)          # W_k[i]·e_c
    # a row W_j[c'] enters class c's denominator when j holds c' and lacks c
    eligible = holds[:, :, None] & ~holds[:, None, :]
    others = scores.masked_fill(~eligible, float("-inf")).flatten(0, 1)   # [K·C, C]
    own = (consensus * consensus).sum(1)                            # ‖e_c‖²
    log_denominator = torch.logsumexp(torch.cat([own[None, :], others]), dim=0)
    return (counts * (log_denominator - own))[present].sum()


@register_algorithm("FedGC")
class FedGCServer(Server):
    #: what persists across rounds (checkpoints): which classes each client holds (from its last upload)
    carried = ("holds",)

    client_cls = FedGCClient
    personalized = True
    has_global_model = False

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-lam", "--lamda", type=float, default=1.0, low=0,
                 help="the server's correction step has learning rate -lr·λ (0: no correction)")

    def setup(self) -> None:
        require_linear_head(self.model.module, "FedGC", self.args.model)
        if self.hp.lamda < 0:
            raise FLError(f"FedGC's -lam must be >= 0, got {self.hp.lamda}")
        segments = {seg.name: seg for seg in self.model.segments}
        weight, bias = segments["head.weight"], segments["head.bias"]
        if bias.start != weight.stop:
            raise FLError("FedGC needs the head's weight and bias next to each other in the model")
        self.num_features = weight.shape[1]
        #: [weight start, bias start, bias stop] of the head in the flat vector
        self.layout = torch.tensor([weight.start, bias.start, bias.stop], dtype=torch.long)
        #: holds[k, c]: client k holds class c (known from its uploads)
        self.holds = torch.zeros(len(self.clients), self.num_classes, dtype=torch.bool)

    def summary(self) -> dict[str, object]:
        return {"lamda": self.hp.lamda}

    def head_slice(self) -> slice:
        start, _, stop = self.layout.tolist()
        return slice(start, stop)

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        payloads = {i: {"head": head.clone()} for i in cohort if (head := self.state.get("fedgc_head", i)) is not None}
        return self.package(rnd, cohort, extras={"fedgc_layout": self.layout}, payloads=payloads)

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        """FedAvg on the body; keep each uploaded head; correct all known heads."""
        head = self.head_slice()
        mean = weighted_average(updates)
        mean[head] = self.global_params[head]  # the global model has no head of its own
        self.global_params = mean
        for update in updates:
            self.state.set("fedgc_head", update.index, update.params[head])
            self.holds[update.index] = update.extras["classes"].cpu()
        if self.hp.lamda > 0:
            self.correct_heads()

    def correct_heads(self) -> None:
        known = [k for k in range(len(self.clients)) if self.holds[k].any()]
        _, bias_start, _ = self.layout.tolist()
        weight_len = bias_start - self.layout[0].item()
        heads = torch.stack([self.state.get("fedgc_head", k) for k in known])
        rows = heads[:, :weight_len].reshape(len(known), self.num_classes, self.num_features).clone()
        rows.requires_grad_(True)
        loss = correction_loss(rows, self.holds[known].to(rows.device))
        (grad,) = torch.autograd.grad(loss, rows)
        self.history.add_series("fedgc_reg", float(loss.detach()))
        step = float(self.args.local_learning_rate) * self.hp.lamda
        corrected = rows.detach() - step * grad
        for k, index in enumerate(known):
            head = heads[k].clone()
            head[:weight_len] = corrected[k].reshape(-1)
            self.state.set("fedgc_head", index, head)

    def eval_params(self, index: int) -> torch.Tensor:
        head = self.state.get("fedgc_head", index)
        if head is None:
            return self.global_params
        params = self.global_params.clone()
        params[self.head_slice()] = head
        return params
