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

**The head steps' shortcut.** In the head phase the body does not move, so what it makes of each
training row is the same at every head step of the round. Where the body's output depends on
nothing but its input and parameters (every module of it a plain layer: no dropout, no batch
statistics; ``PURE_LAYERS``), the client computes it once for all its rows at the round's first
head step and trains the head on those features: the same loss and head gradient as the full
forward pass (up to float rounding: the body runs on other batch shapes), without running the
body again at every step. It is a shortcut of the base step (``base_step_shortcuts``): the
batched engine's vmap, DP-SGD and the data attacks compute the full step as before, and a model
with another body, or a step on a GPU, takes the full step too.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import ClassVar

import torch
from torch import nn

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedbabu import FedBABUClient
from flcore.flat import FlatModel
from flcore.trainmodel.layout import ChannelsLastConv2d
from flcore.trainmodel.models import SplitModel
from cli.flags import add_flag

#: layers whose output depends only on their input and parameters, in train mode as in eval mode
PURE_LAYERS = (nn.Sequential, nn.Identity, nn.Flatten, nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Embedding,
               nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Hardswish,
               nn.Softmax, nn.LogSoftmax, nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d,
               nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.GroupNorm, nn.LayerNorm,
               ChannelsLastConv2d)  # (the CPU's convolution layout: a Conv2d in another memory format)
#: rows of the body's pass over a client's training data at a time
FEATURE_CHUNK = 256


def head_parameters(model: FlatModel) -> list[torch.Tensor] | None:
    """The parameters of the model's head (``module.head``); None where it has none (then a step that
    trains only the head computes every gradient, which the mask zeroes)."""
    return [p for seg, p in zip(model.param_segments(), model.module.parameters()) if seg.in_head] or None


class FedRepClient(FedBABUClient):
    """Head steps with the body frozen, then body steps with the head frozen."""

    per_step_context: ClassVar[tuple[str, ...]] = ("head_phase",)
    base_step_shortcuts: ClassVar[tuple[str, ...]] = ("compute_gradient",)

    #: the body's output on every training row, for the head steps of the round in progress (built
    #: at its first head step, dropped at its first body step and at the round's ends)
    _head_inputs: torch.Tensor | None = None

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
        self._head_inputs = None
        return ctx

    def end_round(self, params: torch.Tensor, package: RoundPackage, ctx: dict, steps: int,
                  loss: float) -> ClientUpdate:
        self._head_inputs = None
        return super().end_round(params, package, ctx, steps, loss)

    def compute_gradient(self, model: FlatModel, idx: torch.Tensor, ctx: dict | None = None) -> torch.Tensor:
        """A head step on the body's features of the round (module docstring) where the body allows it;
        the base step otherwise."""
        phase = None if ctx is None else ctx.get("head_phase")
        if phase is None or phase.device.type != "cpu" or not bool(phase):
            self._head_inputs = None  # a body step: the head phase is over
            return super().compute_gradient(model, idx, ctx)
        if self._head_inputs is None:
            if not features_are_fixed(model) or "local_loss" in type(self).capabilities.overrides:
                return super().compute_gradient(model, idx, ctx)
            with torch.no_grad():
                self._head_inputs = torch.cat([model.net.features(self.data.inputs("train", rows))
                                               for rows in torch.arange(self.num_train).split(FEATURE_CHUNK)])
        self.count_gradient_samples(idx)
        model.zero_grad()
        loss = self.objective.loss(model.net.head(self._head_inputs[idx]), self.data.train_y[idx])
        loss.backward(inputs=head_parameters(model))
        return loss.detach()

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


def features_are_fixed(model: FlatModel) -> bool:
    """Whether the model is ``head(body(x))`` with a body of ``PURE_LAYERS`` only, so that the body's
    output on a row is the same at every step that leaves the body's parameters as they are."""
    module = model.module
    return (type(module).forward is SplitModel.forward and head_parameters(model) is not None
            and all(type(layer) in PURE_LAYERS for layer in module.body.modules()))
