"""FedGH: a generalised global header trained on the clients' representations
(Yi, Wang, Liu, Shi, Yu, ACM MM 2023, arXiv:2305.13137).

Every client's model is its own body (never shared) followed by the global head. Each round the
server sends the global head (the only weights that travel, and only down); each selected client
trains its body with it (``clientfedgh.py``) and uploads, for each class s it holds, its averaged
representation R_i^s. The server then trains the head on those pairs (R_i^s, s) with
cross-entropy by SGD (lr ``-slr``), one pass over them in a shuffled order drawn from (seed,
round), in minibatches of ``-lbs`` pairs, as PFLlib does; the result is the next global head.

FedGH has no global model of its own (the body is each client's), so only personalised accuracy
is recorded: each client with its own body and the current global head. ``rs_fedgh_head_loss``
records the mean cross-entropy of the head's training pass.

Deliberate choices and PFLlib's deviations:
* PFLlib's server head *is* client 0's head module (``self.clients[0].model.head``), so client 0's
  local training also moves the global head between the server's passes; here the server's head
  changes only by its own training on the uploads.
* PFLlib sends the head to every client each round; here to the selected ones, so the download
  counts the head once per selected client, and a client is evaluated with the current head.

Traffic: an upload is k labels and a k x d block of representations (d = 512 for the CNN: at
most 20 KB for MNIST's 10 classes, against FedAvg's 2.3 MB model); the download is the head.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch
import torch.nn.functional as F

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedgh import FedGHClient
from flcore.common.labelmeans import LABELS, MEANS, require_body_head
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from cli.flags import add_flag
from utils.errors import FLError
from utils.seeding import torch_generator


@register_algorithm("FedGH")
class FedGHServer(Server):
    client_cls = FedGHClient
    personalized = True
    #: main.py warns when the model's body has no parameters (MLR): the features are the inputs
    learns_from_features = True
    has_global_model = False
    shared = "head"  # the global head goes down; the body stays with each client; nothing goes up but R_i^s

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-slr", "--server_learning_rate", type=float, default=1.0, above=0,
                 help="FedGH: SGD learning rate of the server's head training (PFLlib: 1)")

    def setup(self) -> None:
        require_body_head(self.model.module, "FedGH", self.args.model)
        if not bool(self.model.head_mask().any()):
            raise FLError(f"FedGH needs a head with parameters; -m {self.args.model}'s head has none")
        if self.hp.server_learning_rate <= 0:
            raise FLError(f"FedGH needs -slr > 0, got {self.hp.server_learning_rate}")

    def summary(self) -> dict[str, object]:
        return {"server_learning_rate": self.hp.server_learning_rate}

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        sent = [u.extras for u in updates if u.extras and u.extras[LABELS].numel()]
        if not sent:
            return
        representations = torch.cat([e[MEANS] for e in sent])
        labels = torch.cat([e[LABELS] for e in sent])
        self.global_params = self.train_head(package.round, representations, labels)

    def train_head(self, rnd: int, representations: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One SGD pass of the head over the (representation, label) pairs; returns the new model
        vector (only its head entries change: the loss does not reach the body)."""
        order = torch.randperm(len(labels), generator=torch_generator(self.args.seed, "fedgh-head", rnd))
        vector = self.global_params.clone()
        losses = []
        for rows in order.to(labels.device).split(int(self.args.batch_size)):
            leaf = vector.detach().requires_grad_(True)
            loss = F.cross_entropy(self.model.net.at(leaf).head(representations[rows]), labels[rows])
            (grad,) = torch.autograd.grad(loss, leaf)
            vector = vector - self.hp.server_learning_rate * grad
            losses.append(float(loss.detach()))
        self.history.add_series("fedgh_head_loss", sum(losses) / len(losses))
        return vector.detach()
