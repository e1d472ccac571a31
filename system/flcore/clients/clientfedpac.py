"""FedPAC client (Xu, Tong, Huang, ICLR 2023, "Personalized Federated Learning with Feature
Alignment and Classifier Collaboration", arXiv:2306.11867).

In round t, with the global feature extractor (body) and its personal classifier (head) received,
the client

1. computes the statistics of the classifier-collaboration QP with the received body (before
   training, as the paper and PFLlib do): its label distribution p(k), class means μ_k of the
   representations, H = [p(k)·μ_k]_k (C x d) and V = (Σ_k p(k)·E_k‖f‖² − Σ_k p(k)²‖μ_k‖²) / n;
2. trains the head for one epoch with the body frozen (cross-entropy);
3. trains the body for E epochs with the head frozen, aligning its features to the global class
   centroids c_y the server sent: CE + λ·MSE(f(x), c_y) (λ = ``-lam``; MSE as FedProto's, zero for
   classes without a centroid);
4. computes its class centroids with the trained body (eval mode, one pass).

It uploads the body (the shared part), and as named tensors its head, V, H and its centroids
with labels and sample counts. Steps 1-2 are the client's ``pre_training`` and step 4 its
``post_training`` on the working model, around the base SGD of step 3 (whose ``adjust_grad``
keeps the head fixed), so every engine trains these clients (the batched one vectorises step 3).
It costs one epoch of gradients more than FedAvg, plus two forward passes.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, LocalJob
from flcore.common.labelmeans import body_class_sums, class_means, upload
from flcore.flat import FlatModel, Net
from cli.flags import add_flag


class FedPACClient(Client):
    """Head epoch, then aligned body epochs; uploads body, head, QP statistics and centroids."""

    #: the alignment loss is a pure tensor function: the batched engine vectorises the body epochs
    vmappable_loss = True

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-lam", "--lamda", type=float, default=1.0, low=0,
                 help="FedPAC: weight λ of the feature alignment to the global centroids (PFLlib: 1)")

    def expected_gradient_samples(self) -> float:
        return super().expected_gradient_samples() * (self.local_epochs + 1) / max(self.local_epochs, 1)

    def local_loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        z = net.features(x)
        loss = F.cross_entropy(net.head(z), y)
        if "centroids" in ctx:
            flat = z.flatten(1)
            target = torch.where(ctx["centroid_present"][y].unsqueeze(1), ctx["centroids"][y], flat.detach())
            loss = loss + self.hp.lamda * F.mse_loss(flat, target)
        return loss

    def begin_round(self, package, steps):
        ctx = {"shared": package.shared}  # the body: what the SGD of step 3 trains
        if "centroids" in package.extras:
            ctx.update(centroids=package.extras["centroids"], centroid_present=package.extras["centroid_present"])
        return ctx

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.where(ctx["shared"][: g.shape[-1]], g, 0.0)  # the head stays as step 2 left it

    def pre_training(self, job: LocalJob, model: FlatModel) -> None:
        """Steps 1 and 2: the combined head the server formed for this client, the QP's statistics,
        one epoch of the head."""
        head = ~job.package.shared
        combined = job.package.payload(self.index).get("head")
        if combined is not None:
            start = job.start.clone()
            start[head] = combined
            model.load(start)
        job.ctx["V"], job.ctx["H"] = self.statistics(model)
        rnd = job.package.round
        self.head_epoch(model, self.batch_plan(rnd, epochs=1, purpose="fedpac-head"), job.lr)

    def post_training(self, job: LocalJob, model: FlatModel) -> None:
        job.ctx["class_sums"], job.ctx["class_seen"] = body_class_sums(self, model)

    def head_epoch(self, model: FlatModel, plan: list, lr: float) -> None:
        """SGD over ``plan`` on the cross-entropy changing only the head. The body is frozen, so its
        features are computed without a graph and only the head's parameters (views of the model's
        vector) are differentiated, zeroed and stepped: a backward pass through the body, and
        masking the whole vector each step, were most of this epoch's cost."""
        module = model.module
        module.train()
        head = [p for p in module.head.parameters() if p.requires_grad]
        for idx in plan:
            self.count_gradient_samples(idx)
            for p in head:
                p.grad.zero_()
            with torch.no_grad():
                z = module.body(self.data.inputs("train", idx))
            F.cross_entropy(module.head(z), self.data.train_y[idx]).backward(inputs=head)
            with torch.no_grad():
                for p in head:
                    p.sub_(p.grad, alpha=lr)

    def statistics(self, model: FlatModel) -> tuple[torch.Tensor, torch.Tensor]:
        """(V, H) of the QP with the model as received (see the module docstring)."""
        module = model.module
        was_training = module.training
        module.eval()
        batch = int(self.args.eval_batch_size)
        sums = squares = seen = None
        with torch.no_grad():
            for i in range(0, self.num_train, batch):
                z = module.body(self.data.inputs("train", slice(i, i + batch))).flatten(1).double()
                y = self.data.train_y[i : i + batch]
                part = class_means(z, y, self.task.num_classes)
                norms = z.new_zeros(self.task.num_classes).index_add_(0, y, z.pow(2).sum(1))
                sums = part[0] if sums is None else sums + part[0]
                seen = part[1] if seen is None else seen + part[1]
                squares = norms if squares is None else squares + norms
        module.train(was_training)
        p = seen / seen.sum()
        mu = sums / seen.clamp_min(1).unsqueeze(1)
        v = (p * squares / seen.clamp_min(1)).sum() - (p.pow(2) * mu.pow(2).sum(1)).sum()
        return (v / self.num_train).reshape(1).float(), (p.unsqueeze(1) * mu).float()

    def end_round(self, params, package, ctx, steps, loss) -> ClientUpdate:
        counts = torch.bincount(self.data.train_y, minlength=self.task.num_classes)
        extras = upload(ctx["class_sums"], ctx["class_seen"], counts.to(ctx["class_sums"].device))
        extras.update(head=params[~package.shared], V=ctx["V"], H=ctx["H"])
        return ClientUpdate(self.index, self.num_train, steps, params, loss, extras=extras)
