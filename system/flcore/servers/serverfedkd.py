"""FedKD: communication-efficient FL via knowledge distillation (Wu, Wu, Lyu, Huang, Xie,
Nat. Commun. 13, 2032 (2022), arXiv:2108.13323).

Each client keeps its mentor (a personal model: what it is evaluated with, so only personalised
accuracy is recorded as ``rs_test_acc``) and trains the shared mentee with it by adaptive mutual
distillation (``clientfedkd.py``). Only SVD-compressed tensors travel:

* down: the global mentee, every parameter matrix truncated to the smallest rank whose energy
  reaches T(t) = T_start + (T_end − T_start)·t/R (``-Ts``, ``-Te``; R = ``-gr``);
* up: each client's mentee update, compressed at the same T(t).

The server's mentee becomes M̃ + mean_i Δ̃_i, M̃ being the compressed mentee it sent and Δ̃_i the
decompressed updates (a plain mean, as the paper and PFLlib average the clients' updates). The
mentee's accuracy on every client's test data is recorded as ``rs_test_acc_mentee``. With
``-Ts 1 -Te 1`` nothing is truncated: the mentee and the updates travel exactly.

Deliberate choices: the download is the compressed mentee rather than the compressed aggregated
update, so that a client who missed rounds still starts from the current mentee (PFLlib does the
same; the paper's clients all take part every round). Bytes count the factors really sent.
"""
from __future__ import annotations

import logging

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedkd import FedKDClient, compress, decompress, energy_threshold
from flcore.common.labelmeans import require_body_head
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from utils.errors import FLError
from utils.metrics import EvalResult

log = logging.getLogger("fl")


@register_algorithm("FedKD")
class FedKDServer(Server):
    #: what persists across rounds (checkpoints): the global mentee and the one the last package sent
    carried = ("mentee", "sent_mentee")

    client_cls = FedKDClient
    personalized = True
    #: main.py warns when the model's body has no parameters (MLR): the features are the inputs
    learns_from_features = True
    has_global_model = False  # the model vector the base keeps is not the mentee: see ``mentee``
    shared = ()  # no plain model weights travel: the mentee goes as SVD factors in the package's extras

    def setup(self) -> None:
        hp = self.hp
        require_body_head(self.model.module, "FedKD", self.args.model)
        if not any(p.dim() == 2 for p in self.model.module.head.parameters()):
            raise FLError(f"FedKD needs a linear head (its input size sizes W_h); -m {self.args.model}'s head has none")
        for flag, value in (("-Ts", hp.T_start), ("-Te", hp.T_end)):
            if not 0.0 < value <= 1.0:
                raise FLError(f"FedKD needs {flag} in (0, 1], got {value}")
        if hp.mentee_learning_rate <= 0:
            raise FLError(f"FedKD needs -mlr > 0, got {hp.mentee_learning_rate}")
        self.mentee = self.global_params.clone()
        self.sent_mentee = self.mentee

    def summary(self) -> dict[str, object]:
        hp = self.hp
        return {"mentee_learning_rate": hp.mentee_learning_rate, "T_start": hp.T_start, "T_end": hp.T_end}

    def energy(self, rnd: int) -> float:
        return energy_threshold(rnd, int(self.args.global_rounds), self.hp.T_start, self.hp.T_end)

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        sent = compress(self.mentee, self.model.segments, self.energy(rnd))
        self.sent_mentee = decompress(sent, self.model.segments, self.mentee)
        return self.package(rnd, cohort, extras=sent)

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        total = torch.zeros_like(self.sent_mentee)
        for update in updates:
            total += decompress(update.extras, self.model.segments, self.sent_mentee)
        self.mentee = self.sent_mentee + total / len(updates)

    def evaluate(self, rnd: int) -> EvalResult:
        result = super().evaluate(rnd)
        mentee = self.evaluate_models(lambda _: self.mentee, train_loss=False)
        self.history.add_series("test_acc_mentee", mentee.test_acc)
        log.info("round %4d | mentee acc %.4f", rnd, mentee.test_acc)
        return result
