"""FedPCL (Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, NeurIPS 2022, arXiv:2209.10083), PFLlib's
variant without pre-trained backbones (``clientfedpcl.py`` says what that changes).

No model weights travel. The server keeps every client's latest prototypes (normalised class
means of its representations) and, each round, forms the global prototypes as the plain mean of
the round's uploads per class (as PFLlib; a round whose uploads all got lost keeps the previous
ones). Each package carries the global prototypes, and every uploader's latest prototypes with a
mask of the classes it holds: the set of client prototypes of the contrastive loss (C x d per
client that has uploaded, so the download grows with the number of clients, as in the paper).

Evaluation is FedPCL's prototype classifier, as in PFLlib: a test sample goes to the class whose
prototype (among the client's own latest ones) has the largest dot product with its normalised
representation. Since ‖f(x)‖ is the same for every class, this is the argmax of f(x)·c_k, i.e.
the client's model with its head replaced by the linear map whose rows are its prototypes (no
bias; zero rows for classes it lacks, which PFLlib scores 0 too), so ``eval_params`` returns that
model and ``rs_test_acc`` is exactly the prototype classifier's accuracy. ``rs_test_auc`` and
``rs_train_loss`` come from the logits f(x)·c_k (PFLlib records no AUC for FedPCL). A client with
no prototypes yet scores every class 0 (PFLlib counts it as 0 correct). Only personalised
accuracy: FedPCL has no global model.
"""
from __future__ import annotations

import torch
from torch import nn

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedpcl import FedPCLClient
from flcore.common.labelmeans import LABELS, average, require_body_head, uploaded
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from utils.errors import FLError


@register_algorithm("FedPCL")
class FedPCLServer(Server):
    #: what persists across rounds (checkpoints): the global prototypes
    carried = ("global_prototypes", "global_present")

    client_cls = FedPCLClient
    personalized = True
    has_global_model = False
    shared = ()  # no model weights travel: every client keeps its whole model

    def setup(self) -> None:
        require_body_head(self.model.module, "FedPCL", self.args.model)
        head = self.model.module.head
        if not isinstance(head, nn.Linear):
            raise FLError(f"FedPCL evaluates with a prototype classifier in place of a linear head; "
                          f"-m {self.args.model}'s head is not one nn.Linear")
        if self.hp.tau <= 0:
            raise FLError(f"FedPCL needs a temperature -tau > 0, got {self.hp.tau}")
        if not any(seg.is_param and not seg.in_head for seg in self.model.segments):
            raise FLError(f"FedPCL trains only the body (its loss never reaches the head); -m {self.args.model}'s "
                          "body has no parameters")
        #: the entries of the head, replaced by the prototype classifier in evaluation
        self.head_entries = self.model.head_mask()
        self.global_prototypes: torch.Tensor | None = None
        self.global_present: torch.Tensor | None = None

    def summary(self) -> dict[str, object]:
        return {"tau": self.hp.tau}

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        if self.global_prototypes is None:
            return self.package(rnd, cohort)
        holders = self.state.indices("prototypes")
        extras = {"global_prototypes": self.global_prototypes, "global_present": self.global_present,
                  "client_prototypes": torch.stack([self.state.get("prototypes", i) for i in holders]),
                  "client_held": torch.stack([self.state.get("held", i) for i in holders]),
                  "num_clients": torch.tensor([len(self.clients)], device=self.global_params.device)}
        return self.package(rnd, cohort, extras=extras)

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        sent = [u for u in updates if u.extras[LABELS].numel()]
        for update in sent:
            prototypes, counts = uploaded(update.extras, self.num_classes)
            self.state.set("prototypes", update.index, prototypes)
            self.state.set("held", update.index, counts > 0)
        if sent:
            self.global_prototypes, self.global_present = average(
                [u.extras for u in sent], self.num_classes, sent[0].extras["means"].shape[1], "uniform",
                self.global_params)

    def eval_params(self, index: int) -> torch.Tensor:
        """The client's model with its head replaced by its prototypes (rows) and no bias."""
        params = super().eval_params(index).clone()
        prototypes = self.state.get("prototypes", index)
        head = torch.zeros_like(params[self.head_entries])  # [weight (C x d), bias]: a zero bias
        if prototypes is not None:
            head[: prototypes.numel()] = prototypes.reshape(-1)
        params[self.head_entries] = head
        return params
