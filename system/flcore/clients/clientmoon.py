"""MOON client: model-contrastive FL (Li, He, Song, CVPR 2021, arXiv:2103.16257).

With z = R_w(x) the representation of the model being trained, z_glob that of the received global
model w^t and z_prev that of this client's previous local model w_i^{t-1}, the local loss is

    ℓ = CE(w; x, y) + μ · ℓ_con,
    ℓ_con = −log( exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) ),

sim = cosine similarity, averaged over the minibatch; z_glob and z_prev are constants (no
gradient). The representation is the body's output (``net.features``), as in PFLlib; the paper's
networks add a projection head, which our models do not have.

w_i^{t-1} is the model this client trained in its last participation (the state ``previous``;
under partial participation, its last trained model, as in the paper's code and PFLlib). Before a
client's first participation there is no previous model:

* ``--moon_first_previous none`` (default): the contrastive term is left out (weight 0) until the
  client has a previous model; the authors' code has none in its first round either (its pool
  of previous models is empty there, which makes the term 0);
* ``initial`` (PFLlib, whose ``old_model`` starts as the initial model): the common initial model
  is the previous model, so a client first selected in a later round is pushed away from it.

The loss is a pure tensor function (the missing previous model is a 0/1 weight, not a branch), so
the batched engine runs it. With ``-mu 0`` (PFLlib's default, which the server warns is FedAvg) the
term would be weighted 0 everywhere: the client then skips its two extra forward passes and keeps
no previous models (one model-sized vector per client), and its updates are FedAvg's bit for bit.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, RoundPackage
from flcore.flat import Net
from cli.flags import add_flag


def model_contrastive_loss(z: torch.Tensor, z_global: torch.Tensor, z_previous: torch.Tensor,
                           tau: float) -> torch.Tensor:
    """Mean over the batch of −log softmax([sim(z, z_glob), sim(z, z_prev)] / τ)[0]."""
    z, z_global, z_previous = z.flatten(1), z_global.flatten(1), z_previous.flatten(1)
    sims = torch.stack([F.cosine_similarity(z, z_global, dim=-1), F.cosine_similarity(z, z_previous, dim=-1)], -1)
    return -torch.log_softmax(sims / tau, dim=-1)[:, 0].mean()


class MoonClient(Client):
    """Local SGD on cross-entropy plus μ times the model-contrastive loss."""
    hooks_draw_no_rng = True  # begin_round/end_round read and write the state store

    vmappable_loss = True

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-mu", "--mu", type=float, default=0.0, low=0,
                 help="MOON weight μ of the contrastive loss (PFLlib default 0 = FedAvg; paper {0.1, 1, 5, 10})")
        add_flag(parser, "-tau", "--tau", type=float, default=1.0, above=0,
                 help="MOON temperature τ of the contrastive loss (PFLlib default 1.0; paper 0.5)")
        add_flag(parser, "--moon_first_previous", type=str, default="none", choices=["none", "initial"],
                 help="previous model before a client's first participation: none (no contrastive term, "
                      "authors' code) or the initial model (PFLlib)")

    def contrastive(self) -> bool:
        """Whether the contrastive term can count at all (μ > 0)."""
        return self.hp.mu > 0.0

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        if not self.contrastive():
            return {}
        anchor = package.global_params
        previous = self.state.get("previous", self.index)
        weight = self.hp.mu if previous is not None else 0.0
        return {
            "global": anchor,
            # without a previous model its stand-in is never weighted in (weight 0)
            "previous": anchor if previous is None else previous.to(anchor.device),
            "weight": torch.tensor(weight, dtype=anchor.dtype, device=anchor.device),
        }

    def local_loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        z = net.features(x)
        if not self.contrastive():  # μ = 0: CE + 0 · ℓ_con is CE exactly, without ℓ_con's two forward passes
            return F.cross_entropy(net.head(z), y)
        contrastive = model_contrastive_loss(
            z, net.at(ctx["global"]).features(x), net.at(ctx["previous"]).features(x), self.hp.tau)
        return F.cross_entropy(net.head(z), y) + ctx["weight"] * contrastive

    def end_round(
        self, params: torch.Tensor, package: RoundPackage, ctx: dict[str, torch.Tensor], steps: int, loss: float
    ) -> ClientUpdate:
        if self.contrastive():
            self.state.set("previous", self.index, params)
        return super().end_round(params, package, ctx, steps, loss)
