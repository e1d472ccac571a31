"""FedPCL client (Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, NeurIPS 2022, "Federated Learning from
Pre-Trained Models: A Contrastive Learning Approach", arXiv:2209.10083), PFLlib's variant.

The paper trains a small projection network on top of frozen pre-trained backbones; PFLlib, and
this platform, train the model's own body (``net.features``) from scratch instead, with no
pre-trained backbone, and never use the head. Each client keeps its whole model.

With r̂ = f(x)/‖f(x)‖ the normalised representation, τ = ``-tau`` (PFLlib: 1), the global
prototypes G and the set of client prototypes P_1..P_N the server sent, the local loss is

    L_g + L_p,   L_g = CE(r̂ Gᵀ / τ, y),   L_p = (1/N) Σ_j CE(r̂ P_jᵀ / τ, y),

prototype-wise contrastive learning against the global and every client's prototypes (its own too); as in
PFLlib, P_j is client j's latest prototypes with the global prototype in place of the classes it
lacks, and a client that never uploaded counts with G itself (N comes with the package). Only
classes with a global prototype are candidates, and a sample whose class has none is left out
(PFLlib would index the wrong prototype there).

After training, the client's prototypes are the class means of r̂ under the trained model (eval
mode, one pass over its training data), uploaded with their labels; no weights travel.
Before the first prototypes exist (round 0) there is nothing to learn against: clients only
compute their prototypes (an empty plan; PFLlib skips training in each client's first
participation instead). The prototype pass is the client's ``post_training`` (it gets the trained
working model), so the base training sequence stays and every engine trains these clients (the
batched one vectorises the contrastive steps).
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, LocalJob, RoundPackage
from flcore.common.labelmeans import body_class_sums, upload
from flcore.flat import FlatModel, Net
from cli.flags import add_flag


class FedPCLClient(Client):
    """Contrastive loss against global and client prototypes; uploads normalised class means."""
    uploads_instead = "class prototypes"

    #: the contrastive loss is a pure tensor function: the batched engine vectorises the steps
    vmappable_loss = True

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-tau", "--tau", type=float, default=1.0, above=0,
                 help="FedPCL: temperature τ of the prototype contrastive loss (PFLlib: 1)")

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        extras = package.extras
        if "global_prototypes" not in extras:
            return {}
        global_protos, present = extras["global_prototypes"], extras["global_present"]
        # every uploader's prototypes, with the global one where it lacks a class
        padded = torch.where(extras["client_held"].unsqueeze(2), extras["client_prototypes"], global_protos)
        return {"global_prototypes": global_protos, "global_present": present, "client_prototypes": padded,
                "clients": extras["num_clients"].to(global_protos.dtype).reshape(())}

    def local_loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        r = F.normalize(net.features(x).flatten(1), dim=1)
        present = ctx["global_present"]
        keep = present[y].to(r.dtype)
        weight = keep / keep.sum().clamp_min(1)  # the mean over the samples whose class has a prototype
        # a left-out sample gets a class that has a prototype as its (weight 0) target: a finite loss
        target = torch.where(keep > 0, y, torch.argmax(present.to(torch.int8)))

        def contrastive(prototypes: torch.Tensor) -> torch.Tensor:
            """Σ_b weight_b · CE(r̂_b Pᵀ/τ, y_b) for each prototype set of ``prototypes`` ([K, C, d])."""
            logits = torch.einsum("bd,kcd->kbc", r, prototypes) / self.hp.tau
            logits = logits.masked_fill(~present, float("-inf"))  # only classes that have a prototype
            targets = target.repeat(len(prototypes))
            per_sample = F.cross_entropy(logits.flatten(0, 1), targets, reduction="none").reshape(len(prototypes), -1)
            return (per_sample * weight).sum(-1)

        global_term = contrastive(ctx["global_prototypes"].unsqueeze(0))[0]
        uploaders = ctx["client_prototypes"]
        client_sum = contrastive(uploaders).sum() + (ctx["clients"] - len(uploaders)) * global_term
        return global_term + client_sum / ctx["clients"]

    def plan_job(self, package: RoundPackage) -> LocalJob:
        job = super().plan_job(package)
        if "global_prototypes" not in package.extras:  # nothing to learn against yet: only the prototypes
            job.plan = []
        return job

    def post_training(self, job: LocalJob, model: FlatModel) -> None:
        job.ctx["class_sums"], job.ctx["class_seen"] = body_class_sums(self, model, normalise=True)

    def end_round(self, params, package, ctx, steps, loss) -> ClientUpdate:
        sent = upload(ctx["class_sums"], ctx["class_seen"])  # the prototypes and their labels only
        return ClientUpdate(self.index, self.num_train, steps, params, loss, extras=sent, uploads_params=False)
