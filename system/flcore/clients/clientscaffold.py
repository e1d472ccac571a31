"""SCAFFOLD client (Karimireddy et al., ICML 2020, arXiv:1910.06378), option II control update.

With the server control c (received in the package) and the client's own control c_i (zero at
first participation, kept in the ``ClientStateStore`` as ``"control"``), every local step is

    y ← y − η_l · (g(y) − c_i + c),

and after K steps from x (the received global model)

    c_i⁺ = c_i − c + (x − y) / (K · η_l),        upload  y  and  Δc_i = c_i⁺ − c_i.

η_l is the learning rate this client used this round (after ``-ld`` decay). A client that takes
K = 0 steps (fewer samples than the batch size with ``drop_last``) keeps c_i unchanged and
uploads Δc_i = 0 rather than dividing by zero. The controls cover the trainable parameters only.

With ``--local_momentum β`` the paper (plain SGD) leaves open where the correction enters; the
two readings differ, and ``--scaffold_correction`` chooses:

* ``gradient`` (default): the correction is part of the gradient, so it passes through the
  momentum buffer (v ← β·v + g − c_i + c, y ← y − η_l·v): in a steady state it moves the
  weights 1/(1 − β) times as far as without momentum.
* ``step``: the optimiser steps on g alone (momentum, weight decay) and the correction is applied
  to the weights after each step, y ← y − η_l·v − η_l·(c − c_i), as NIID-Bench's code
  (``train_net_scaffold``) and Flower's ``baselines/niid_bench`` (``ScaffoldOptimizer``) do. It is
  computed through the same buffer: with direction g + s_t·(c − c_i), s_0 = 1 and s_t = 1 − β
  after, the buffer equals the optimiser's plus (c − c_i) at every step (PyTorch's first step
  copies the direction into the buffer), for every engine.

Without momentum both are the same step. Option II's control update holds in both: the K
corrections move y by exactly K·η_l·(c − c_i) in ``step`` mode.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import ClassVar

import torch

from cli.flags import add_flag

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedavg import FedAvgClient


class ScaffoldClient(FedAvgClient):
    """Drift-corrected local SGD; the control variate c_i persists across participations."""
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    hooks_draw_no_rng = True  # begin_round/end_round only read and write the state store
    #: ``--scaffold_correction step``: the correction's weight at each local step (module docstring)
    per_step_context: ClassVar[tuple[str, ...]] = ("correction_scale",)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--scaffold_correction", type=str, default="gradient", choices=["gradient", "step"],
                 help="with --local_momentum: the correction c - c_i passes through the momentum buffer (gradient) "
                      "or is applied to the weights after each optimiser step (step: NIID-Bench's and Flower's code)")

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        c = package.extras["control"]
        c_i = self.state.get("control", self.index, init=lambda: torch.zeros_like(c)).to(c.device)
        # 1 / (K η_l); zero when K = 0 so that the control update leaves c_i unchanged.
        inv_k_lr = 1.0 / (steps * self.learning_rate()) if steps else 0.0
        scale = torch.tensor(inv_k_lr, dtype=c.dtype, device=c.device)
        ctx = {"correction": c - c_i, "control_i": c_i, "inv_k_lr": scale}
        if self.hp.scaffold_correction == "step" and self.local_momentum:  # (every client: the same keys)
            weights = torch.full((max(steps, 1),), 1.0 - self.local_momentum, dtype=c.dtype, device=c.device)
            weights[0] = 1.0
            ctx["correction_scale"] = weights
        return ctx

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        if "correction_scale" in ctx:
            return g + ctx["correction_scale"] * ctx["correction"]
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
