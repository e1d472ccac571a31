"""LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency, 2020,
"Think Locally, Act Globally", arXiv:2001.01523).

Rule: each client learns a local representation (the lower layers) and the clients jointly learn
a global model on top of it (the upper layers): a selected client trains its whole model with
FedAvg's local SGD from its own representation merged with the global upper layers, uploads only
the upper layers, and the server averages them (sample-weighted). Each client is evaluated with
its own representation and the global upper layers (the paper's "local test").

Here the global part is the model's ``head`` and the local representation its ``body``
(``shared = "head"``), as in PFLlib's LG-FedAvg, which uploads and aggregates ``model.head``.
Differences from the paper, none of them selectable here:
* The authors' code shares the top ``--num_layers_keep`` layers (3 for MNIST's MLP, 2 for
  CIFAR-10's CNN in its README); models here have one head layer, so the global part is smaller.
* The authors' code starts LG-FedAvg from a model first trained with FedAvg (``--load_fed``);
  PFLlib and we start from the common random initial model.
* The paper also evaluates new devices with an ensemble of local models ("new test"); not here.

The client is FedAvg's unchanged (the protocol keeps the body, so there is no client file). A
client never selected is evaluated with the initial body. With a model whose body has no
parameters LG-FedAvg is FedAvg exactly.
"""
from __future__ import annotations

from flcore.clients.clientfedavg import FedAvgClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server


@register_algorithm("LG-FedAvg")
class LGFedAvgServer(Server):
    client_cls = FedAvgClient
    personalized = True
    has_global_model = False
    shared = "head"
