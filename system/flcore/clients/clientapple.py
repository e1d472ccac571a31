"""APPLE client (Luo & Wu, "Adapt to Adaptation: Learning Personalization for Cross-Silo Federated
Learning", IJCAI 2022, arXiv:2110.08394).

Every client i owns a core model c_i (uploaded) and a directed relationship (DR) vector p_i over
all N clients' core models (state ``apple_p``, 1/N each at first, as in PFLlib). Its personalised
model is w̃_i = Σ_j p_ij c_j. In a round it receives every core model (``extras["apple_cores"]``,
N models, counted in ``rs_bytes_down``) and, on each local minibatch, with g = ∇L(w̃_i) (the
gradient at the current w̃_i; the other cores are fixed during the round):

    c_i  ← c_i − η_c · p_ii · g                                        (∂w̃_i/∂c_i = p_ii)
    p_ij ← p_ij − η_p · (⟨g, c_j⟩ + λ(t) · μ · (p_ij − p0_j))   for every j

with η_p = ``-dlr``, μ = ``-mu``, p0_j = n_j / n (the clients' sample shares, ``extras["apple_p0"]``)
and the proximal schedule λ(t) = (cos(π t / L) + 1) / 2 for rounds t < L = ``-L``·``-gr``, then 0:
the DR vectors start near p0 and are free later. The core model is uploaded; w̃_i after the last
step is the client's personalised model (state ``personal``), which it is evaluated with.

Deliberate choices where PFLlib differs (flags choose):
* ``--apple_core_lr_scale`` (default False: the paper and the authors' code, whose core is a
  parameter of the mixed model trained by autograd at their ``--lr_net``, so its step is η·p_ii·g):
  η_c = η (``-lr``). True is PFLlib's η_c = N·η, which offsets p_ii ≈ 1/N (see below for why it is
  not the default);
* ``--apple_p_grad inner`` (default, the paper's chain rule) uses ⟨g, c_j⟩ over the trainable
  parameters; ``pfllib`` uses PFLlib's mean over parameter tensors of mean(g ⊙ c_j);
* λ(t) uses the current round t (PFLlib computes it after round t and applies it in round t+1);
* PFLlib uploads, as the client's next core, the personalised model (its ``model_c`` copy of
  ``self.model``, the mixture of its last step), which discards the core's own updates; the core
  here keeps them, as in the paper and the authors' code;
* PFLlib's clients do not train from the cores of the round's start. Its server hands every client
  the same list of the clients' live ``model_c`` objects, so client i's core updates land in the
  object the later clients of the round mix (its "recover model_cs[id] for other clients" copy is
  a copy of that object onto itself). Client k of a round therefore trains on the cores of clients
  0..k-1 as trained this round: sequential SGD over all clients' data with the mixture moving η/N a
  step (with N·η and p = 1/N), not N parallel local trainings. The authors' code trains every client
  from the previous round's cores. Here a round is parallel, as in the paper; no flag reproduces the
  aliasing (it is a simulation artefact a real deployment cannot have);
* the mixtures cover float buffers (BatchNorm statistics) as well.

With ``-dlr 0`` (PFLlib's default) every p_ij stays 1/N, so every personalised model is the mean of
the cores, and with parallel clients one round moves that mean by (η_c/N²)·Σ_i Σ_t g_i, the
gradients taken at points that move only η_c/N² a step. At PFLlib's η_c = N·η that is one
full-batch gradient step of size η·K for K local steps: on the whole MNIST Dir 0.1 partition
(K ≈ 260, η = 0.005) ours went 87% → 29% in 10 rounds. PFLlib's sequential aliasing above is what
keeps the same rate stable there (94.5%, near Local, although every model is the mean of the cores).
At the paper's η_c = η the step is η·K/N and the run climbs every round, to 81.9 ± 1.5% (3 seeds),
as does PFLlib with its aliasing removed (each client its own copies of the cores: 82.1%)
(docs/results/algorithms.md, "GPFL's conditions and APPLE's core rate").
"""
from __future__ import annotations

import math
from argparse import ArgumentParser
from typing import ClassVar

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, LocalJob, RoundPackage
from flcore.flat import FlatModel
from cli.flags import add_flag


def proximal_weight(rnd: int, horizon: int) -> float:
    """λ(t) = (cos(π t / L) + 1) / 2 while t < L, then 0."""
    return (math.cos(math.pi * rnd / horizon) + 1.0) / 2.0 if rnd < horizon else 0.0


