"""FD client: federated distillation (Jeong et al., 2018, arXiv:1811.11479).

Each client keeps its whole model. During local training it averages its logit vectors per
label (over every minibatch of every epoch, as the paper's Algorithm 1 and PFLlib do) and uploads
those per-label mean logits, with their labels, instead of the model. The server sends back, per
label ℓ, the teacher logits F̂_ℓ (the other clients' mean logits, ``serverfd.py``), and the local
loss becomes

    CE(F(x), y) + λ · ψ(F(x), F̂_y),        λ = ``-lam`` (PFLlib: 1),

ψ the distillation term, over the samples whose label has a teacher (mean over the batch):

* ``--fd_target softmax`` (default): the cross-entropy of the model's prediction against the
  teacher's softmax, softmax(F̂_y) as a soft label (the paper's distillation regulariser with the
  teacher's output as the target; its gradient is that of KL(softmax(F̂_y) ‖ softmax(F(x)))).
* ``--fd_target pfllib``: PFLlib's term, ``nn.CrossEntropyLoss`` with the raw teacher logits
  taken as target probabilities, and, for a sample whose label has no teacher, the sample's own
  detached logits as the target (kept to compare with PFLlib; raw logits are no distribution).

With λ = 0 FD trains exactly like ``Local``.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, RoundPackage
from flcore.common.labelmeans import accumulate, start_sums, upload
from flcore.flat import Net
from cli.flags import add_flag


class FDClient(Client):
    """Cross-entropy plus λ times the distillation term towards the teacher logits of the label."""
    uploads_instead = "per-class mean logits"
    hooks_draw_no_rng = True  # begin_round/end_round: label sums and the package's teachers

    # The loss adds each minibatch's logits to this job's per-label sums in place: the threaded
    # engine may run it (the sums are the job's own), vmap may not.
    vmappable_loss = False

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-lam", "--lamda", type=float, default=1.0, low=0,
                 help="FD: weight λ of the distillation term (PFLlib: 1)")
        add_flag(parser, "--fd_target", type=str, default="softmax", choices=["softmax", "pfllib"],
                 help="FD's distillation target: the teacher logits' softmax (soft labels) or, as PFLlib, the raw "
                      "teacher logits as target probabilities")

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        x = package.global_params
        # never empty: the loss adds this round's per-label sums to this very dict
        ctx = {"lamda": x.new_tensor(self.hp.lamda)}
        ctx.update(start_sums(self.task.num_classes, self.task.num_classes, x))
        teacher = {**package.extras, **package.payload(self.index)}
        if "teacher_logits" in teacher:
            ctx.update(teacher_logits=teacher["teacher_logits"], teacher_present=teacher["teacher_present"])
        return ctx

    def local_loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = net(x)
        loss = F.cross_entropy(logits, y)
        accumulate(ctx, logits, y)
        if "teacher_logits" in ctx:
            has_teacher = ctx["teacher_present"][y]
            teacher = ctx["teacher_logits"][y]
            if self.hp.fd_target == "softmax":
                per_sample = -(F.softmax(teacher, dim=1) * F.log_softmax(logits, dim=1)).sum(dim=1)
                distill = torch.where(has_teacher, per_sample, 0.0).mean()
            else:
                distill = F.cross_entropy(logits, torch.where(has_teacher.unsqueeze(1), teacher, logits.detach()))
            loss = loss + ctx["lamda"] * distill
        return loss

    def end_round(self, params, package, ctx, steps, loss) -> ClientUpdate:
        return ClientUpdate(self.index, self.num_train, steps, params, loss,
                            extras=upload(ctx["class_sums"], ctx["class_seen"]), uploads_params=False)
