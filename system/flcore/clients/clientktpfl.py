"""KT-pFL client (Zhang, Guo, Ma, Wang, Xu, Wu, NeurIPS 2021, "Parameterized Knowledge Transfer for
Personalized Federated Learning", arXiv:2111.02862).

Each client keeps its own model (it never travels). When selected in round t it

1. distils towards its personalised soft target ŝ_n, which the server formed from the soft
   predictions the clients uploaded in earlier rounds (``serverktpfl.py``): ``--ktpfl_steps`` R SGD
   steps on minibatches of ``-lbs`` public samples (drawn from (seed, round, client)) of
   λ·T²·KL(ŝ_n ‖ softmax(f(x)/T)), λ = ``--ktpfl_lambda``, T = ``--ktpfl_temperature``;
2. trains on its private data (FedAvg's local SGD, ``-ls`` epochs);
3. uploads its soft predictions s_n = softmax(f(x)/T) on the whole public set (eval mode).

The paper's round runs the distillation after the server's update of the knowledge coefficients,
in the same round; here the server's answer arrives with the next package, so a client distils at
the start of its next participation (nothing to distil in its first). Step 1 is the client's
``pre_training`` and step 3 its ``post_training`` on the working model, around the base SGD of
step 2, so every engine trains these clients (the batched one vectorises step 2). The public
inputs arrive in the package's sent-once part (``RoundPackage.static``): each client downloads
them once.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, LocalJob, RoundPackage
from flcore.flat import FlatModel
from cli.flags import add_flag
from fldata.loading import decode_inputs
from utils.seeding import torch_generator


class KTpFLClient(Client):
    """Distil towards the personalised soft target, train locally, upload public soft predictions."""
    uploads_instead = "soft predictions on the server's public data"

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--ktpfl_lambda", type=float, default=1.0, low=0, help="KT-pFL: weight λ of the distillation loss")
        add_flag(parser, "--ktpfl_temperature", type=float, default=1.0, above=0,
                 help="KT-pFL: softmax temperature T of the soft predictions")
        add_flag(parser, "--ktpfl_steps", type=int, default=5, low=0,
                 help="KT-pFL: distillation steps R on public minibatches per participation")

    def expected_gradient_samples(self) -> float:
        return super().expected_gradient_samples() + self.hp.ktpfl_steps * self.batch_size

    @staticmethod
    def public_inputs(package: RoundPackage) -> torch.Tensor:
        return decode_inputs(package.static["public_x"], package.static.get("public_table"))

    def pre_training(self, job: LocalJob, model: FlatModel) -> None:
        """Step 1: R SGD steps of λ·T²·KL(ŝ_n ‖ softmax(f(x)/T)) on public minibatches."""
        target = job.package.payload(self.index).get("soft_target")
        if target is None:  # no personalised target yet (its first participation)
            return
        public_x, hp = self.public_inputs(job.package), self.hp
        draw = torch_generator(self.args.seed, "ktpfl-public", job.package.round, self.cid)
        rows = torch.cat([torch.randperm(len(public_x), generator=draw)
                          for _ in range(-(-hp.ktpfl_steps * self.batch_size // max(len(public_x), 1)))])
        model.module.train()
        temperature = hp.ktpfl_temperature
        for step in range(hp.ktpfl_steps):
            idx = rows[step * self.batch_size : (step + 1) * self.batch_size].to(public_x.device)
            self.count_gradient_samples(idx)
            model.zero_grad()
            log_student = F.log_softmax(model.net(public_x[idx]) / temperature, dim=1)
            loss = hp.ktpfl_lambda * temperature**2 * F.kl_div(log_student, target[idx], reduction="batchmean")
            loss.backward()
            model.params.sub_(model.grad, alpha=job.lr)

    def post_training(self, job: LocalJob, model: FlatModel) -> None:
        """Step 3: the soft predictions on the public set, uploaded."""
        job.ctx["soft"] = self.soft_predictions(model, self.public_inputs(job.package))

    @torch.no_grad()
    def soft_predictions(self, model: FlatModel, public_x: torch.Tensor) -> torch.Tensor:
        module = model.module
        was_training = module.training
        module.eval()
        batch = int(self.args.eval_batch_size)
        try:
            logits = torch.cat([model.net(public_x[i : i + batch]) for i in range(0, len(public_x), batch)])
        finally:
            module.train(was_training)
        return F.softmax(logits / self.hp.ktpfl_temperature, dim=1)

    def end_round(self, params, package, ctx, steps, loss) -> ClientUpdate:
        return ClientUpdate(self.index, self.num_train, steps, params, loss, extras={"soft": ctx["soft"]},
                            uploads_params=False)
