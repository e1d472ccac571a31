"""FedBABU client (Oh, Kim, Yun, ICLR 2022, arXiv:2106.06042).

During federated training the client runs FedAvg's local SGD on the body only: the head keeps
the values of the common random initialisation. The head is frozen by zeroing its entries of the
gradient (``adjust_grad``, a pure tensor function, so the batched engine runs it); with plain SGD
a zero gradient leaves the head bit for bit unchanged. The trainable entries are the shared ones
(``package.shared``, the body), so FedBABU trains exactly what it uploads.

For evaluation the server asks each client to fine-tune the global model on its training data
(:meth:`FedBABUClient.fine_tune`), with the same gradient mask over the entries being tuned.
"""
from __future__ import annotations

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import RoundPackage
from flcore.flat import FlatModel
from utils.seeding import rng_state, set_rng_state


class FedBABUClient(Client):
    """Local SGD with the gradient outside ``ctx["trainable"]`` (the head) set to zero."""
    hooks_draw_no_rng = True  # begin_round: the shared mask (fine_tune, at evaluation, restores the RNG it seeds)

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        trainable = package.shared
        if trainable is None:  # a model whose head has no parameters: everything trains
            trainable = torch.ones_like(package.global_params, dtype=torch.bool)
        return {"trainable": trainable}

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        # The mask covers the whole vector; w and g cover the trainable prefix only.
        return torch.where(ctx["trainable"][..., : g.shape[-1]], g, torch.zeros_like(g))

    def fine_tune(self, model: FlatModel, package: RoundPackage, epochs: int, trainable: torch.Tensor) -> torch.Tensor:
        """The global model after ``epochs`` epochs of local SGD on the ``trainable`` entries.

        Batches and dropout come from the (seed, round, client) streams of ``package.round``; the
        global RNG is restored afterwards, so evaluating never changes training. Nothing is stored."""
        saved = rng_state(model.device)
        self.seed_round(package.round)
        model.load(package.global_params)
        with torch.enable_grad():  # evaluation may run under no_grad
            self.sgd(model, package, {"trainable": trainable}, self.batch_plan(package.round, epochs),
                     self.learning_rate())
        set_rng_state(saved)
        return model.snapshot()
