"""FedALA client (Zhang et al., AAAI 2023, arXiv:2212.01197): adaptive local aggregation (ALA).

Before local training, client i does not overwrite its model with the global model Θ but mixes the
two element-wise on the last p parameter tensors (the lower tensors take the global value):

    Θ̂_i = Θ_i + (Θ − Θ_i) ⊙ W_i,      W_i ∈ [0, 1], initialised to ones, kept across rounds.

W_i is learned on s% of the local training data with every model parameter frozen,

    W_i ← clip_[0,1](W_i − η · ∇_Θ̂ L(Θ̂_i) ⊙ (Θ − Θ_i)),   Θ̂_i recomputed after every minibatch,

until convergence the first time ALA runs for the client (the start phase) and for one epoch in
every later round. Then the client runs E epochs of SGD from Θ̂_i, as in FedAvg, and uploads.

Choices where the paper, PFLlib (``utils/ALA.py``, ``clientala.py``) and this file differ:

* Θ̂ is computed as ``Θ − (Θ − Θ_i) ⊙ (1 − W)``, the same value, but exact when W = 1: with
  ``-et 0`` (W stays ones) FedALA is FedAvg bit for bit.
* The ALA sample (``--ala_sample``): ``contiguous`` (default, PFLlib) is ``⌊s/100·n⌋`` consecutive
  training samples from a random start, in storage order; ``random`` is a uniform random subset.
  Either is drawn once per ALA call from the (seed, "ala-sample", round, client) stream (PFLlib
  uses Python's unseeded ``random``). Batches of ``-lbs``, the last one kept (PFLlib's
  ``drop_last=False``).
* Start phase: more than ``--ala_num_pre_loss`` epochs and the population std of the last ones'
  losses (the loss of each epoch's last minibatch, as PFLlib) below ``--ala_threshold`` (PFLlib
  0.1; the FedALA repository 0.01); ``--ala_max_init_epochs`` caps it so that it cannot hang
  (PFLlib has no cap). A client whose sample is empty skips W learning.
* ALA is skipped (Θ̂ = Θ) while the client has no local model yet or its trainable parameters
  equal the global ones (PFLlib compares only the sum of the first tensor's difference).
* ``-p`` counts parameter tensors from the end (weight and bias separately); 0 or more than the
  model has means all of them. Float buffers (BatchNorm statistics) take the global value, like
  the lower tensors; PFLlib leaves each client's buffers local because it only touches parameters.
* W learning runs in train mode with the frozen lower tensors excluded from backward; dropout is
  seeded from (seed, "ala", round, client).
* When ALA runs and what is evaluated: see ``serverfedala.py`` (``--ala_all_clients``).
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser

import numpy as np
import torch

from flcore.clients.clientbase import Client
from flcore.protocol import LocalJob
from flcore.flat import FlatModel
from cli.flags import add_flag
from utils.seeding import numpy_rng, seed_global_rng

log = logging.getLogger("fl")


class FedALAClient(Client):
    """ALA on the received global model, then FedAvg's local SGD; the local model is kept as state."""

    vectorisable = False
    steps_through_sgd = True  # its own train_job trains through the base sgd (--local_momentum reaches it)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-et", "--eta", type=float, default=1.0, low=0, help="FedALA: learning rate η of the ALA weights W")
        add_flag(parser, "-s", "--rand_percent", type=int, default=80, low=0, high=100,
                 help="FedALA: s, percent of the local training data W is learned on")
        add_flag(parser, "-p", "--layer_idx", type=int, default=2, low=0,
                 help="FedALA: W covers the last p parameter tensors (weight and bias count separately; 0 = all)")
        add_flag(parser, "--ala_sample", type=str, default="contiguous", choices=["contiguous", "random"],
                 help="FedALA: the s%% sample is a contiguous slice at a random start (PFLlib) or a random subset")
        add_flag(parser, "--ala_threshold", type=float, default=0.1, low=0,
                 help="FedALA: the start phase ends when the std of the recent ALA losses is below this "
                      "(PFLlib 0.1, FedALA repository 0.01)")
        add_flag(parser, "--ala_num_pre_loss", type=int, default=10, low=1,
                 help="FedALA: number of recent ALA epoch losses whose std decides convergence")
        add_flag(parser, "--ala_max_init_epochs", type=int, default=100, low=1,
                 help="FedALA: at most this many ALA epochs in the start phase (PFLlib: unbounded)")
        add_flag(parser, "--ala_all_clients", type=bool, default=False,
                 help="FedALA: run ALA on every client after each aggregation and evaluate the ALA models "
                      "(PFLlib); default: ALA only on selected clients, evaluate their trained local models")

    # ------------------------------------------------------------------ ALA
    def ala_window(self, model: FlatModel) -> tuple[int, int]:
        """Flat range [lo, hi) of the last ``-p`` parameter tensors (all of them for p = 0)."""
        segments = model.param_segments()
        p = self.hp.layer_idx
        lo = 0 if p == 0 or p >= len(segments) else segments[-p].start
        return lo, model.num_params

    def ala_batches(self, rnd: int) -> list[torch.Tensor]:
        """Minibatches (in order, last one partial) of the s% sample W is learned on this round."""
        n = self.num_train
        size = int(self.hp.rand_percent / 100 * n)
        rng = numpy_rng(self.args.seed, "ala-sample", rnd, self.cid)
        if self.hp.ala_sample == "contiguous":
            start = int(rng.integers(0, n - size + 1))
            sample = torch.arange(start, start + size)
        else:
            sample = torch.from_numpy(rng.permutation(n)[:size])
        sample = sample.to(self.data.train_x.device)
        return [sample[i : i + self.batch_size] for i in range(0, size, self.batch_size)]

    def adaptive_local_aggregation(self, model: FlatModel, global_params: torch.Tensor, rnd: int) -> torch.Tensor:
        """Θ̂_i from the stored local model and ``global_params``; learns and stores W_i on the way."""
        local = self.state.get("local", self.index)
        num = model.num_params
        if local is None:
            return global_params
        local = local.to(global_params.device)
        if torch.equal(local[:num], global_params[:num]):
            return global_params
        lo, hi = self.ala_window(model)
        anchor = global_params[lo:hi]
        gap = anchor - local[lo:hi]  # Θ − Θ_i on the adapted tensors
        start_phase = not self.state.has("ala_weights", self.index)
        weights = self.state.get("ala_weights", self.index, init=lambda: torch.ones_like(gap)).to(anchor.device)
        batches = self.ala_batches(rnd)
        if batches:
            weights = self._learn_weights(model, global_params, gap, weights, batches, start_phase, rnd)
            self.state.set("ala_weights", self.index, weights)
        mixed = global_params.clone()
        mixed[lo:hi] = anchor - gap * (1 - weights)
        return mixed

    def _learn_weights(self, model: FlatModel, global_params: torch.Tensor, gap: torch.Tensor, weights: torch.Tensor,
                       batches: list[torch.Tensor], start_phase: bool, rnd: int) -> torch.Tensor:
        lo, hi = self.ala_window(model)
        anchor, eta = global_params[lo:hi], self.hp.eta
        seed_global_rng(self.args.seed, "ala", rnd, self.cid)
        model.load(global_params)
        model.module.train()
        top = model.params[lo:hi]
        top.copy_(anchor - gap * (1 - weights))
        segments = zip(model.param_segments(), model.module.parameters())
        frozen = [p for seg, p in segments if seg.stop <= lo and p.requires_grad]  # lower tensors: no backward
        for param in frozen:
            param.requires_grad_(False)
        try:
            window = self.hp.ala_num_pre_loss
            max_epochs = self.hp.ala_max_init_epochs if start_phase else 1
            losses: list[float] = []
            for _ in range(max_epochs):
                for idx in batches:
                    loss = self.compute_gradient(model, idx)
                    weights = torch.clamp(weights - eta * model.grad[lo:hi] * gap, 0, 1)
                    top.copy_(anchor - gap * (1 - weights))
                losses.append(float(loss))
                if start_phase and len(losses) > window and np.std(losses[-window:]) < self.hp.ala_threshold:
                    log.info("FedALA client %d: start phase converged after %d ALA epochs", self.cid, len(losses))
                    break
            else:
                if start_phase:
                    log.warning("warning: FedALA client %d: ALA start phase stopped at --ala_max_init_epochs %d "
                                "without converging (std of the last losses %.4f >= --ala_threshold %g)", self.cid,
                                max_epochs, float(np.std(losses[-window:])), self.hp.ala_threshold)
        finally:
            for param in frozen:
                param.requires_grad_(True)
        return weights

    # ------------------------------------------------------------- training
    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        """ALA (unless the server already ran it at send time), then FedAvg's SGD; keep the result."""
        package, rnd = job.package, job.package.round
        if self.hp.ala_all_clients:
            start = self.state.get("local", self.index, init=lambda: package.global_params)
        else:
            start = self.adaptive_local_aggregation(model, package.global_params, rnd)
        self.seed_round(rnd)
        model.load(start)
        loss = self.sgd(model, package, {}, job.plan, job.lr)
        params = model.snapshot()
        self.state.set("local", self.index, params)
        return params, loss
