"""FAIR's client: FedAvg's local training, reporting its training loss before and after it.

The loss reduction L_i(w(t)) − L_i(w_i(t+1)) on the client's own training rows is the raw
material of FAIR's learning-quality estimate (``flcore/servers/serverfair.py``). Both losses are
the mean cross-entropy over every training row with the model in eval mode (dropout off,
BatchNorm's running statistics used and left unchanged), so they measure the models, not the
minibatches. They travel as two scalars in the upload's extras (``loss_before``, ``loss_after``).
The extra passes are forward only; the local procedure is not the base SGD loop alone, so the
class is not vectorisable (the engines train it client by client).
"""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import ClientUpdate, LocalJob, RoundPackage
from flcore.clients.clientfedavg import FedAvgClient
from flcore.flat import FlatModel


class FAIRClient(FedAvgClient):
    """FedAvg's local SGD; the upload carries the training loss before and after it."""

    vectorisable: ClassVar[bool] = False

    def training_loss(self, model: FlatModel, params: torch.Tensor) -> float:
        """Mean cross-entropy of ``params`` over every training row, in eval mode, in chunks of
        --eval_batch_size rows."""
        model.load(params)
        module = model.module
        was_training = module.training
        module.eval()
        total, rows = 0.0, self.data.num_train
        chunk = max(1, int(self.args.eval_batch_size))
        with torch.no_grad():
            for start in range(0, rows, chunk):
                part = slice(start, min(start + chunk, rows))
                logits = module(self.data.inputs("train", part))
                total += float(F.cross_entropy(logits, self.data.train_y[part], reduction="sum"))
        module.train(was_training)
        return total / rows if rows else 0.0

    def train_job(self, job: LocalJob, model: FlatModel) -> tuple[torch.Tensor, float]:
        before = self.training_loss(model, job.start)
        params, loss = super().train_job(job, model)
        job.ctx["loss_before"] = before
        job.ctx["loss_after"] = self.training_loss(model, params)
        return params, loss

    def end_round(self, params: torch.Tensor, package: RoundPackage, ctx: dict, steps: int, loss: float) -> ClientUpdate:
        update = super().end_round(params, package, ctx, steps, loss)
        update.extras = {name: torch.tensor(float(ctx[name]), dtype=torch.float64) for name in ("loss_before", "loss_after")}
        return update
