"""Hermes (Li, Sun, Li, Pu, Li, Chen, MobiCom 2021, doi:10.1145/3447993.3483278): the server.

LotteryFL's server unchanged (``serverlotteryfl.py``): each client receives the global model on
the entries it last uploaded, and each entry is averaged over the clients whose subnetworks kept
it, i.e. over the overlapping parts; the clients prune whole channels (``clienthermes.py``).
"""
from __future__ import annotations

from flcore.clients.clienthermes import HermesClient
from flcore.registry import register_algorithm
from flcore.servers.serverlotteryfl import LotteryFLServer


@register_algorithm("Hermes")
class HermesServer(LotteryFLServer):
    client_cls = HermesClient
