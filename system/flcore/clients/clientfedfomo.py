"""FedFomo client (Zhang, Sapra, Fidler, Yeung, Alvarez, "Personalized Federated Learning with First
Order Model Optimization", ICLR 2021, arXiv:2012.08565).

A client keeps its personal model θ_i (state ``personal``; the common initial model at first) and
holds out the last ``--fedfomo_val_ratio`` of its training rows as a validation set (PFLlib: 20%,
the last rows; local training uses the rest). In a round it receives M models θ_n of other
clients (``package.payload(i)``: ``ids`` and ``model_0`` … ``model_{M−1}``), and

1. weighs each by its first-order gain on the validation set over its distance,
   w_n = (L_val(θ_ref) − L_val(θ_n)) / (‖θ_n − θ_ref‖ + 1e-5),
2. moves to θ_ref + Σ_n ŵ_n (θ_n − θ_ref) with ŵ_n = max(w_n, 0) / Σ_m max(w_m, 0)
   (= Σ_n ŵ_n θ_n), or stays at θ_ref when no w_n is positive,
3. trains that with FedAvg's local SGD; the result is its new θ_i and its upload, with the raw
   w_n (``extras["fomo_weights"]``) and the ids of the models they weigh (``extras["fomo_ids"]``, 8
   bytes each, counted in the upload) for the server's affinity matrix.

Distances are over the trainable parameters, and only those are mixed (float buffers such as
BatchNorm statistics stay θ_ref's, as in PFLlib). L_val is the mean cross-entropy over the
validation rows with the model in eval mode (PFLlib: the mean of batch means, in train mode).

``--fedfomo_reference`` chooses θ_ref:
* ``trained`` (default, the paper): the client's current model θ_i, its last trained model; the
  server then never sends a client its own model;
* ``aggregate`` (PFLlib): the model the client started its previous local training from (state
  ``fomo_start``); the server may then send the client its own last upload, which is how PFLlib's
  clients get their trained model back.
With M = 0 (``-M 0``) nothing is received and FedFomo is Local training on the training rows;
``--fedfomo_val_ratio 0`` (possible only then) trains on all of them, exactly as Local.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import ClassVar

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, LocalJob, RoundPackage
from flcore.flat import FlatModel
from cli.flags import add_flag


class FedFomoClient(Client):
    """Personalised first-order aggregation of the received models, then local SGD."""

    vectorisable: ClassVar[bool] = False
    steps_through_sgd = True  # its own train_job trains through the base sgd (--local_momentum reaches it)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-M", "--M", type=int, default=5, low=0, help="models each selected client downloads")
        add_flag(parser, "--fedfomo_val_ratio", type=float, default=0.2, low=0, below=1,
                 help="fraction of a client's training rows (the last ones) held out to weigh the models")
        add_flag(parser, "--fedfomo_reference", type=str, default="trained", choices=["trained", "aggregate"],
                 help="model the gains and distances are measured from: the client's trained model (paper) "
                      "or the start of its previous training (PFLlib)")

    @property
    def num_validation(self) -> int:
        return int(self.hp.fedfomo_val_ratio * self.data.num_train)

    @property
    def num_train(self) -> int:
        """Local training uses the rows before the validation rows."""
        return self.data.num_train - self.num_validation

    def validation_loss(self, model: FlatModel, params: torch.Tensor) -> float:
        rows = slice(self.num_train, self.data.num_train)
        model.load(params)
        with torch.no_grad():
            logits = model.module(self.data.inputs("train", rows))
            return float(F.cross_entropy(logits, self.data.train_y[rows]))

    def reference(self, package: RoundPackage) -> torch.Tensor:
        name = "personal" if self.hp.fedfomo_reference == "trained" else "fomo_start"
        return self.state.get(name, self.index, init=lambda: package.global_params.clone())

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        package, p = job.package, model.num_params
        payload = package.payload(self.index)
        candidates = [payload[f"model_{k}"] for k in range(len(payload.get("ids", ())))]
        start = job.start
        weights = torch.zeros(len(candidates), dtype=torch.float64)
        if candidates and self.num_validation > 0:
            reference = self.reference(package)
            model.module.eval()
            ref_loss = self.validation_loss(model, reference)
            for k, theta in enumerate(candidates):
                distance = float(torch.linalg.vector_norm((theta[:p] - reference[:p]).double()))
                weights[k] = (ref_loss - self.validation_loss(model, theta)) / (distance + 1e-5)
            positive = weights.clamp_min(0.0)
            if float(positive.sum()) > 0:
                mix = positive / positive.sum()
                start = start.clone()
                start[:p] = sum(float(m) * theta[:p].double() for m, theta in zip(mix, candidates)).to(start.dtype)
        job.ctx["fomo_weights"] = weights
        if self.hp.fedfomo_reference == "aggregate":
            self.state.set("fomo_start", self.index, start)
        model.load(start)
        loss = self.sgd(model, package, job.ctx, job.plan, job.lr)
        return model.snapshot(), loss

    def start_point(self, package: RoundPackage) -> torch.Tensor:
        return self.state.get("personal", self.index, init=lambda: package.global_params.clone())

    def end_round(self, params, package: RoundPackage, ctx, steps, loss) -> ClientUpdate:
        self.state.set("personal", self.index, params)
        update = ClientUpdate(self.index, self.num_train, steps, params, loss)
        update.extras["fomo_weights"] = ctx["fomo_weights"]
        # which models the weights are of: the server adds them to P[i, ids] when the upload arrives,
        # which for a late upload (stragglers) is rounds after the package that sent those models
        update.extras["fomo_ids"] = package.payload(self.index).get("ids", torch.zeros(0, dtype=torch.long))
        return update
