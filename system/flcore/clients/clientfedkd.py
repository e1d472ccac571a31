"""FedKD client (Wu, Wu, Lyu, Huang, Xie, Nat. Commun. 13, 2032 (2022), arXiv:2108.13323).

Each client trains two models side by side on the same minibatches: its mentor (a personal
model that never leaves it: the model the sequence keeps as this client's private part) and the
mentee (shared: it arrives SVD-compressed from the server, and its update goes back compressed).
With CE_t, CE_s the mentor's and mentee's cross-entropy, p_t, p_s their softmax outputs, H_t, H_s
their representations and W_h a per-client learnable d x d projection, the losses are (paper
Eqs. 1-6, adaptive mutual distillation)

    mentor:  CE_t + [KL(p_s ‖ p_t) + MSE(H_t, W_h H_s)] / (CE_t + CE_s)
    mentee:  CE_s + [KL(p_t ‖ p_s) + MSE(H_t, W_h H_s)] / (CE_t + CE_s)

each model descending its own loss (the other model's prediction a constant in the KL term), W_h
descending the sum; the mentor and W_h at ``-lr``, the mentee at ``-mlr`` (both decayed by
``-ld`` alike). KL is per sample, averaged over the batch; MSE is averaged over all entries.

The upload is the mentee's update Δ = (trained mentee − received mentee), every parameter matrix
(a convolution's kernel as a [out, in·kh·kw] matrix) replaced by its truncated SVD U_k, σ_k, V_k
with the smallest k whose energy Σ_{i≤k} σ_i² reaches T(t)·Σσ² (``-Ts``/``-Te``, see
``serverfedkd.py``); a matrix is sent as it is when its factors would not be smaller, and vectors
(biases, BatchNorm statistics) are sent as they are. With T = 1 the update arrives exactly.

Two models are trained per step (twice FedAvg's gradient computations); this client runs its own
``train_job`` and the engines train it sequentially. Deliberate choices against PFLlib: the mentee
has the model's architecture (PFLlib too; the paper's mentee is smaller); PFLlib lets each loss's
gradient reach the other model, clips every gradient at norm 10 (``--fedkd_clip 10`` does the
same here: the mentor's, the mentee's and W_h's gradient each scaled to norm ≤ C; off by default,
as in the paper), compresses the mentee's *parameters* (not its update) and keeps no singular
value when T = 1 (its test is ``>``).
"""
from __future__ import annotations

import math
from argparse import ArgumentParser
from typing import Sequence

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, LocalJob
from flcore.clients.clientfml import flat_gradient, kl_divergence, paired_batches
from flcore.flat import FlatModel, Segment
from cli.flags import add_flag
from utils.errors import Diverged
from utils.seeding import torch_generator


def energy_threshold(rnd: int, rounds: int, start: float, end: float) -> float:
    """T(t) = T_start + (T_end − T_start) · t / R (paper; PFLlib's schedule)."""
    return start + (end - start) * rnd / max(rounds, 1)


def compress(vector: torch.Tensor, segments: Sequence[Segment], energy: float) -> dict[str, torch.Tensor]:
    """``vector`` as sent: per parameter matrix its truncated SVD (or the matrix itself where that is
    no larger), every other segment as it is."""
    sent = {}
    for seg in segments:
        values = vector[seg.start : seg.stop]
        rows = seg.shape[0] if seg.shape else 1
        cols = values.numel() // max(rows, 1)
        if not seg.is_param or len(seg.shape) < 2 or rows < 2 or cols < 2:
            sent[seg.name] = values
            continue
        u, s, vh = torch.linalg.svd(values.view(rows, cols), full_matrices=False)
        power = s.double().pow(2)
        kept = torch.cumsum(power, 0) >= energy * power.sum() * (1 - 1e-12)
        k = int(kept.nonzero()[0]) + 1 if power.sum() > 0 else 0
        if k * (rows + cols + 1) >= rows * cols:
            sent[seg.name] = values
        else:
            sent.update({f"{seg.name}|U": u[:, :k], f"{seg.name}|S": s[:k], f"{seg.name}|V": vh[:k]})
    return sent


def decompress(sent: dict[str, torch.Tensor], segments: Sequence[Segment], like: torch.Tensor) -> torch.Tensor:
    """The vector ``compress`` sent (U_k diag(σ_k) V_k for each factored matrix)."""
    vector = like.new_zeros(like.shape)
    for seg in segments:
        if seg.name in sent:
            vector[seg.start : seg.stop] = sent[seg.name].reshape(-1)
        else:
            u, s, vh = sent[f"{seg.name}|U"], sent[f"{seg.name}|S"], sent[f"{seg.name}|V"]
            vector[seg.start : seg.stop] = ((u * s) @ vh).reshape(-1)
    return vector


