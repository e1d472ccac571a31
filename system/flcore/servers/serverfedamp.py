"""FedAMP: attentive message passing (Huang et al., AAAI 2021, arXiv:2007.03797).

The server keeps each client's latest uploaded model w_j (the common initial model before its
first upload). For each selected client i it builds the personalised cloud model

    u_i = Σ_{j≠i} ξ_ij w_j + (1 − Σ_{j≠i} ξ_ij) w_i,   ξ_ij = α_K · exp(−‖w_i − w_j‖² / σ) / σ,

which is the paper's gradient step U = W − α_K ∇A(W) on the attention-inducing regulariser
Σ_{i<j} A(‖w_i − w_j‖²) with A(x) = 1 − exp(−x/σ): ξ_ij = α_K A'(‖w_i − w_j‖²), A'(x) =
exp(−x/σ)/σ. PFLlib's ``e(x) = exp(−x/σ)/σ`` is this same A', so paper and PFLlib agree on the
attention function; the distance is the squared Euclidean distance of the trainable parameters,
computed in float64. α_K (``-alk``) and σ (``-sg``) are constants, as in PFLlib.

The client then minimises F_i(w) + λ/(2α_K)‖w − u_i‖² (``clientfedamp.py``). FedAMP has no global
model (``has_global_model = False``); each client is evaluated with its latest model.

Deliberate choices:
* ``--fedamp_pool previous`` (default, PFLlib): the w_j are the models uploaded in the previous
  round (none in round 0, where u_i = w_i); ``all``: every client's latest model, the paper's
  cross-silo form where all n clients take part (both agree under full participation).
* Nothing rescales ξ: with many similar clients Σ_{j≠i} ξ_ij exceeds 1 and the self weight turns
  negative (PFLlib does the same); a warning is logged once. Choose α_K ≤ σ / (number of pool
  clients) to keep u_i a convex combination.
* Float buffers (BatchNorm statistics) take no part in the distance or the mix; u_i keeps client
  i's own (PFLlib mixes ``parameters()`` only).
* ``rs_fedamp_self_weight`` records the mean self weight 1 − Σ_{j≠i} ξ_ij of each round.
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedamp import FedAMPClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from cli.flags import add_flag, hyperparameters
from utils.errors import FLError

log = logging.getLogger("fl")


BLOCK_ELEMENTS = 1 << 24  # float64 values per operand block: bounds the memory of the distance and mix steps


def squared_distances(rows: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """‖rows_i − pool_j‖² in float64 as ‖r_i‖² + ‖p_j‖² − 2 r_i·p_j over column blocks.

    The Gram form is one matrix product per block instead of an n x m x block difference tensor
    (a round of 100 CNN clients took 27.6 s before and 3.7 s after, idle CPU); in float64 its rounding
    error, about 1e-16 of the squared norms, is far below any distance that changes exp(−d²/σ).
    """
    out = torch.zeros(len(rows), len(pool), dtype=torch.float64, device=pool.device)
    step = max(1, BLOCK_ELEMENTS // max(len(rows) + len(pool), 1))
    for c in range(0, pool.shape[1], step):
        r = rows[:, c : c + step].double()
        p = pool[:, c : c + step].double()
        out += r.pow(2).sum(1)[:, None] + p.pow(2).sum(1)[None, :] - 2.0 * (r @ p.T)
    return out.clamp_min_(0.0)


@register_algorithm("FedAMP")
class FedAMPServer(Server):
    #: what persists across rounds (checkpoints): who uploaded in the last round (the pool of cloud models), and the warning said once
    carried = ("previous_uploads", "_warned_negative")

    client_cls = FedAMPClient
    personalized = True
    has_global_model = False

    @classmethod
    def population_limit(cls, args):
        if hyperparameters(args, cls).fedamp_pool == "all":
            return cls.ALL_CLIENTS_LIMIT, "with --fedamp_pool all each selected client's cloud model mixes every client's latest model every round"
        return None

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        # -alk is declared by FedAMPClient, whose proximal coefficient λ/α_K reads it too.
        add_flag(parser, "-sg", "--sigma", type=float, default=1.0, above=0, help="σ of the attention function exp(−d²/σ)/σ")
        add_flag(parser, "--fedamp_pool", type=str, default="previous", choices=["previous", "all"],
                 help="models mixed into u_i: those uploaded in the previous round (PFLlib) "
                      "or every client's latest")

    def setup(self) -> None:
        if self.hp.sigma <= 0 or self.hp.alphaK <= 0:
            raise FLError(f"-sg and -alk must be > 0, got {self.hp.sigma} and {self.hp.alphaK}")
        self.previous_uploads: list[int] = []
        self._warned_negative = False

    def summary(self) -> dict[str, object]:
        a = self.args
        return {"alphaK": a.alphaK, "sigma": a.sigma, "lamda": a.lamda, "prox": a.fedamp_prox,
                "pool": a.fedamp_pool, "start": a.fedamp_start}

    def latest(self, index: int) -> torch.Tensor:
        """Client ``index``'s latest uploaded model (the initial model before its first upload)."""
        model = self.state.get("latest", index)
        return self.global_params if model is None else model

    def cloud_models(self, cohort: list[int]) -> dict[int, torch.Tensor]:
        """u_i for every client of ``cohort``."""
        pool = self.previous_uploads if self.hp.fedamp_pool == "previous" else list(range(len(self.clients)))
        own = torch.stack([self.latest(i) for i in cohort])
        if not pool:
            self.history.add_series("fedamp_self_weight", 1.0)
            return {i: own[k].clone() for k, i in enumerate(cohort)}
        num_params = self.model.num_params
        others = torch.stack([self.latest(j) for j in pool])
        sigma, alpha_k = self.hp.sigma, self.hp.alphaK
        xi = alpha_k * torch.exp(-squared_distances(own[:, :num_params], others[:, :num_params]) / sigma) / sigma
        xi *= torch.tensor([[float(j != i) for j in pool] for i in cohort], dtype=torch.float64, device=xi.device)
        self_weight = 1.0 - xi.sum(dim=1)
        if not self._warned_negative and bool((self_weight < 0).any()):
            self._warned_negative = True
            log.warning("warning: FedAMP self weight 1 − Σξ_ij = %.3g < 0 (u_i extrapolates); lower -alk or -sg",
                        float(self_weight.min()))
        out = {i: own[k].clone() for k, i in enumerate(cohort)}
        step = max(1, BLOCK_ELEMENTS // max(len(pool), 1))
        for c in range(0, num_params, step):
            cols = slice(c, min(c + step, num_params))
            mixed = xi @ others[:, cols].double() + self_weight[:, None] * own[:, cols].double()
            for k, i in enumerate(cohort):
                out[i][cols] = mixed[k].to(own.dtype)
        self.history.add_series("fedamp_self_weight", float(self_weight.mean()))
        return out

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        """Each selected client receives its own cloud model u_i (a per-client payload)."""
        return self.package(rnd, cohort, payloads={i: {"u": u} for i, u in self.cloud_models(cohort).items()})

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        """No global model: remember each upload as its client's latest model."""
        for update in updates:
            self.state.set("latest", update.index, update.params)
        self.previous_uploads = [u.index for u in updates]

    def after_round(self, rnd: int, package: RoundPackage, updates: list[ClientUpdate]) -> None:
        if not updates:
            self.previous_uploads = []
        super().after_round(rnd, package, updates)

    def eval_params(self, index: int) -> torch.Tensor:
        return self.latest(index)
