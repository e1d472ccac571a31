"""FedMix client (Yoon, Shin, Hwang, Yang, ICLR 2021, "FedMix: Approximation of Mixup under Mean
Augmented Federated Learning", arXiv:2107.00233).

Mean augmented FL: each client shares averaged data. Its training samples are split into groups
of ``--fedmix_mean_size`` M (a permutation drawn from (seed, client)) and each group's mean input
x̄ and mean one-hot label ȳ are uploaded, once, with the client's first upload. The server sends
everyone's means back; a client mixes its samples with the *other* clients' means. For each local
sample (x_i, y_i), paired with a mean (x̄_j, ȳ_j) drawn at random (with replacement, from (seed,
round, client), one per sample of every local step), the loss is

    FedMix (default, the paper's first-order approximation of global Mixup):
        (1 − λ) · CE(f((1 − λ)x_i), y_i) + λ · CE(f((1 − λ)x_i), ȳ_j) + λ · ⟨∂CE(f(x), y_i)/∂x |_{x=(1−λ)x_i}, x̄_j⟩
    NaiveMix (``--fedmix_variant naive``): Mixup of the sample with the mean itself,
        (1 − λ) · CE(f(x̃), y_i) + λ · CE(f(x̃), ȳ_j),     x̃ = (1 − λ)x_i + λ x̄_j,

averaged over the minibatch, CE against ȳ_j being the soft-label cross-entropy and λ =
``--fedmix_lambda`` (the paper's mixup ratio; 0.1 here). With λ = 0 both are CE(f(x_i), y_i):
FedAvg. Before the server holds other clients' means (round 0) the weight is 0 too. FedMix's
derivative term needs the gradient of the loss with respect to the input and its derivative
(double backpropagation): a local step costs about 2–3 FedAvg steps.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, RoundPackage
from flcore.flat import Net
from cli.flags import add_flag
from utils.seeding import torch_generator


def soft_cross_entropy(logits: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
    """Per-sample −Σ_c soft_c log softmax(logits)_c."""
    return -(soft * F.log_softmax(logits, dim=1)).sum(dim=1)


class FedMixClient(Client):
    """Local SGD on the FedMix (or NaiveMix) loss with the other clients' mean data."""
    hooks_draw_no_rng = True  # begin_round/end_round draw from their own seeded generators

    # The derivative term differentiates with respect to the input inside the loss (not vmapped);
    # the threaded engine runs the loss as it is.
    per_step_context = ("mix_x", "mix_y")

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--fedmix_lambda", type=float, default=0.1, low=0, high=1, help="FedMix: mixup ratio λ (0: FedAvg)")
        add_flag(parser, "--fedmix_mean_size", type=int, default=10, low=1,
                 help="FedMix: samples averaged into one shared mean (M)")
        add_flag(parser, "--fedmix_variant", type=str, default="fedmix", choices=["fedmix", "naive"],
                 help="FedMix's approximated global Mixup, or NaiveMix (Mixup with the received means)")

    def mean_batches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean inputs, mean one-hot labels) of consecutive groups of M samples in a seeded order;
        a client with fewer than M samples sends the mean of all of them."""
        n, size = self.num_train, max(1, min(self.hp.fedmix_mean_size, self.num_train))
        order = torch.randperm(n, generator=torch_generator(self.args.seed, "fedmix-means", self.cid))
        groups = order[: (n // size) * size].view(-1, size).to(self.data.train_y.device)
        x = self.data.inputs("train", groups.reshape(-1)).float()
        onehot = F.one_hot(self.data.train_y[groups.reshape(-1)], self.task.num_classes).to(x.dtype)
        return x.view(len(groups), size, *x.shape[1:]).mean(1), onehot.view(len(groups), size, -1).mean(1)

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        like = package.global_params
        batch, rows = self.batch_size, max(steps, 1)
        others = None
        if "mean_x" in package.static:
            others = package.static["mean_owner"] != self.index
        if others is None or not bool(others.any()) or steps == 0:
            shape = (rows, batch, *self.data.train_x.shape[1:])
            return {"mix_x": like.new_zeros(shape), "mix_y": like.new_zeros(rows, batch, self.task.num_classes),
                    "lam": like.new_zeros(())}
        mean_x, mean_y = package.static["mean_x"][others], package.static["mean_y"][others]
        draw = torch_generator(self.args.seed, "fedmix", package.round, self.cid)
        picks = torch.randint(len(mean_x), (steps * batch,), generator=draw).to(mean_x.device)
        return {"mix_x": mean_x[picks].view(steps, batch, *mean_x.shape[1:]),
                "mix_y": mean_y[picks].view(steps, batch, -1), "lam": like.new_tensor(self.hp.fedmix_lambda)}

    def local_loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        lam = ctx["lam"]
        mean_x, mean_y = ctx["mix_x"][: len(x)], ctx["mix_y"][: len(x)]
        if self.hp.fedmix_variant == "naive":
            out = net((1 - lam) * x + lam * mean_x)
            return ((1 - lam) * F.cross_entropy(out, y, reduction="none") + lam * soft_cross_entropy(out, mean_y)).mean()
        scaled = ((1 - lam) * x).requires_grad_(True)
        out = net(scaled)
        own = F.cross_entropy(out, y, reduction="none")
        (input_grad,) = torch.autograd.grad(own.sum(), scaled, create_graph=True)
        derivative = (input_grad * mean_x).flatten(1).sum(dim=1)
        return ((1 - lam) * own + lam * soft_cross_entropy(out, mean_y) + lam * derivative).mean()

    def end_round(self, params, package, ctx, steps, loss) -> ClientUpdate:
        update = super().end_round(params, package, ctx, steps, loss)
        if self.participations == 1:  # the first upload carries this client's means, once
            update.extras["mean_x"], update.extras["mean_y"] = self.mean_batches()
        return update
