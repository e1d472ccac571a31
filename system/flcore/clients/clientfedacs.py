"""FedACS client (Chen, Li, Shen, arXiv:2312.15148): local training from the intermediate model u_i.

Eq. 5 is w_i = u_i − β ∇F_i(u_i), one gradient step from the u_i the server computed (Eq. 4);
the paper calls it local fine-tuning with "several gradient steps". There is no proximal term
(unlike FedAMP). ``--fedacs_local_steps`` chooses how many minibatch SGD steps (lr β = ``-lr``):
−1 (default) = the usual E epochs (``-ls``), k > 0 = exactly k minibatch steps (k = 1 is Eq. 5
with a stochastic gradient), drawn from the same per-(round, client) batch stream.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import RoundPackage
from cli.flags import add_flag


class FedACSClient(Client):
    """Starts from u_i (the server's per-client payload ``u``); the step is plain SGD."""

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--fedacs_local_steps", type=int, default=-1, low=-1,
                 help="local minibatch steps from u_i: -1 = E epochs (-ls), k > 0 = exactly k steps (1 = Eq. 5)")

    def start_point(self, package: RoundPackage) -> torch.Tensor:
        return package.payload(self.index)["u"]

    def batch_plan(self, rnd: int, epochs: int | None = None) -> list[torch.Tensor]:
        steps = self.hp.fedacs_local_steps
        if steps <= 0 or epochs is not None:
            return super().batch_plan(rnd, epochs)
        per_epoch = self.steps_per_epoch
        if per_epoch == 0:
            return []
        return super().batch_plan(rnd, epochs=-(-steps // per_epoch))[:steps]
