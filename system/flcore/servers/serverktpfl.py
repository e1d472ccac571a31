"""KT-pFL: parameterized knowledge transfer for personalised FL (Zhang, Guo, Ma, Wang, Xu, Wu,
NeurIPS 2021, arXiv:2111.02862); not in PFLlib.

Needs a public dataset held by the server (``--public_data``, ``fldata/public.py``). No model
weights travel: each selected client uploads its soft predictions s_m on the public inputs
(``clientktpfl.py``), which the server keeps as that client's latest. The server learns a
knowledge-coefficient matrix c (N x N, every entry 1/N at the start) and gives client n the
personalised soft target

    ŝ_n = Σ_m c_nm s_m / Σ_m c_nm        over the clients m that have uploaded so far,

towards which the client distils when next selected. After each round's uploads, c takes
``--ktpfl_coef_steps`` gradient steps (lr ``--ktpfl_coef_lr``) on

    λ · (1/|P|) Σ_{n∈P} KL(ŝ_n ‖ s_n) + ρ ‖c − 1/N‖²_F,        ρ = ``--ktpfl_rho``,

P the clients with soft predictions (the paper's objective in c: the distillation loss of every
client against its personalised target, which pulls c_nn up, and the ρ-regulariser, which pulls c
towards uniform knowledge sharing). Each row of c is then projected onto the probability simplex,
so every ŝ_n is a distribution (a choice made here: the paper states no constraint on c).

Personalised accuracy only (each client's own model): KT-pFL has no global model.
``rs_ktpfl_self_weight`` records the mean c_nn. Traffic: an upload is |public| x C floats (2% of
MNIST: 1,200 x 10, 48 KB); a download carries the client's |public| x C target, and the public
inputs as the dataset holds them (8-bit images as one byte a pixel: 0.94 MB for 2% of MNIST) in
the package's sent-once part, so each client downloads them once, in its first round.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientktpfl import KTpFLClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from cli.flags import add_flag
from utils.errors import FLError


def project_rows_to_simplex(c: torch.Tensor) -> torch.Tensor:
    """Each row's Euclidean projection onto {v ≥ 0, Σ v = 1} (sort-based, Held et al. 1974)."""
    n = c.shape[1]
    ordered, _ = torch.sort(c, dim=1, descending=True)
    cumulative = ordered.cumsum(dim=1) - 1
    ranks = torch.arange(1, n + 1, dtype=c.dtype, device=c.device)
    support = (ordered - cumulative / ranks) > 0
    last = support.sum(dim=1, keepdim=True)  # ≥ 1: the largest entry is always in the support
    shift = cumulative.gather(1, last - 1) / last.to(c.dtype)
    return (c - shift).clamp_min(0.0)


def personalised_targets(c: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
    """ŝ_n = Σ_m c_nm s_m / Σ_m c_nm for every row n of c over the pool's soft predictions ``soft``
    ([P, samples, C]; c: [rows, P])."""
    weights = c / c.sum(dim=1, keepdim=True).clamp_min(1e-12)
    return torch.einsum("np,psc->nsc", weights, soft)


@register_algorithm("KT-pFL")
class KTpFLServer(Server):
    #: what persists across rounds (checkpoints): the knowledge coefficient matrix
    carried = ("coefficients",)

    client_cls = KTpFLClient
    personalized = True
    has_global_model = False
    shared = ()  # no model weights travel: every client keeps its whole model

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--ktpfl_rho", type=float, default=0.1, low=0,
                 help="KT-pFL: ρ of the regulariser ρ‖c − 1/N‖² on the knowledge coefficients")
        add_flag(parser, "--ktpfl_coef_lr", type=float, default=0.1, low=0,
                 help="KT-pFL: learning rate of the knowledge coefficients c")
        add_flag(parser, "--ktpfl_coef_steps", type=int, default=1, low=0,
                 help="KT-pFL: gradient steps on c per round")

    @classmethod
    def public_data_user(cls, args) -> str | None:
        return "KT-pFL"

    def setup(self) -> None:
        public = self.public_data()
        hp = self.hp
        checks = (("--ktpfl_temperature", hp.ktpfl_temperature > 0), ("--ktpfl_steps", hp.ktpfl_steps >= 0),
                  ("--ktpfl_lambda", hp.ktpfl_lambda >= 0), ("--ktpfl_rho", hp.ktpfl_rho >= 0),
                  ("--ktpfl_coef_lr", hp.ktpfl_coef_lr >= 0), ("--ktpfl_coef_steps", hp.ktpfl_coef_steps >= 0))
        for flag, ok in checks:
            if not ok:
                raise FLError(f"KT-pFL: {flag} {getattr(hp, flag[2:])} is out of range (temperature > 0, others >= 0)")
        # as the dataset holds them: 8-bit images travel as one byte a pixel with their value table
        self.public = {"public_x": public.x.to(self.device)}
        if public.table is not None:
            self.public["public_table"] = public.table.to(self.device)
        n = len(self.clients)
        self.coefficients = torch.full((n, n), 1.0 / n, dtype=torch.float64, device=self.device)

    def summary(self) -> dict[str, object]:
        hp = self.hp
        return {"lambda": hp.ktpfl_lambda, "temperature": hp.ktpfl_temperature, "steps": hp.ktpfl_steps,
                "rho": hp.ktpfl_rho, "coef_lr": hp.ktpfl_coef_lr, "coef_steps": hp.ktpfl_coef_steps,
                "public_samples": len(self.public["public_x"])}

    def pool(self) -> list[int]:
        """The clients whose soft predictions the server holds."""
        return self.state.indices("soft")

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        pool = self.pool()
        payloads = {}
        if pool:
            soft = torch.stack([self.state.get("soft", m) for m in pool]).double()
            targets = personalised_targets(self.coefficients[cohort][:, pool], soft)
            payloads = {i: {"soft_target": targets[k].to(self.global_params.dtype)} for k, i in enumerate(cohort)}
        return self.package(rnd, cohort, static=dict(self.public), payloads=payloads)

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        for update in updates:
            self.state.set("soft", update.index, update.extras["soft"])
        self.update_coefficients()

    def update_coefficients(self) -> None:
        """``--ktpfl_coef_steps`` projected gradient steps of c on the objective in the docstring."""
        pool = self.pool()
        soft = torch.stack([self.state.get("soft", m) for m in pool]).double()
        n = len(self.clients)
        for _ in range(int(self.hp.ktpfl_coef_steps)):
            c = self.coefficients.detach().requires_grad_(True)
            targets = personalised_targets(c[pool][:, pool], soft)  # ŝ_n for the clients of the pool
            kl = (targets * (targets.clamp_min(1e-12).log() - soft.clamp_min(1e-12).log())).sum(-1).mean(-1)
            loss = self.hp.ktpfl_lambda * kl.mean() + self.hp.ktpfl_rho * (c - 1.0 / n).pow(2).sum()
            (grad,) = torch.autograd.grad(loss, c)
            self.coefficients = project_rows_to_simplex((c - self.hp.ktpfl_coef_lr * grad).detach())
        self.history.add_series("ktpfl_self_weight", float(self.coefficients.diagonal().mean()))
