"""FedPer (Arivazhagan, Aggarwal, Singh, Choudhary, 2019, arXiv:1912.00818).

Rule: every selected client trains its whole model (base and personalisation layers) with
FedAvg's local SGD from the global base merged with its own personalisation layers; only the base
is uploaded and averaged (sample-weighted), the personalisation layers never leave the client.
Each client is evaluated with the global base and its own personalisation layers.

Here the base is the model's ``body`` and the personalisation layers are its ``head``
(``shared = "body"``), as in PFLlib, whose FedPer uploads ``model.base`` and keeps ``model.head``.
The paper treats the number of personalisation layers K_P as a choice (its experiments keep the
last one or two layers personal); models here split off one classifier layer as the head.

The client is FedAvg's unchanged: keeping the head and uploading the body is the protocol's
partial sharing (``Server.shared``), so there is no client file. A client never selected is
evaluated with the initial head, as in PFLlib (every client starts from the same initial model).
With an empty personal part (a model whose head has no parameters) FedPer is FedAvg exactly.
The shared model has no meaning of its own (its head is the initial one), so only the
personalised accuracy is recorded.
"""
from __future__ import annotations

from flcore.clients.clientfedavg import FedAvgClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server


@register_algorithm("FedPer")
class FedPerServer(Server):
    client_cls = FedAvgClient
    personalized = True
    has_global_model = False
    shared = "body"
