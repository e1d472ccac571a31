"""The reference engine: clients of the cohort trained one after another on one working model.

An engine is handed the cohort and the round's package and returns the updates in cohort
(client-id) order; every other engine reproduces this one's results.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, RoundPackage
from flcore.engines.base import Engine
from flcore.engines.precision import check_precision, precision_context
from flcore.registry import register_engine

if TYPE_CHECKING:
    from flcore.protocol import Runtime


@register_engine("sequential")
class SequentialEngine(Engine):
    """Train each client of the cohort in turn on the server's working model."""

    def __init__(self, runtime: "Runtime"):
        super().__init__(runtime)
        self.precision = check_precision(runtime.args, self.flat.device)

    def train(self, clients: list[Client], package: RoundPackage) -> list[ClientUpdate]:
        with precision_context(self.precision, self.flat.device):  # --precision (fp32: no change)
            return [client.local_train(self.flat, package) for client in clients]
