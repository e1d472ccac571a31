"""SCAFFOLD client (Karimireddy et al., ICML 2020, arXiv:1910.06378), option II control update.

With the server control c (received in the package) and the client's own control c_i (zero at
first participation, kept in the ``ClientStateStore`` as ``"control"``), every local step is

    y ← y − η_l · (g(y) − c_i + c),

and after K steps from x (the received global model)

    c_i⁺ = c_i − c + (x − y) / (K · η_l),        upload  y  and  Δc_i = c_i⁺ − c_i.

η_l is the learning rate this client used this round (after ``-ld`` decay). A client that takes
K = 0 steps (fewer samples than the batch size with ``drop_last``) keeps c_i unchanged and
uploads Δc_i = 0 rather than dividing by zero. The controls cover the trainable parameters only.
"""
from __future__ import annotations

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedavg import FedAvgClient


class ScaffoldClient(FedAvgClient):
    """Drift-corrected local SGD; the control variate c_i persists across participations."""

    hooks_draw_no_rng = True  # begin_round/end_round only read and write the state store

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        c = package.extras["control"]
        c_i = self.state.get("control", self.index, init=lambda: torch.zeros_like(c)).to(c.device)
        # 1 / (K η_l); zero when K = 0 so that the control update leaves c_i unchanged.
        inv_k_lr = 1.0 / (steps * self.learning_rate()) if steps else 0.0
        scale = torch.tensor(inv_k_lr, dtype=c.dtype, device=c.device)
        return {"correction": c - c_i, "control_i": c_i, "inv_k_lr": scale}

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        return g + ctx["correction"]

    def end_round(
        self, params: torch.Tensor, package: RoundPackage, ctx: dict[str, torch.Tensor], steps: int, loss: float
    ) -> ClientUpdate:
        c_i = ctx["control_i"]
        if steps:
            n = c_i.shape[-1]
            new_c_i = c_i - package.extras["control"] + (package.global_params[:n] - params[:n]) * ctx["inv_k_lr"]
        else:
            new_c_i = c_i
        delta_c = new_c_i - c_i
        self.state.set("control", self.index, new_c_i)
        return ClientUpdate(self.index, self.num_train, steps, params, loss, extras={"delta_control": delta_c})
