"""FedGen client (Zhu, Hong, Zhou, ICML 2021, arXiv:2105.10056), Eq. 5.

The local objective adds, on features the server's generator produces for labels drawn from the
label distribution p̂(y) it sent,

    CE(net(x), y) + α · CE(h(G(ε | ŷ)), ŷ),        α = ``--fedgen_alpha`` (1, as in PFLlib),

so the head learns the other clients' decision regions without their data. The generated batch
of every local step (``-lbs`` labels and their features) is drawn up front in ``begin_round``
from (seed, round, client) and handed to the loss step by step (``per_step_context``), which
keeps the loss a pure tensor function: the threaded and batched engines run it and give the
sequential numbers. Without a trained generator (round 0), or with ``--fedgen_alpha 0``, the term is
zero and is not computed at all. Each upload carries
the client's label counts, which the server's generator training needs (paper, Alg. 1).
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch
import torch.nn.functional as F
from torch.func import functional_call

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, RoundPackage
from cli.flags import add_flag
from utils.seeding import torch_generator


class FedGenClient(Client):
    """Cross-entropy plus the generated-feature term on the head."""
    hooks_draw_no_rng = True  # begin_round draws from its own (seed, round, client) generator

    vmappable_loss = True
    per_step_context = ("gen_features", "gen_labels")
    #: the server's FlatModel of the generator (architecture), set by the server in ``setup``
    generator = None
    settable = (*Client.settable, "generator")

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--fedgen_alpha", type=float, default=1.0, low=0,
                 help="FedGen: weight of the generated-feature loss on the head (PFLlib: 1)")

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        x = package.global_params
        batch = self.batch_size
        weights = package.extras.get("generator")
        if weights is None or not self.hp.fedgen_alpha:
            return {}  # no trained generator yet (round 0), or α = 0: the term is zero, so it is not computed
        if steps == 0:  # nothing to train, but the same context keys as the cohort's other clients
            dim = self.generator.module.out.out_features
            return {"gen_features": x.new_zeros(1, batch, dim),
                    "gen_labels": torch.zeros(1, batch, dtype=torch.long, device=x.device),
                    "gen_weight": x.new_zeros(())}
        draw = torch_generator(self.args.seed, "fedgen-client", package.round, self.cid)
        prior = package.extras["label_prior"].cpu()
        labels = torch.multinomial(prior, steps * batch, replacement=True, generator=draw).to(x.device)
        gen = self.generator.module
        with torch.no_grad():
            named = self.generator.unflatten(weights, params_only=False)
            noise = gen.draw_noise(steps * batch, draw, x.device)
            features = functional_call(gen, named, (noise, labels))
        return {"gen_features": features.view(steps, batch, -1), "gen_labels": labels.view(steps, batch),
                "gen_weight": x.new_tensor(float(self.hp.fedgen_alpha))}

    def local_loss(self, net, x, y, ctx):
        if "gen_features" not in ctx:  # the same in every client of a round, so never a per-client branch
            return F.cross_entropy(net(x), y)
        generated = F.cross_entropy(net.head(ctx["gen_features"]), ctx["gen_labels"])
        return F.cross_entropy(net(x), y) + ctx["gen_weight"] * generated

    def end_round(self, params, package, ctx, steps, loss) -> ClientUpdate:
        update = super().end_round(params, package, ctx, steps, loss)
        update.extras["label_counts"] = torch.bincount(self.data.train_y, minlength=self.task.num_classes).float()
        return update
