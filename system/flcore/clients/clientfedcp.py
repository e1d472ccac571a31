"""FedCP client (Zhang, Hua, Wang, Song, Xue, Ma, Guan, "FedCP: Separating Feature Information for
Personalized Federated Learning via Conditional Policy", KDD 2023, arXiv:2307.01217): PFLlib's
``-algo FedCP``.

The model (:class:`FedCPModel`, built by the server) is the platform's body (feature extractor,
shared), head W_i (the personalised head, kept by the client), a global head W^g (shared, frozen
during local training) and the conditional policy network CPN Θ (shared: Linear(D, 2D) →
LayerNorm → ReLU). For a sample with features h = body(x):

    v_i = normalise(Σ_rows W_i)            client-specific, from the personalised head at the
                                            round's start, fixed while the client trains
    (l^P, l^G) = CPN(h ⊙ v_i)              two logits per feature
    s = softmax over {P, G} of (l + Gumbel noise) / τ   = sigmoid((l^P − l^G + L) / τ),
                                            L ~ Logistic(0, 1) (the difference of two Gumbels), τ = 1
    out = W_i(s ⊙ h) + W^g((1 − s) ⊙ h)    personalised and global feature information

and every local step takes SGD (learning rate ``-lr``) on the body, W_i and Θ (not W^g) for

    CE(out, y) + λ · MMD²(h, h^g),          λ = ``-lam``,

h^g the features of the received (frozen) global body, MMD² the biased estimate over the
minibatch with the kernel Σ_σ exp(−‖a − b‖² / (2σ)), σ ∈ {10, 15, 20, 50} (the authors' code;
FedPHP's ``mmd``).
The noise is drawn per step from (seed, round, client) before training (``per_step_context``:
steps × B × D numbers a client and round, 1.2 MB for the MNIST CNN's 60 steps), so every engine
draws the same. The upload carries the body, Θ and, in the global head's place,
m·W_i + (1 − m)·W^g (m = ``--fedcp_head_mix``); the server averages them all sample-weighted, so
the new global head is the weighted mean of these (``serverfedcp.py``). W_i is the client's
private part, never overwritten by the server; note that it reaches the server through that
mixture by the method's design (the server knows W^g, so m > 0 reveals W_i). The client is evaluated with its W_i, v_i from it, and the noise-free policy
(L = 0).

Choices where PFLlib (the authors' code) departs from the paper or leaves a gap:

* ``--fedcp_head_mix 0.5`` (default) is PFLlib's upload ½W_i + ½W^g; ``1`` uploads W_i itself,
  as the paper's overview draws it (the personalised heads are uploaded and aggregated).
* PFLlib sends the new global head and CPN only to the round's clients, after training; here every
  package carries the current ones, so a client is never trained with a stale Θ or W^g.
* v_i before a client's first round comes from the initial head (PFLlib: a uniform random vector).
* PFLlib also draws the Gumbel noise at evaluation, so its accuracy is random; the noise-free
  policy is evaluated here.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import ClassVar

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedphp import mmd  # the authors' MMD², as FedPHP uses it
from flcore.flat import Net
from flcore.trainmodel.fedcp import FedCPLayout, personal_condition
from cli.flags import add_flag
from utils.seeding import torch_generator

class FedCPClient(Client):
    """SGD on the split-feature output plus λ·MMD² to the global body's features."""
    hooks_draw_no_rng = True  # begin_round's noise comes from its own (seed, round, client) generator

    vmappable_loss: ClassVar[bool] = True
    per_step_context: ClassVar[tuple[str, ...]] = ("fedcp_noise",)
    settable: ClassVar[tuple[str, ...]] = (*Client.settable, "fedcp_layout")
    fedcp_layout: FedCPLayout | None = None

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-lam", "--lamda", type=float, default=1.0, low=0,
                 help="FedCP: λ of the MMD² between the local and the global body's features (PFLlib default 1; "
                      "authors: 5 on MNIST)")
        add_flag(parser, "--fedcp_head_mix", type=float, default=0.5, low=0, high=1,
                 help="FedCP: m of the head uploaded for the global head, m·W_i + (1 − m)·W^g (PFLlib 0.5; "
                      "1 = the personalised head, the paper's overview)")

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        layout, params = self.fedcp_layout, package.global_params
        start = self.with_private(params, package)  # the personalised head this round starts from
        a = layout.head[0]
        condition = personal_condition(start[a : a + layout.classes * layout.dim].view(layout.classes, layout.dim))
        draw = torch_generator(self.args.seed, "fedcp-policy", package.round, self.cid)
        uniform = torch.rand(max(steps, 1), self.batch_size, layout.dim, generator=draw, dtype=params.dtype)
        return {"global": params, "condition": condition, "fedcp_noise": torch.logit(uniform, eps=1e-6).to(params.device)}

    def local_loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        h = net.features(x)
        share = net.part("policy", h * ctx["condition"], ctx["fedcp_noise"][: x.shape[0]])
        out = net.head(h * share) + net.part("global_head", h * (1 - share))
        return F.cross_entropy(out, y) + self.hp.lamda * mmd(h, net.at(ctx["global"]).features(x))

    def end_round(self, params, package: RoundPackage, ctx, steps, loss) -> ClientUpdate:
        update = super().end_round(params, package, ctx, steps, loss)
        (a, b), (c, d), mix = self.fedcp_layout.head, self.fedcp_layout.global_head, self.hp.fedcp_head_mix
        upload = params.clone()
        upload[c:d] = mix * params[a:b] + (1 - mix) * params[c:d]
        update.params = upload
        return update
