"""FedBN (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021, arXiv:2102.07623).

Rule: FedAvg, except that the batch-normalisation layers stay local: their affine parameters
and running statistics are never uploaded or averaged, each client keeps its own
(``shared = "no_norm"``), and each client is evaluated with the global model and its own
normalisation layers. The client is FedAvg's unchanged (the protocol keeps the private part, so
there is no client file).

Differences, none of them selectable here:
* PFLlib keeps local every entry whose name contains ``bn``; here the layers are found by type,
  so a BatchNorm not named ``bn`` is local too.
* ``--fedbn_local``: ``norm`` (default, ``shared = "no_norm"``) keeps every normalisation layer
  local (:data:`flcore.flat.NORM_LAYERS`: BatchNorm, GroupNorm, LayerNorm); ``batchnorm`` keeps
  BatchNorm layers only, the paper's literal rule (a GroupNorm model is then FedAvg). They differ
  only on models with GroupNorm or LayerNorm.
* ``num_batches_tracked`` (an integer buffer) is not part of the model vector and is shared by the
  working model; it only matters for BatchNorm with ``momentum=None``, which no model here uses.

A client never selected is evaluated with the initial statistics (mean 0, variance 1). On a model
without normalisation layers FedBN is FedAvg exactly. The shared model has no meaning of its own
(its normalisation layers are the initial ones), so only the personalised accuracy is recorded.
BatchNorm models are trained sequentially by the batched engine (one notice), as for every
algorithm.

FedBN targets feature shift. Under strong label skew it can fall far below FedAvg: on MNIST with
CNN-BN, 20 clients, it equals FedAvg on an IID split but reaches 63% against FedAvg's 86% with
Dirichlet 0.1 (``docs/results/algorithms.md``), because each client normalises its one or two classes
to the same statistics before the averaged layers.
"""
from __future__ import annotations

from argparse import ArgumentParser

from flcore.clients.clientfedavg import FedAvgClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from cli.flags import add_flag


@register_algorithm("FedBN")
class FedBNServer(Server):
    client_cls = FedAvgClient
    personalized = True
    has_global_model = False
    shared = "no_norm"

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--fedbn_local", type=str, default="norm", choices=["norm", "batchnorm"],
                 help="keep every normalisation layer local, or BatchNorm layers only (the paper's wording)")

    def shared_parts(self) -> str:
        return "no_batchnorm" if self.hp.fedbn_local == "batchnorm" else self.shared

    def summary(self) -> dict[str, object]:
        return {"fedbn_local": self.hp.fedbn_local}
