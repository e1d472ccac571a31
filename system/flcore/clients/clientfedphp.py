"""FedPHP client (Li, Zhan, Shao, Li, Song, "FedPHP: Federated Personalization with Inherited Private
Models", ECML-PKDD 2021).

Each client keeps an inherited private model (HPM) p_i, a temporal ensemble of its personalised
models (state ``inherited``). In a round it trains the received global model w with

    loss = (1 − λ)·CE(w; x, y) + λ·MMD(z_w(x), z_p(x)),        λ = ``-lam``

(z = the body's output; z_p is a constant, the HPM supervises), uploads w for FedAvg, and then
updates the HPM by the moving average

    p_i ← (1 − μ_t)·w + μ_t·p_i,   μ_t = μ·t/T              (μ = ``-mu``, t the round, T = ``-gr``)

so early HPMs follow the latest personalised model and later ones keep more of their history.
MMD is PFLlib's: the biased estimate mean(K(z, z) + K(z_p, z_p) − 2K(z, z_p)) over the minibatch
with the sum of RBF kernels exp(−‖a − b‖²/(2s)), s ∈ {10, 15, 20, 50}.

Deliberate choices:
* defaults: PFLlib's ``-lam 1`` gives CE the weight 0 (training only matches the HPM's
  features) and ``-mu 0`` makes the HPM the last local model (no ensembling); both switch the
  method off, so the defaults here are λ = 0.5 and μ = 0.9 (warnings name PFLlib's values);
* the HPM of a client's first participation is the global model it receives (PFLlib: the common
  initial model, the same for clients selected in round 0);
* ``--fedphp_eval local`` (default): a client is evaluated with its latest personalised model,
  the w it trained in its last participation (PFLlib evaluates the trained w of the round's
  cohort and the global model for everyone else); ``inherited`` evaluates the HPM instead. The
  global model is evaluated for clients never selected;
* the moving average covers float buffers (BatchNorm statistics) too; PFLlib mixes parameters.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, RoundPackage
from flcore.flat import Net
from cli.flags import add_flag

KERNEL_SCALES = (10.0, 15.0, 20.0, 50.0)  # PFLlib's RBF bandwidths


def mmd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Biased MMD² estimate between the rows of ``a`` and ``b`` with the sum of RBF kernels."""
    a, b = a.flatten(1), b.flatten(1)

    def squared_distances(u, v):
        return (u * u).sum(1)[:, None] + (v * v).sum(1)[None, :] - 2.0 * u @ v.T

    daa, dbb, dab = squared_distances(a, a), squared_distances(b, b), squared_distances(a, b)
    total = 0.0
    for s in KERNEL_SCALES:
        total = total + torch.exp(-0.5 * daa / s) + torch.exp(-0.5 * dbb / s) - 2.0 * torch.exp(-0.5 * dab / s)
    return total.mean()


class FedPHPClient(Client):
    """Local SGD on (1 − λ)·CE + λ·MMD to the HPM; the HPM's moving average after training."""
    hooks_draw_no_rng = True  # begin_round/end_round read and write the state store

    vmappable_loss = True

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-lam", "--lamda", type=float, default=0.5, low=0, high=1,
                 help="λ of (1 − λ)·CE + λ·MMD(features, HPM features) (PFLlib default 1: no CE)")
        add_flag(parser, "-mu", "--mu", type=float, default=0.9, low=0, high=1,
                 help="μ of the HPM's moving average weight μ_t = μ·t/T (PFLlib default 0: no ensembling)")
        add_flag(parser, "--fedphp_eval", type=str, default="local", choices=["local", "inherited"],
                 help="evaluated model: the last personalised (trained) model, or the HPM")

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        anchor = package.global_params
        return {"inherited": self.state.get("inherited", self.index, init=anchor.clone)}

    def local_loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        lam = self.hp.lamda
        z = net.features(x)
        inherited = net.at(ctx["inherited"]).features(x).detach()
        return (1.0 - lam) * F.cross_entropy(net.head(z), y) + lam * mmd(z, inherited)

    def end_round(self, params, package: RoundPackage, ctx, steps, loss) -> ClientUpdate:
        weight = self.hp.mu * package.round / max(int(self.args.global_rounds), 1)
        self.state.set("inherited", self.index, (1.0 - weight) * params + weight * ctx["inherited"])
        if self.hp.fedphp_eval == "local":
            self.state.set("personalised", self.index, params)
        return super().end_round(params, package, ctx, steps, loss)
