"""FedProto client (Tan et al., AAAI 2022, arXiv:2105.00243).

The client keeps its whole model; local training minimises (paper Eq. 5)

    CE(head(f(x)), y) + λ · MSE(f(x), C̄^(y)),

f = the body (the representation, ``net.features``), C̄^(y) the global prototype of class y the
server sent, λ = ``-lam`` (PFLlib's default 1). MSE is the mean over the batch and the feature
dimensions, as in the authors' code and PFLlib; a sample whose class has no global prototype
(round 0, or a class no uploader held) adds nothing to the sum but counts in the mean, as there.

The upload is the client's prototypes, C_i^(j) = the mean representation of its class-j samples
(Eq. 4), with |D_{i,j}| (its number of class-j training samples) for the server's weighting, and
no model weights. The mean is taken over the representations computed during local training
(every minibatch of every epoch, in train mode), as the authors' code and PFLlib do; it costs no
extra pass over the data. With λ = 0 FedProto trains exactly like ``Local``.
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


class FedProtoClient(Client):
    """Cross-entropy plus λ·MSE between the representations and their class's global prototype."""
    uploads_instead = "class prototypes"
    hooks_draw_no_rng = True  # begin_round/end_round: the package's prototypes, class means

    # The loss adds each minibatch's representations to this job's per-class sums in place: the
    # threaded engine may run it (the sums are the job's own), vmap may not.
    vmappable_loss = False

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-lam", "--lamda", type=float, default=1.0, low=0,
                 help="FedProto: weight λ of the distance to the global prototypes (PFLlib: 1)")

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        # never empty: the loss adds this round's per-class sums to this very dict
        ctx = {"lamda": package.global_params.new_tensor(self.hp.lamda)}
        prototypes = package.extras.get("global_prototypes")
        if prototypes is not None:
            ctx.update(global_prototypes=prototypes, global_present=package.extras["global_present"])
        return ctx

    def local_loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        z = net.features(x)
        loss = F.cross_entropy(net.head(z), y)
        if "class_sums" not in ctx:  # the representation's size is known at the first step
            ctx.update(start_sums(self.task.num_classes, z.flatten(1).shape[1], z))
        accumulate(ctx, z, y)
        if "global_prototypes" in ctx:
            flat = z.flatten(1)
            target = torch.where(ctx["global_present"][y].unsqueeze(1), ctx["global_prototypes"][y], flat.detach())
            loss = loss + ctx["lamda"] * F.mse_loss(flat, target)
        return loss

    def end_round(self, params, package, ctx, steps, loss) -> ClientUpdate:
        return ClientUpdate(self.index, self.num_train, steps, params, loss,
                            extras=class_mean_upload(self, ctx), uploads_params=False)


def class_mean_upload(client: Client, ctx: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The per-class means collected in ``ctx`` this round, with the client's class counts; no
    class at all when it took no step."""
    if "class_sums" not in ctx:
        return {}
    counts = torch.bincount(client.data.train_y, minlength=client.task.num_classes)
    return upload(ctx["class_sums"], ctx["class_seen"], counts.to(ctx["class_sums"].device))
