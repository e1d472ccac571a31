"""FedBN (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021, arXiv:2102.07623).

Rule: FedAvg, except that the batch-normalisation layers stay local: their affine parameters
and running statistics are never uploaded or averaged, each client keeps its own
(``shared = "no_norm"``), and each client is evaluated with the global model and its own
normalisation layers. The client is FedAvg's unchanged (the protocol keeps the private part, so
there is no client file).

Differences, none of them selectable here:
* PFLlib keeps local every entry whose name contains ``bn``; here the layers are found by type
  (:data:`flcore.flat.NORM_LAYERS`), so a BatchNorm not named ``bn`` is local too. GroupNorm and
  LayerNorm layers are also kept local, where the paper speaks of BatchNorm only; no model here
  has them.
* ``num_batches_tracked`` (an integer buffer) is not part of the model vector and is shared by the
  working model; it only matters for BatchNorm with ``momentum=None``, which no model here uses.

A client never selected is evaluated with the initial statistics (mean 0, variance 1). On a model
without normalisation layers FedBN is FedAvg exactly. The shared model has no meaning of its own
(its normalisation layers are the initial ones), so only the personalised accuracy is recorded.
BatchNorm models are trained sequentially by the batched engine (one notice), as for every
algorithm.
"""
from __future__ import annotations

from flcore.clients.clientfedavg import FedAvgClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server


@register_algorithm("FedBN")
class FedBNServer(Server):
    client_cls = FedAvgClient
    personalized = True
    has_global_model = False
    shared = "no_norm"
