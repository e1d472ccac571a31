"""FedAvg (McMahan et al., AISTATS 2017, arXiv:1602.05629).

The server averages the uploaded models weighted by each client's number of training samples
(PFLlib's form, over the uploads actually received). This is the base server unchanged.
"""
from flcore.clients.clientfedavg import FedAvgClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server


@register_algorithm("FedAvg")
class FedAvgServer(Server):
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    client_cls = FedAvgClient
