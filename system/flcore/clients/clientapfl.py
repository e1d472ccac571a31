"""APFL client (Deng, Kamani, Mahdavi, 2020, arXiv:2003.13461), the paper's local-descent step.

On every local minibatch ξ (``-ls`` epochs, learning rate η = ``-lr``), with w, v, α the values
before the step and v̄ = α v + (1 − α) w:

    w ← w − η ∇f_i(w; ξ)                              (FedAvg's step; w is uploaded)
    v ← v − η ∇_v f_i(v̄; ξ) = v − η α ∇f_i(v̄; ξ)      (chain rule through the parameter mixture)
    α ← clip(α − η ⟨v − w, ∇f_i(v̄; ξ)⟩, 0, 1)         (only with ``--apfl_adaptive_alpha``)

Deliberate choices where the paper, its authors' code (FedTorch) and PFLlib differ:
* the mixture is of *parameters* (paper, PFLlib); FedTorch mixes the two models' outputs;
* v follows the gradient of the mixed model's loss (paper, FedTorch); PFLlib trains v on its own
  loss and then overwrites it with the mixture;
* α is updated every step with learning rate η and no regulariser (paper); FedTorch and PFLlib
  add 0.02·α to α's gradient, FedTorch updates α once per round;
* ``-al`` (α's initial value) defaults to 0.25, a mostly-global start that adaptive α moves per
  client; PFLlib's default is 1.0 (``-al 1``). ``--apfl_adaptive_alpha False`` keeps α fixed.
* float buffers (BatchNorm statistics) of v follow the mixed model's forward passes.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import ClassVar

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import LocalJob
from flcore.flat import FlatModel
from cli.flags import add_flag


class APFLClient(Client):
    """Trains the global copy w, the personal model v and the mixing weight α together."""

    vectorisable: ClassVar[bool] = False

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-al", "--alpha", type=float, default=0.25, low=0, high=1,
                 help="initial mixing weight α of the personal model in α v + (1 − α) w (PFLlib default 1.0)")
        add_flag(parser, "--apfl_adaptive_alpha", type=bool, default=True,
                 help="learn α per client by gradient descent (paper); False keeps α fixed at -al")

    def expected_gradient_samples(self) -> float:
        """Two gradients a step: the local model's and the mixed model's."""
        return 2.0 * super().expected_gradient_samples()

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        rnd, lr, plan = job.package.round, job.lr, job.plan
        p = model.num_params
        w = job.start.clone()
        v = self.state.get("personal", self.index).clone()  # both created by the server
        alpha = float(self.state.get("alpha", self.index)[0])
        adaptive = self.hp.apfl_adaptive_alpha
        model.module.train()
        loss_sum = torch.zeros((), device=model.device)
        for idx in plan:
            model.load(w)
            loss_sum += self.compute_gradient(model, idx)
            w_next = model.snapshot()
            w_next[:p].add_(model.grad, alpha=-lr)  # the base SGD step's arithmetic
            model.load(alpha * v + (1.0 - alpha) * w)
            self.compute_gradient(model, idx)
            grad_mixed = model.grad
            v_next = model.snapshot()
            v_next[:p] = v[:p].add(grad_mixed, alpha=-lr * alpha)
            if adaptive:
                step = float(torch.dot((v[:p] - w[:p]).double(), grad_mixed.double()))
                alpha = min(1.0, max(0.0, alpha - lr * step))
            w, v = w_next, v_next
        loss = self.check_loss(loss_sum, len(plan), rnd)
        self.state.set("personal", self.index, v)
        self.state.set("alpha", self.index, torch.tensor([alpha], dtype=torch.float64))
        return w, loss