def double_scratch(cores: torch.Tensor, p_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The trainable part (first ``p_len`` entries) of the rows of ``cores`` in float64, and empty
    float64 buffers for a gradient (``p_len``) and one core (1 x ``p_len``)."""
    like = torch.empty(0, dtype=torch.float64, device=cores.device)
    return cores[:, :p_len].double(), like.new_empty(p_len), like.new_empty(1, p_len)


class APPLEClient(Client):
    """SGD on the personalised mixture, updating the own core model and the DR vector."""

    vectorisable: ClassVar[bool] = False

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-dlr", "--dr_learning_rate", type=float, default=0.0, low=0,
                 help="η_p, learning rate of the DR vector p_i (PFLlib default 0: p_i stays 1/N)")
        add_flag(parser, "-L", "--L", type=float, default=1.0, low=0,
                 help="the proximal weight λ(t) decays over the first L·gr rounds (cosine), then 0")
        add_flag(parser, "-mu", "--mu", type=float, default=0.0, low=0,
                 help="μ of the DR vector's proximal term λ(t)·μ/2·‖p_i − p0‖² (PFLlib default 0: none)")
        add_flag(parser, "--apple_core_lr_scale", type=bool, default=False,
                 help="the core model's learning rate is lr (paper, authors' code); True: N·lr (PFLlib, stable "
                      "there only because its clients train one after another on shared cores)")
        add_flag(parser, "--apple_p_grad", type=str, default="inner", choices=["inner", "pfllib"],
                 help="∂L/∂p_ij: ⟨g, c_j⟩ (paper) or PFLlib's mean over tensors of mean(g ⊙ c_j)")

    def dr_gradient(self, g: torch.Tensor, cores: torch.Tensor, own: torch.Tensor, model: FlatModel,
                    scratch: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """∂L/∂p_ij for every j, with the own core ``own`` as it is now in place of ``cores[i]`` (whole
        vectors; only the trainable part counts). With ``inner``, ``scratch`` is the round's float64
        (trainable part of ``cores``, gradient buffer, own-core buffer), reused on every step."""
        if self.hp.apple_p_grad == "inner":
            cores64, g64, own64 = scratch or double_scratch(cores, g.shape[0])
            g64.copy_(g)
            own64.copy_(own[None, : g.shape[0]])
            grad = cores64 @ g64
            grad[self.index] = (own64 @ g64)[0]
            return grad

        def mean_products(rows: torch.Tensor) -> torch.Tensor:
            means = [(rows[:, seg.start:seg.stop] * g[seg.start:seg.stop]).double().mean(dim=1)
                     for seg in model.param_segments()]
            return torch.stack(means).mean(dim=0)

        grad = mean_products(cores)
        grad[self.index] = mean_products(own[None])[0]
        return grad

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        package, lr, i, p_len = job.package, job.lr, self.index, model.num_params
        cores, p0 = package.extras["apple_cores"], package.extras["apple_p0"]
        n = cores.shape[0]
        dr = self.state.get("apple_p", i, init=lambda: torch.full((n,), 1.0 / n, dtype=torch.float64)).clone()
        own = cores[i].clone()
        core_lr = lr * (n if self.hp.apple_core_lr_scale else 1)
        horizon = int(self.hp.L * int(self.args.global_rounds))
        prox = proximal_weight(package.round, horizon) * self.hp.mu

        # With -dlr 0 the DR vector cannot move: Σ_j p_ij c_j over the received cores is the same on
        # every step (computed once), and the DR gradient, which would be multiplied by 0, is skipped.
        learns_dr = self.hp.dr_learning_rate > 0
        fixed_mixture = None if learns_dr else dr.to(cores.dtype) @ cores
        own_term = torch.empty_like(own)

        def personalised(out: torch.Tensor) -> torch.Tensor:
            """Σ_j p_ij c_j with the own core as it is now, written into ``out``."""
            weights = dr.to(cores.dtype)
            if fixed_mixture is None:
                torch.mm(weights[None], cores, out=out[None])  # weights @ cores, as matmul computes it
            else:
                out.copy_(fixed_mixture)
            return out.add_(torch.sub(own, cores[i], out=own_term).mul_(weights[i]))

        # The received cores are fixed for the round: their float64 copy for ⟨g, c_j⟩ is made once,
        # and every step's model-sized terms go into buffers made once (a new copy of N models per
        # step, or a new model-sized temporary per term, cost more than the step's arithmetic).
        scratch = double_scratch(cores, p_len) if learns_dr and self.hp.apple_p_grad == "inner" else None
        model.module.train()
        loss_sum = torch.zeros((), device=model.device)
        for idx in job.plan:
            personalised(model.vector)
            loss_sum += self.compute_gradient(model, idx)
            g = model.grad
            core_step = core_lr * float(dr[i])
            if learns_dr:
                dr_grad = self.dr_gradient(g, cores, own, model, scratch)
                dr_grad += prox * (dr - p0.to(dr.dtype))
                dr -= self.hp.dr_learning_rate * dr_grad
            own[:p_len] -= core_step * g
        loss = self.check_loss(loss_sum, len(job.plan), package.round)
        self.state.set("apple_p", i, dr)
        self.state.set("personal", i, personalised(torch.empty_like(own)))
        return own, loss

    def end_round(self, params, package: RoundPackage, ctx, steps, loss) -> ClientUpdate:
        return ClientUpdate(self.index, self.num_train, steps, params, loss)
