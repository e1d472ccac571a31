"""Sample-level DP-SGD on the client (Abadi et al. 2016), on the flat-vector local step.

``-dp`` makes :class:`DPSGD` a local-step strategy of the clients (``flcore/clients/localstep.py``),
so every local step of ``Client.sgd`` is a DP-SGD step (``Client.step_gradient`` asks the strategy).
It draws the round's batches (``"plan"``) and computes each step's gradient (``"gradient"``) from the
minibatch ``(x_i, y_i)`` the chain hands it: the client's rows, or an attacker's poisoned ones
(``--attack label_flip`` etc. transform the data first, ``order`` 10 before DP-SGD's 50)::

    g_i   = ∇ loss(w; x_i, y_i)                       per-sample gradients (torch.func.vmap of grad)
    ĝ_i   = g_i · min(1, C / (‖g_i‖ + 1e-6))           clipped to C (--dp_clip; opacus's clip factor)
    g     = (Σ_i ĝ_i + N(0, σ²C² I)) / B'             σ = -dps/--dp_sigma
    w    -= lr · adjust_grad(w, g, ctx)               the algorithm's gradient term, as without DP

The noise of local step ``s`` of client ``c`` in round ``t`` comes from a generator seeded by
``(seed, "dp", t, c, s)`` (``utils.seeding``), so it does not depend on the engine, the worker or
the order in which clients are trained. Only the loss gradient is privatised; ``adjust_grad``'s
terms (FedProx's proximal term, SCAFFOLD's correction) depend on the data only through earlier
privatised updates, i.e. they are post-processing.

Sampling (``--dp_sampling``):

* ``poisson`` (default): each local step draws its batch by including every sample independently
  with probability q = B/n (a Bernoulli draw per sample and step, from ``(seed, "dp-poisson",
  round, client)``); there are as many steps per epoch as without DP (n // B with ``--drop_last``,
  PFLlib's default). Batches vary in size (and may be empty: the step is then pure noise), and
  the sum is divided by the *expected* batch size B' = B, as opacus does (an empty batch adds 0 to
  the reported mean loss). This is the sampling
  the RDP/PRV accountants of opacus analyse, so the reported ε is a proven bound.
* ``shuffle``: PFLlib's batches (a permutation per epoch, ``Client.batch_plan``), divided by the
  real batch size. The accountant is still applied with q = B/n, as PFLlib (opacus with a
  shuffled DataLoader) did; that ε is the usual approximation, not a proof for shuffling, and the
  run warns so.

Whenever no sample of a step is clipped and the divisor is the real batch size, Σ_i ĝ_i / B' is
the minibatch gradient itself, and it is taken from one ordinary backward pass: the arithmetic is
then the non-DP step's, so σ = 0 with a clip above every gradient norm reproduces a non-DP
(``--dp_sampling shuffle``) run to the last bit. The per-sample pass is still run to measure the
norms.

Per-sample gradients need every sample to pass through the model on its own: models with dropout
(masks drawn per batch) or BatchNorm (statistics of the batch) are refused, as opacus refuses
BatchNorm; use ``-m CNN``/``DNN``/``MLR``/``MLP`` or a ``-GN`` model. The local loss must be the
base cross-entropy (``Client.local_loss``), so "plain SGD plus a gradient term" is what composes
with DP: algorithms with their own loss or local procedure are refused at start-up
(:func:`check_composable`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch.func import grad_and_value, vmap

from flcore.capabilities import AROUND_SGD, LOCAL_PROCEDURE
from flcore.extension import LocalStep
from flcore.flat import FlatModel, Net
from flcore.registry import register_local_step
from flcore.trainmodel.properties import has_batchnorm, has_dropout
from utils.errors import FLError
from utils.seeding import torch_generator

if TYPE_CHECKING:
    from flcore.clients.clientbase import Client
    from flcore.protocol import LocalJob, RoundPackage

#: opacus's guard against a zero norm in the clip factor C / (‖g‖ + eps)
CLIP_EPS = 1e-6
SAMPLINGS = ("poisson", "shuffle")


@register_local_step("dp-sgd")
@dataclass(frozen=True)
class DPSGD(LocalStep):
    """DP-SGD's local step with the run's settings (one object shared by every client; it holds no
    state). What the accountant charges each client, its number of DP-SGD steps, is the client's
    ``dp_steps`` (carried across rounds, counted after each round's job)."""
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    clip: float
    sigma: float
    sampling: str

    name: ClassVar[str] = "DP-SGD (per-sample gradients, Poisson batches)"
    transforms: ClassVar[frozenset[str]] = frozenset({"plan", "gradient"})
    order: ClassVar[int] = 50  # after the data attacks (10): it clips and noises the gradients of their batches
    carried: ClassVar[tuple[str, ...]] = ("dp_steps",)

    @classmethod
    def wanted(cls, args) -> bool:
        return bool(args.privacy)

    @classmethod
    def from_args(cls, args) -> "DPSGD":
        return _shared(float(args.dp_clip), float(args.dp_sigma), str(args.dp_sampling))

    def prepare(self, client: "Client") -> None:
        client.dp_steps = 0  # DP-SGD steps taken so far: what the accountant charges this client for

    def job_finished(self, client: "Client", job: "LocalJob") -> None:
        client.dp_steps += job.steps

    def batch_plan(self, client: "Client", rnd: int, epochs: int, purpose: str) -> list[torch.Tensor]:
        if self.poisson:  # the accountant assumes Poisson batches
            return self.poisson_plan(client, rnd, epochs)
        return client.shuffled_plan(rnd, epochs, purpose)

    @property
    def poisson(self) -> bool:
        return self.sampling == "poisson"

    @staticmethod
    def sample_rate(num_samples: int, batch_size: int) -> float:
        """q = B/n, the probability that one local step uses a given sample (at most 1)."""
        return min(1.0, batch_size / num_samples) if num_samples else 0.0

    # ----------------------------------------------------------------- sampling
    def poisson_plan(self, client: "Client", rnd: int, epochs: int) -> list[torch.Tensor]:
        """The round's batches under Poisson sampling: as many steps as ``Client.batch_plan`` takes,
        each including every sample with probability q, drawn from (seed, round, client)."""
        n, batch = client.num_train, client.batch_size
        q = self.sample_rate(n, batch)
        generator = torch_generator(client.args.seed, "dp-poisson", rnd, client.cid)
        device = client.data.train_y.device
        plan = []
        for _ in range(epochs * client.steps_per_epoch):
            chosen = torch.rand(n, generator=generator) < q
            plan.append(chosen.nonzero().flatten().to(device))
        return plan

    # ----------------------------------------------------------------- one step
    def batch_gradient(self, client: "Client", model: FlatModel, x: torch.Tensor, y: torch.Tensor, ctx: dict,
                       package: RoundPackage, step: int) -> torch.Tensor:
        """Leave the privatised gradient of the minibatch ``(x, y)`` in ``model.grad``; returns the mean loss.

        (``package.round``, ``step``) name the step's noise stream (``Client.step_gradient``)."""
        model.zero_grad()
        divisor = client.batch_size if self.poisson else len(y)
        loss = torch.zeros((), device=model.device)
        if len(y):
            grads, losses = per_sample_gradients(client, model, x, y, ctx)
            factors = clip_factors(grads, self.clip)
            if divisor == len(y) and bool((factors == 1).all()):
                # nothing clipped: Σ g_i / B is the minibatch gradient; one backward gives it with
                # the non-DP step's rounding
                loss = client.local_loss(model.net, x, y, ctx)
                loss.backward()
                loss = loss.detach()
            else:
                model.grad.copy_((factors @ grads) / divisor)
                loss = losses.mean()
        if self.sigma > 0:
            generator = torch_generator(client.args.seed, "dp", package.round, client.cid, step, device=model.device)
            noise = torch.randn(model.num_params, generator=generator, device=model.device, dtype=model.grad.dtype)
            model.grad.add_(noise, alpha=self.sigma * self.clip / divisor)
        return loss


def clip_factors(grads: torch.Tensor, clip: float) -> torch.Tensor:
    """min(1, C / (‖g_i‖ + 1e-6)) per row of ``grads`` (opacus's flat clipping)."""
    return (clip / (grads.norm(dim=1) + CLIP_EPS)).clamp(max=1.0)


def per_sample_gradients(client: "Client", model: FlatModel, x: torch.Tensor, y: torch.Tensor,
                         ctx: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(``[b, P]`` gradients, ``[b]`` losses) of ``client.local_loss`` on each sample alone, at the
    working model's parameters: ``vmap`` over the samples of ``grad`` through a functional
    :class:`~flcore.flat.Net`, so the working model itself is not touched."""
    segments = model.param_segments()
    params = {seg.name: model.params[seg.start:seg.stop].detach().view(seg.shape) for seg in segments}

    def loss_of_one(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return client.local_loss(Net(model.module, model, p), xi.unsqueeze(0), yi.unsqueeze(0), ctx)

    grads, losses = vmap(grad_and_value(loss_of_one), in_dims=(None, 0, 0))(params, x, y)
    flat = torch.cat([grads[seg.name].reshape(len(x), -1) for seg in segments], dim=1)
    return flat, losses


@functools.lru_cache(maxsize=None)
def _shared(clip: float, sigma: float, sampling: str) -> DPSGD:
    return DPSGD(clip, sigma, sampling)


def dp_sgd_config(args) -> DPSGD | None:
    """The run's DP-SGD settings (one object for all clients), or None without ``-dp``."""
    return DPSGD.from_args(args) if DPSGD.wanted(args) else None


def check_composable(client_cls: type, model: FlatModel) -> None:
    """Refuse (one line) an algorithm or a model DP-SGD cannot privatise correctly."""
    caps = client_cls.capabilities
    # passes around the SGD (FedPAC's head epoch, prototypes of the data) are no DP-SGD steps
    own = [name for name in (*LOCAL_PROCEDURE, "local_loss", *AROUND_SGD) if name in caps.overrides]
    if own or not caps.vectorisable:
        what = f"overrides {', '.join(own)}" if own else "is not vectorisable (its hooks touch shared state)"
        raise FLError(
            f"-dp: DP-SGD composes with algorithms whose local step is SGD on the cross-entropy plus a "
            f"gradient term; {client_cls.__name__} {what}"
        )
    if has_batchnorm(model.module) or model.num_total > model.num_params or has_dropout(model.module):
        raise FLError(
            "-dp: DP-SGD needs per-sample gradients, which a model with BatchNorm or dropout does not have; "
            "use -m CNN, DNN, MLP, MLR or a -GN model"
        )
