"""FedRep client (Collins, Hassani, Mokhtari, Shakkottai, ICML 2021, arXiv:2102.07078).

Each round a selected client, holding the global body (representation) φ and its own head h_i:

1. head: ``-pls`` epochs of minibatch SGD on h_i with φ frozen;
2. body: ``-ls`` epochs of minibatch SGD on φ with the new h_i frozen; φ is uploaded, h_i kept.

This is PFLlib's order and epochs (head ``-pls``, body ``-ls``; slow trainers shorten only the
body phase). Both phases use ``-lr``. The round's batch plan is the head epochs followed by the
body epochs; each phase draws from the round's (seed, round, client) batch stream afresh, so the
head epochs visit the data in the order of the first body epochs. A per-step context entry
(``head_phase``, one flag per local step) says which phase a step belongs to, and ``adjust_grad``
zeroes the gradient of the frozen part: FedBABU's mask (the body) in the body phase, its
complement (the head) in the head phase. The step stays a pure tensor function, so the threaded
and batched engines train FedRep clients too. With ``-pls 0`` every step is a body step and the
local training is FedBABU's bit for bit. The recorded training loss is the mean over both phases.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import ClassVar

import torch

from flcore.protocol import RoundPackage
from flcore.clients.clientfedbabu import FedBABUClient
from flcore.flat import FlatModel
from cli.flags import add_flag


def head_parameters(model: FlatModel) -> list[torch.Tensor] | None:
    """The parameters of the model's head (``module.head``); None where it has none (then a step that
    trains only the head computes every gradient, which the mask zeroes)."""
    return [p for seg, p in zip(model.param_segments(), model.module.parameters()) if seg.in_head] or None


class FedRepClient(FedBABUClient):
    """Head steps with the body frozen, then body steps with the head frozen."""

    per_step_context: ClassVar[tuple[str, ...]] = ("head_phase",)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-pls", "--plocal_epochs", type=int, default=1, low=0,
                 help="epochs of head training (body frozen) before the body epochs (paper: 10)")

    def batch_plan(self, rnd: int, epochs: int | None = None) -> list[torch.Tensor]:
        """The round's plan: ``-pls`` head epochs, then the body epochs (``epochs`` given: plain)."""
        if epochs is not None:
            return super().batch_plan(rnd, epochs)
        return super().batch_plan(rnd, self.hp.plocal_epochs) + super().batch_plan(rnd)

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        ctx = super().begin_round(package, steps)  # "trainable": the body
        head_steps = len(super().batch_plan(package.round, self.hp.plocal_epochs))
        ctx["head_phase"] = torch.arange(steps, device=package.global_params.device) < head_steps
        return ctx

    def gradient_inputs(self, model: FlatModel, ctx: dict) -> list[torch.Tensor] | None:
        """A head step needs only the head's gradient (``adjust_grad`` zeroes the body's), so its backward
        pass stops at the head instead of running on through the frozen body: the same head gradient,
        by the same operations. Body steps, and head steps whose flag lives on a GPU (reading it there
        would wait for the device), take every gradient."""
        phase = ctx.get("head_phase")
        if phase is not None and phase.device.type == "cpu" and bool(phase):
            return head_parameters(model)
        return None

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        # ctx["head_phase"] is this step's flag: train the head (not the body) in the head phase.
        trainable = ctx["trainable"][..., : g.shape[-1]] != ctx["head_phase"][..., None]
        return torch.where(trainable, g, torch.zeros_like(g))
