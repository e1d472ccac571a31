"""The reference engine: clients of the cohort trained one after another on one working model.

An engine is handed the cohort and the round's package and returns the updates in cohort
(client-id) order; every other engine reproduces this one's results.
"""
from __future__ import annotations

from flcore.clients.clientbase import Client, ClientUpdate, RoundPackage
from flcore.engines.base import Engine
from flcore.registry import register_engine


@register_engine("sequential")
class SequentialEngine(Engine):
    """Train each client of the cohort in turn on the server's working model."""

    def train(self, clients: list[Client], package: RoundPackage) -> list[ClientUpdate]:
        return [client.local_train(self.flat, package) for client in clients]
