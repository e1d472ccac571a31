"""FedProto: federated prototype learning (Tan et al., AAAI 2022, arXiv:2105.00243).

No model weights travel. Each selected client uploads its local prototypes C_i^(j) (the mean
representation of its class-j samples) with |D_{i,j}|; the server forms the global prototypes

    C̄^(j) = Σ_{i ∈ N_j} |D_{i,j}| / Σ_{i ∈ N_j} |D_{i,j}| · C_i^(j)        (paper Eq. 6)

over the round's uploaders N_j that hold class j, and sends them to the next round's clients,
which pull their representations towards them (``clientfedproto.py``). Classes nobody uploaded in
a round have no global prototype in the next round (as in the paper and PFLlib, the global
prototypes are rebuilt from each round's uploads); a round whose uploads all got lost keeps the
previous ones.

Evaluation, as in the paper, two ways: each client's own model with its own head (the recorded
``rs_test_acc``: FedProto has no global model, so only personalised accuracy), and by nearest
global prototype: a test sample is given the class whose global prototype is closest (Euclidean)
to its representation under the client's model, recorded as ``rs_test_acc_proto`` (NaN before
the first prototypes exist). PFLlib records only the latter, as its ``rs_test_acc`` (0 before
the first round's prototypes).

Deliberate choices:
* ``--fedproto_weighting samples`` (default, paper Eq. 6) weights each client's prototype by its
  sample count of the class; ``uniform`` takes the plain mean over clients, as the authors' code
  and PFLlib do.
* A client's model before its first participation is the common initial model (as ``Local``).

Traffic: an upload is k labels, k counts and a k x d block of prototypes for the k classes a
client holds (d = the representation size: 512 for the CNN, so at most 10 x 512 floats, 20 KB,
for MNIST against FedAvg's 2.3 MB model); the download is the C x d global prototypes with a
C-byte mask of the classes that have one.
"""
from __future__ import annotations

import logging
import math
from argparse import ArgumentParser

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedproto import FedProtoClient
from flcore.common.labelmeans import LABELS, average, require_body_head
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from cli.flags import add_flag
from utils.errors import FLError
from utils.metrics import EvalResult

log = logging.getLogger("fl")


@register_algorithm("FedProto")
class FedProtoServer(Server):
    #: what persists across rounds (checkpoints): the global prototypes
    carried = ("global_prototypes", "global_present")

    client_cls = FedProtoClient
    personalized = True
    #: main.py warns when the model's body has no parameters (MLR): the features are the inputs
    learns_from_features = True
    has_global_model = False
    shared = ()  # no model weights travel: every client keeps its whole model

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--fedproto_weighting", type=str, default="samples", choices=["samples", "uniform"],
                 help="global prototype of a class: clients' prototypes weighted by their samples of it (paper "
                      "Eq. 6) or their plain mean (authors' code, PFLlib)")

    def setup(self) -> None:
        require_body_head(self.model.module, "FedProto", self.args.model)
        if self.hp.lamda < 0:
            raise FLError(f"FedProto needs -lam >= 0, got {self.hp.lamda}")
        if self.hp.lamda == 0:
            log.warning("warning: FedProto with -lam 0 trains like Local (the prototypes are only evaluated)")
        self.global_prototypes: torch.Tensor | None = None
        self.global_present: torch.Tensor | None = None

    def summary(self) -> dict[str, object]:
        return {"lamda": self.hp.lamda, "weighting": self.hp.fedproto_weighting}

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        if self.global_prototypes is None:
            return self.package(rnd, cohort)
        return self.package(rnd, cohort, extras={"global_prototypes": self.global_prototypes,
                                                 "global_present": self.global_present})

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        sent = [u.extras for u in updates if u.extras and u.extras[LABELS].numel()]
        if not sent:
            return
        dim = sent[0]["means"].shape[1]
        self.global_prototypes, self.global_present = average(
            sent, self.num_classes, dim, self.hp.fedproto_weighting, self.global_params)

    def evaluate(self, rnd: int) -> EvalResult:
        result = super().evaluate(rnd)
        accuracy = self.prototype_accuracy()
        self.history.add_series("test_acc_proto", accuracy)
        log.info("round %4d | nearest-prototype acc %.4f", rnd, accuracy)
        return result

    def prototype_accuracy(self) -> float:
        """Share of all clients' test samples whose nearest global prototype (Euclidean distance to
        the representation under the client's model) is that of their class."""
        if self.global_prototypes is None:
            return math.nan
        classes = torch.nonzero(self.global_present).flatten()
        prototypes = self.global_prototypes[classes]
        return self.evaluator.test_accuracy(
            self.eval_params, lambda net, x: classes[torch.cdist(net.features(x).flatten(1), prototypes).argmin(dim=1)])