def initial_projection(seed: int, cid: int, dim: int, like: torch.Tensor) -> torch.Tensor:
    """W_h before training: U(−1/√d, 1/√d), nn.Linear's default, drawn from (seed, client)."""
    bound = 1 / math.sqrt(dim)
    draw = torch.rand(dim * dim, generator=torch_generator(seed, "fedkd-projection", cid), dtype=torch.float64)
    return ((2 * draw - 1) * bound).to(like.device, like.dtype)


class FedKDClient(Client):
    """Adaptive mutual distillation of mentor and mentee; uploads the mentee's compressed update."""
    uploads_instead = "its model's SVD-compressed updates"

    vectorisable = False  # two models and a projection trained per step: its own train_job

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-mlr", "--mentee_learning_rate", type=float, default=0.005, above=0,
                 help="FedKD: SGD learning rate of the mentee (PFLlib: 0.005)")
        add_flag(parser, "-Ts", "--T_start", type=float, default=0.95, above=0, high=1,
                 help="FedKD: SVD energy threshold in the first round")
        add_flag(parser, "-Te", "--T_end", type=float, default=0.98, above=0, high=1,
                 help="FedKD: SVD energy threshold reached in the last round")
        add_flag(parser, "--fedkd_clip", type=float, default=0.0, low=0,
                 help="FedKD: scale the mentor's, the mentee's and W_h's gradient each to norm <= C "
                      "(PFLlib: 10; 0 = off, the paper)")

    def expected_gradient_samples(self) -> float:
        return 2 * super().expected_gradient_samples()

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        n = model.num_params
        dim = next(p for p in model.module.head.parameters() if p.dim() == 2).shape[1]
        projection = self.state.get("projection", self.index,
                                    init=lambda: initial_projection(self.args.seed, self.cid, dim, job.start))
        received = decompress(job.package.extras, model.segments, job.start)
        mentee = received.clone()
        mentee_lr = self.hp.mentee_learning_rate * job.lr / float(self.args.local_learning_rate)
        mentor_params = list(model.module.parameters())
        loss_sum = torch.zeros((), device=model.device)
        clip = self.hp.fedkd_clip
        # the mentor (this client's private model) trains on the working model, the mentee functionally
        for x, y, mentee_leaves, mentee_net in paired_batches(self, job, model, mentee):
            w_h = projection.clone().requires_grad_(True)
            h_s = mentee_net.features(x).flatten(1)
            out_s = mentee_net.head(h_s)
            h_t = model.net.features(x).flatten(1)
            out_t = model.net.head(h_t)
            ce_t, ce_s = F.cross_entropy(out_t, y), F.cross_entropy(out_s, y)
            scale = ce_t + ce_s
            hidden = F.mse_loss(h_t, h_s @ w_h.view(dim, dim).T)
            mentor_kl = kl_divergence(F.log_softmax(out_t, 1), F.softmax(out_s, 1), "batchmean")
            mentee_kl = kl_divergence(F.log_softmax(out_s, 1), F.softmax(out_t, 1), "batchmean")
            mentor_loss = ce_t + (mentor_kl + hidden) / scale
            mentee_loss = ce_s + (mentee_kl + hidden) / scale
            (w_h_from_mentor,) = torch.autograd.grad(mentor_loss, w_h, retain_graph=True)
            mentor_loss.backward(inputs=mentor_params, retain_graph=True)  # into model.grad
            mentee_grad, w_h_from_mentee = flat_gradient(mentee_loss, mentee_leaves, w_h)
            w_h_grad = w_h_from_mentor + w_h_from_mentee
            if clip:
                for grad in (model.grad, mentee_grad, w_h_grad):
                    grad.mul_(torch.clamp(clip / (grad.norm() + 1e-12), max=1.0))
            model.params.sub_(model.grad, alpha=job.lr)
            mentee[:n] -= mentee_lr * mentee_grad
            projection = projection - job.lr * w_h_grad
            loss_sum += mentor_loss.detach()
        rnd = job.package.round
        mean_loss = self.check_loss(loss_sum, len(job.plan), rnd)
        update = mentee - received
        if not bool(torch.isfinite(update).all()):  # the SVD would fail with a traceback
            raise Diverged(f"FedKD's mentee update became non-finite on client {self.cid} in round {rnd}", rnd,
                           advice=f"lower the learning rates (-lr, now {self.learning_rate()}; -mlr)")
        energy = energy_threshold(rnd, int(self.args.global_rounds), self.hp.T_start, self.hp.T_end)
        job.ctx.update(upload=compress(update, model.segments, energy), projection=projection)
        return model.snapshot(), mean_loss

    def end_round(self, params, package, ctx, steps, loss) -> ClientUpdate:
        self.state.set("projection", self.index, ctx["projection"])
        return ClientUpdate(self.index, self.num_train, steps, params, loss, extras=ctx["upload"], uploads_params=False)
