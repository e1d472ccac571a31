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
the start of its next participation (nothing to distil in its first). The distillation and the
public-set pass need the model, so this client runs its own ``train_job`` (the engines train it
sequentially). The public inputs arrive in the package.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client, ClientUpdate, LocalJob, RoundPackage
from flcore.flat import FlatModel
from utils.cli import add_flag
from utils.data_utils import decode_inputs
from utils.seeding import torch_generator


class KTpFLClient(Client):
    """Distil towards the personalised soft target, train locally, upload public soft predictions."""

    vectorisable = False  # distillation on public data and a prediction pass: its own train_job

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--ktpfl_lambda", type=float, default=1.0, low=0, help="KT-pFL: weight λ of the distillation loss")
        add_flag(parser, "--ktpfl_temperature", type=float, default=1.0, above=0,
                 help="KT-pFL: softmax temperature T of the soft predictions")
        add_flag(parser, "--ktpfl_steps", type=int, default=5, low=0,
                 help="KT-pFL: distillation steps R on public minibatches per participation")

    def expected_gradient_samples(self) -> float:
        return super().expected_gradient_samples() + self.hp.ktpfl_steps * self.batch_size

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        ctx = {"public_x": decode_inputs(package.extras["public_x"], package.extras.get("public_table"))}
        target = package.payload(self.index).get("soft_target")
        if target is not None:
            ctx["soft_target"] = target
        return ctx

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        model.load(job.start)
        if "soft_target" in job.ctx:
            self.distil(model, job)
        job.start = model.snapshot()
        params, loss = super().train_job(job, model)
        job.ctx["soft"] = self.soft_predictions(model, job.ctx["public_x"])
        return params, loss

    def distil(self, model: FlatModel, job: LocalJob) -> None:
        """R SGD steps of λ·T²·KL(ŝ_n ‖ softmax(f(x)/T)) on public minibatches."""
        public_x, target, hp = job.ctx["public_x"], job.ctx["soft_target"], self.hp
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
