"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020, arXiv:2002.07948): FedAvg's aggregation.

The server averages the uploads as FedAvg does; local training is MAML (``clientperavg.py``).
Each client is evaluated with its personalised model: the global model after one SGD step
(lr α = ``-lr``) on one minibatch of the client's **training** data, as PFLlib's
``evaluate_one_step``/``train_one_step``. (Older PFLlib versions adapted on a test batch, which
leaks test data; we never do.) The adapted models are recomputed from the current global model at
every evaluation and never stored; the base also records the global model's accuracy
(``rs_test_acc_global``, "Per-FedAvg-G"). PFLlib's train loss runs its own two-step procedure;
here ``rs_train_loss`` is the cross-entropy of each client's adapted model on its training data.
"""
from __future__ import annotations

import torch

from flcore.clients.clientperavg import PerAvgClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from utils.errors import FLError
from utils.metrics import EvalResult


@register_algorithm("PerAvg")
class PerAvgServer(Server):
    client_cls = PerAvgClient
    personalized = True

    def setup(self) -> None:
        if self.hp.beta < 0:
            raise FLError(f"-bt must be >= 0 (0 = use -lr), got {self.hp.beta}")
        if self.hp.peravg_order == "hessian_free" and self.hp.peravg_delta <= 0:
            raise FLError(f"--peravg_delta must be > 0, got {self.hp.peravg_delta}")
        self._eval_round = 0

    def evaluate(self, rnd: int) -> EvalResult:
        self._eval_round = rnd
        return super().evaluate(rnd)

    def eval_params(self, index: int) -> torch.Tensor:
        return self.clients[index].adapted(self.model, self.global_params, self._eval_round)

    def summary(self) -> dict[str, object]:
        beta = self.hp.beta or self.args.local_learning_rate
        summary = {"alpha": self.args.local_learning_rate, "beta": beta, "order": self.hp.peravg_order}
        if self.hp.peravg_order == "hessian_free":
            summary["delta"] = self.hp.peravg_delta
        return summary
