"""FedRep client (Collins, Hassani, Mokhtari, Shakkottai, ICML 2021, arXiv:2102.07078).

Each round a selected client, holding the global body (representation) φ and its own head h_i:

1. head: ``-pls`` epochs of minibatch SGD on h_i with φ frozen;
2. body: ``-ls`` epochs of minibatch SGD on φ with the new h_i frozen; φ is uploaded, h_i kept.

This is PFLlib's order and epochs (head ``-pls``, body ``-ls``; slow trainers shorten only the
body phase). Both phases use ``-lr``. Freezing is the gradient mask of FedBABU's client (the body
phase is exactly FedBABU's local step), so with ``-pls 0`` FedRep's federated training is
FedBABU's. The head phase draws its batches from the round's (seed, round, client) batch stream
afresh, so its epochs visit the data in the order of the body phase's first epochs. The recorded
training loss is the body phase's.

Two SGD phases per round do not fit a single ``adjust_grad`` (it does not know the step), so
the client has its own ``train_job`` and is trained sequentially by every engine.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import ClassVar

import torch

from flcore.clients.clientbase import LocalJob
from flcore.clients.clientfedbabu import FedBABUClient
from flcore.flat import FlatModel
from utils.cli import add_flag


class FedRepClient(FedBABUClient):
    """Head epochs with the body frozen, then body epochs with the head frozen."""

    vectorisable: ClassVar[bool] = False

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-pls", "--plocal_epochs", type=int, default=1,
                 help="epochs of head training (body frozen) before the body epochs (paper: 10)")

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        package, body = job.package, job.ctx["trainable"]
        model.load(job.start)
        head_plan = self.batch_plan(package.round, self.hp.plocal_epochs)
        self.sgd(model, package, {"trainable": ~body}, head_plan, job.lr)
        loss = self.sgd(model, package, job.ctx, job.plan, job.lr)
        return model.snapshot(), loss
