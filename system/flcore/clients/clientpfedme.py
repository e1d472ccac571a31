"""pFedMe client (Dinh, Tran, Nguyen, NeurIPS 2020, arXiv:2006.08848): Moreau-envelope personalisation.

Client i keeps a local copy w of the global model and a personalised model θ. For every
minibatch D of its local epochs:

    K times:  θ ← θ − lrp · (∇f(θ; D) + λ (θ − w) + μ θ)      (θ ≈ argmin f(θ; D) + λ/2‖θ − w‖²)
    then:     w ← w − η λ (w − θ)                              (η = -lr)

θ and w both start the round at the received global model; θ warm-starts each minibatch's inner
problem from the previous one. The upload is w; θ is kept as the client's personalised model
(state ``personal``) and evaluated.

Choices where the paper, PFLlib (``clientpFedMe.py``, ``pFedMeOptimizer``) and this file differ:

* μ (``--pfedme_mu``, default 0.001) is the small weight decay that PFLlib's and the authors'
  ``pFedMeOptimizer`` add to the inner step; the paper's inner problem has none (use 0).
* A local epoch is a pass over the client's data in ``-lbs`` minibatches (PFLlib); the authors'
  code takes ``local_epochs`` single batches instead.
* ``-ld`` decays both lrp and η (PFLlib decays only lrp).
* PFLlib's personalised evaluation aliases θ to the model's parameters, so it ends up measuring
  the received global model; we evaluate θ after the client's last local step (the paper's code).
* The uploaded float buffers (BatchNorm statistics) are those left by θ's forward passes, as in
  PFLlib, which copies only parameters back.
* The recorded local loss is the mean of f(θ; D) over all inner steps.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import LocalJob
from flcore.flat import FlatModel
from cli.flags import add_flag


class PFedMeClient(Client):
    """Inner solve for θ, outer step for w; uploads w and keeps θ."""

    vectorisable = False

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-lam", "--lamda", type=float, default=1.0, low=0,
                 help="pFedMe: λ of the Moreau envelope λ/2‖θ − w‖² (PFLlib default 1; paper 15)")
        add_flag(parser, "-K", "--K", type=int, default=5, low=1, help="pFedMe: inner steps K that solve for θ per minibatch")
        add_flag(parser, "-lrp", "--p_learning_rate", type=float, default=0.01, above=0,
                 help="pFedMe: learning rate of the inner steps on θ")
        add_flag(parser, "--pfedme_mu", type=float, default=0.001, low=0,
                 help="pFedMe: weight decay μ·θ in the inner step (PFLlib/authors' optimizer 0.001; paper 0)")

    def expected_gradient_samples(self) -> float:
        """K inner steps per minibatch."""
        return self.hp.K * super().expected_gradient_samples()

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        package, rnd, plan = job.package, job.package.round, job.plan
        lam, mu, inner = self.hp.lamda, self.hp.pfedme_mu, self.hp.K
        decay = self.learning_rate() / self.args.local_learning_rate  # -ld factor (1 without -ld)
        eta, lrp = self.learning_rate(), self.hp.p_learning_rate * decay
        model.load(package.global_params)
        model.module.train()
        theta = model.params
        w = package.global_params[: model.num_params].clone()
        loss_sum = torch.zeros((), device=model.device)
        # Two buffers for the steps' terms, reused: a new model-sized temporary per term and inner
        # step (five of them) cost more than the arithmetic. Same operations in the same order.
        step, decay = torch.empty_like(theta), torch.empty_like(theta)
        for idx in plan:
            for _ in range(inner):
                loss_sum += self.compute_gradient(model, idx)
                torch.sub(theta, w, out=step).mul_(lam).add_(model.grad)  # ∇f + λ(θ − w)
                step.add_(torch.mul(theta, mu, out=decay)).mul_(lrp)  # (… + μθ) · lrp
                theta.sub_(step)
            w.sub_(torch.sub(w, theta, out=step).mul_(eta * lam))
        loss = self.check_loss(loss_sum, len(plan) * inner, rnd)
        personal = model.snapshot()
        self.state.set("personal", self.index, personal)
        upload = personal.clone()
        upload[: model.num_params] = w
        return upload, loss
