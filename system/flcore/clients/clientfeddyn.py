"""FedDyn client: dynamic regularisation (Acar et al., ICLR 2021, arXiv:2111.04263).

Client k, holding the received server model θ^{t−1} and its own state ∇L_k (the gradient of its
loss at its last local optimum; zero before its first participation), minimises

    L_k(θ) − ⟨∇L_k, θ⟩ + α/2 · ‖θ − θ^{t−1}‖²

by minibatch SGD, i.e. every step is θ ← θ − η (g(θ) − ∇L_k + α (θ − θ^{t−1})), a linear plus a
proximal term in ``adjust_grad`` (the batched engine runs it). After training it updates its state
(the paper's first-order condition)

    ∇L_k ← ∇L_k − α (θ_k^t − θ^{t−1})

and uploads θ_k^t only. The state covers the trainable parameters (the server tells each client
how many entries of the flat vector those are). A client whose upload is dropped (``-cdr``) has
still updated its state, as a real device would. With α = 0 the step is plain SGD (FedAvg's).

``--feddyn_norm unsquared`` selects PFLlib's regulariser α/2·‖θ − θ^{t−1}‖₂ (not squared): its
gradient is α/2·(θ − θ^{t−1})/‖θ − θ^{t−1}‖ (0 where θ = θ^{t−1}), while PFLlib's state update stays
the paper's. The default ``squared`` is the paper's.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, RoundPackage
from cli.flags import add_flag


class FedDynClient(Client):
    """SGD on the dynamically regularised local objective; ∇L_k persists across participations."""
    hooks_draw_no_rng = True  # begin_round/end_round read and write the state store

    #: length of the trainable prefix of the flat vector; set by the server

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-al", "--alpha", type=float, default=1.0, low=0,
                 help="FedDyn regularisation α (PFLlib default 1.0; paper {0.1, 0.01, 0.001})")
        add_flag(parser, "--feddyn_norm", type=str, default="squared", choices=["squared", "unsquared"],
                 help="α/2·‖θ − θ_g‖² (paper) or PFLlib's unsquared α/2·‖θ − θ_g‖₂")

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        anchor = package.global_params  # the same object for all clients: the batched engine shares it
        state = self.state.get("dyn_grad", self.index, init=lambda: torch.zeros_like(anchor[: self.task.num_params]))
        return {"anchor": anchor, "dyn_grad": state.to(anchor.device)}

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        alpha = self.hp.alpha
        diff = w - ctx["anchor"][..., : w.shape[-1]]
        if self.hp.feddyn_norm == "unsquared":  # a hyperparameter, not a tensor value: vmappable
            norm = torch.linalg.vector_norm(diff, dim=-1, keepdim=True)
            prox = 0.5 * alpha * diff / norm.clamp_min(torch.finfo(diff.dtype).tiny)
        else:
            prox = alpha * diff
        return g - ctx["dyn_grad"] + prox

    def end_round(
        self, params: torch.Tensor, package: RoundPackage, ctx: dict[str, torch.Tensor], steps: int, loss: float
    ) -> ClientUpdate:
        n = self.task.num_params
        updated = ctx["dyn_grad"] - self.hp.alpha * (params[:n] - ctx["anchor"][:n])
        self.state.set("dyn_grad", self.index, updated)
        return super().end_round(params, package, ctx, steps, loss)
