"""FedAvg client (McMahan et al., AISTATS 2017, arXiv:1602.05629): the base client unchanged.

Local objective: E epochs of minibatch SGD with batch size B and learning rate η from the
received global model; the upload is the final model.
"""
from flcore.clients.clientbase import Client


class FedAvgClient(Client):
    """Plain local SGD; every hook is the base one."""
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

