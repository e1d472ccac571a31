"""FedBABU (Oh, Kim, Yun, ICLR 2022, arXiv:2106.06042).

Rule: during federated training only the body is trained and aggregated; the head keeps its
common random initialisation (never updated, so it is the same on every client) and is not
uploaded (``shared = "body"``; ``clientfedbabu.py`` zeroes the head's gradient). For
personalisation each client fine-tunes the global model on its own training data before it is
evaluated, for ``-fte`` epochs of local SGD (batch ``-lbs``, learning rate ``-lr``).

When the fine-tuned models are evaluated (``--fedbabu_finetune_at``):
* ``final`` (default, PFLlib): only the last evaluation (round ``-gr``) evaluates the fine-tuned
  models; the earlier points of ``rs_test_acc`` are the global model's. PFLlib appends the
  fine-tuned evaluation as an extra point after the last one; here it replaces the last point,
  whose global-model accuracy stays in ``rs_test_acc_global`` (recorded at every evaluation).
  With ``-ab`` a run that stops early has no fine-tuned point.
* ``every``: every evaluation fine-tunes (costs ``-fte`` local epochs of every client per
  evaluation), which gives the paper's personalised-accuracy curve.

What is fine-tuned (``--fedbabu_finetune``): ``all`` (default, PFLlib's ``fine_tune``) the whole
model; ``head`` the head only, the reading of the paper's abstract ("the head is fine-tuned for
personalization"); the paper reports both. Its experiments fine-tune for 5 epochs (as Flower's
reproduction does); ``-fte`` keeps PFLlib's default of 10. With
``-fte 0`` every client is evaluated with the global model (a warning says so). Fine-tuned models
are computed for the evaluation and never stored; a client's batches and dropout come from the
(seed, round, client) streams of the evaluated round.
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser

import torch

from flcore.clients.clientfedbabu import FedBABUClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from cli.flags import add_flag
from utils.errors import FLError
from utils.metrics import EvalResult

log = logging.getLogger("fl")


@register_algorithm("FedBABU")
class FedBABUServer(Server):
    client_cls = FedBABUClient
    personalized = True
    shared = "body"

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-fte", "--fine_tuning_epochs", type=int, default=10, low=0,
                 help="local epochs of fine-tuning before a client is evaluated (paper: 5)")
        add_flag(parser, "--fedbabu_finetune", type=str, default="all", choices=["all", "head"],
                 help="fine-tune the whole model (PFLlib) or the head only")
        add_flag(parser, "--fedbabu_finetune_at", type=str, default="final", choices=["final", "every"],
                 help="evaluate fine-tuned models at the last evaluation only (PFLlib) or at every one")

    def setup(self) -> None:
        epochs = self.hp.fine_tuning_epochs
        if epochs < 0:
            raise FLError(f"-fte must be >= 0, got {epochs}")
        if epochs == 0:
            log.warning("warning: FedBABU with -fte 0 evaluates the global model without fine-tuning")
        part = self.hp.fedbabu_finetune
        self.tuned_entries = torch.ones_like(self.global_params, dtype=torch.bool)
        if part == "head":
            self.tuned_entries = self.model.head_mask()
        self.tuning_round: int | None = None  # the round whose evaluation is running fine-tuned

    def summary(self) -> dict[str, object]:
        return {"fine_tuning_epochs": self.hp.fine_tuning_epochs,
                "fedbabu_finetune": self.hp.fedbabu_finetune,
                "fedbabu_finetune_at": self.hp.fedbabu_finetune_at}

    def evaluate(self, rnd: int) -> EvalResult:
        final = rnd == int(self.args.global_rounds)
        if self.hp.fine_tuning_epochs > 0 and (final or self.hp.fedbabu_finetune_at == "every"):
            self.tuning_round = rnd
        try:
            return super().evaluate(rnd)
        finally:
            self.tuning_round = None

    def eval_params(self, index: int) -> torch.Tensor:
        """The global model (every client's head is the common initial one), fine-tuned on client
        ``index`` during a fine-tuned evaluation."""
        if self.tuning_round is None:
            return self.global_params
        package = self.package(self.tuning_round, [index])
        return self.clients[index].fine_tune(self.model, package, self.hp.fine_tuning_epochs, self.tuned_entries)
