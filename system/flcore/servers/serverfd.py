"""FD: federated distillation (Jeong et al., 2018, arXiv:1811.11479).

No model weights travel. Each selected client uploads, for every label ℓ it saw, its mean logit
vector F_{i,ℓ} over local training (``clientfd.py``). For the next round the server gives each
client i the teacher logits of every label,

    F̂_{i,ℓ} = mean of F_{j,ℓ} over the last round's uploaders j ≠ i that hold ℓ,

the global average logit with the client's own contribution left out, as in the paper (a device
distils from the others' knowledge; under partial participation a client that did not upload
last round gets the mean of all uploads). ``--fd_teacher all`` gives everyone the mean of all
uploads, its own included, as PFLlib does. A label no other uploader held has no teacher.

FD has no global model: each client is evaluated with its own model (personalised accuracy only,
as PFLlib's FD). A round whose uploads all got lost keeps the previous round's teachers.

Traffic: an upload is k labels and a k x C block of mean logits (k ≤ C classes held: 10 x 10
floats plus 10 labels, 480 bytes, for MNIST, against FedAvg's 2.3 MB CNN); the download is a C x C
teacher with a C-byte mask, per client (``others``) or the same for all (``all``).
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfd import FDClient
from flcore.common.labelmeans import LABELS, uploaded
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from cli.flags import add_flag
from utils.errors import FLError

log = logging.getLogger("fl")


@register_algorithm("FD")
class FDServer(Server):
    #: what persists across rounds (checkpoints): the per-label logits clients uploaded, and who uploaded them
    carried = ("uploaders", "upload_logits", "upload_held")

    client_cls = FDClient
    personalized = True
    has_global_model = False
    shared = ()  # no model weights travel: every client keeps its whole model

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--fd_teacher", type=str, default="others", choices=["others", "all"],
                 help="FD's teacher logits for a client: the other uploaders' mean (paper) or every uploader's (PFLlib)")

    def setup(self) -> None:
        if self.hp.lamda < 0:
            raise FLError(f"FD needs -lam >= 0, got {self.hp.lamda}")
        if self.hp.lamda == 0:
            log.warning("warning: FD with -lam 0 trains like Local (no distillation)")
        #: the last round's uploads, one row per uploader: [U, C, C] mean logits, [U, C] labels held
        self.uploaders: list[int] = []
        self.upload_logits: torch.Tensor | None = None
        self.upload_held: torch.Tensor | None = None

    def summary(self) -> dict[str, object]:
        return {"lamda": self.hp.lamda, "teacher": self.hp.fd_teacher, "target": self.hp.fd_target}

    def teacher(self, index: int | None) -> dict[str, torch.Tensor]:
        """Mean logits per label over the last uploads, without client ``index``'s (None: all)."""
        held = self.upload_held.double()
        sums = (held.unsqueeze(2) * self.upload_logits.double()).sum(0)
        count = held.sum(0)
        if index in self.uploaders:
            own = self.uploaders.index(index)
            sums -= held[own].unsqueeze(1) * self.upload_logits[own].double()
            count -= held[own]
        present = count > 0
        logits = torch.where(present.unsqueeze(1), sums / count.clamp_min(1).unsqueeze(1), 0.0)
        return {"teacher_logits": logits.to(self.global_params.dtype), "teacher_present": present}

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        if self.upload_logits is None:
            return self.package(rnd, cohort)
        if self.hp.fd_teacher == "all":
            return self.package(rnd, cohort, extras=self.teacher(None))
        return self.package(rnd, cohort, payloads={i: self.teacher(i) for i in cohort})

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        sent = [u for u in updates if u.extras[LABELS].numel()]
        if not sent:
            return
        dense = [uploaded(u.extras, self.num_classes) for u in sent]
        self.uploaders = [u.index for u in sent]
        self.upload_logits = torch.stack([means for means, _ in dense])
        self.upload_held = torch.stack([held > 0 for _, held in dense])
