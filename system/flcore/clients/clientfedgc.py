"""FedGC client (Niu & Deng, "Federated Learning for Face Recognition with Gradient Correction",
AAAI 2022, arXiv:2112.07246), as PFLlib implements it.

Each client classifies among its own classes only: its head has one row per class it holds
(PFLlib builds a bias-free ``Linear(features, local classes)``). Here the head keeps the model's
full shape and the rows of the classes a client lacks are switched off with the bias −1e4, so
their logits never win and their softmax probability, hence their gradient, is 0: training is
the softmax over the client's classes. The client trains body and head with FedAvg's local SGD
from the global body and its head as the server last corrected it (``payload["head"]``; the
initial head, restricted to its classes, the first time), and uploads the whole model with the
classes it holds (``extras["classes"]``). The head's bias of the classes it holds is trained like
the rows (PFLlib's head has no bias); the server's correction uses the rows only.
"""
from __future__ import annotations

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, RoundPackage

#: the bias that switches a class's logit off: exp(−1e4) underflows to 0 in float32, and −1e4 survives a
#: float16 state store (--state_dtype float16), where −1e9 would become −inf
ABSENT_BIAS = -1e4


class FedGCClient(Client):
    """FedAvg's local SGD on the global body and the client's own class rows."""
    hooks_draw_no_rng = True  # start_point/end_round: the payload's head and the classes held

    def classes_held(self) -> torch.Tensor:
        num_classes = self.task.num_classes if self.task is not None else int(self.data.train_y.max()) + 1
        held = torch.zeros(num_classes, dtype=torch.bool, device=self.data.train_y.device)
        held[self.data.train_y.unique()] = True
        return held

    def start_point(self, package: RoundPackage) -> torch.Tensor:
        head_start, bias_start, head_stop = package.extras["fedgc_layout"].tolist()
        start = package.global_params.clone()
        head = package.payload(self.index).get("head")
        if head is not None:
            start[head_start:head_stop] = head
        bias = start[bias_start:head_stop]
        bias[~self.classes_held().to(bias.device)] = ABSENT_BIAS
        return start

    def end_round(self, params, package: RoundPackage, ctx, steps, loss) -> ClientUpdate:
        update = super().end_round(params, package, ctx, steps, loss)
        update.extras["classes"] = self.classes_held()
        return update
