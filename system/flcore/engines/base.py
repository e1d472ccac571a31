"""What every engine shares: which clients it can train itself, the one-line fallback notice, and
leaving the working model and the RNG where the sequential engine leaves them.

An engine only decides where and how many clients train at a time. Each client's work is the
sequence of :mod:`flcore.clients.clientbase` (``plan_job``, ``open_job``, ``train_job``,
``finish_job``), called in that order per client; the updates come back in cohort order.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

import torch

from flcore.protocol import ClientUpdate, RoundPackage, Runtime
from flcore.trainmodel.properties import has_dropout  # noqa: F401  (engines read it from here)
from utils.seeding import rng_state, set_rng_state

if TYPE_CHECKING:
    from flcore.clients.clientbase import Client

log = logging.getLogger("fl")


def keeps_base_training(client: "Client") -> bool:
    """True when the client trains by the base sequence's SGD (possibly with its own loss hook and
    gradient term), and promises that its hooks touch only its own state (``vectorisable``):
    what threads may run (``Client.capabilities``)."""
    return type(client).capabilities.keeps_base_training


class Engine:
    """The sequential engine's results, produced some other way; subclasses implement ``train``."""

    #: how a fallback notice is logged (``auto`` only informs, an explicit engine warns)
    notice_level: ClassVar[int] = logging.WARNING

    def __init__(self, runtime: Runtime):
        #: what the engine needs of the run (model, data, settings, clients, state): flcore/protocol.py
        self.server = runtime
        self.flat = runtime.model
        self.stats: dict[str, int] = {}
        self._noticed: set[str] = set()
        self._model_reason: str | None | bool = False  # False = not checked yet, None = fits

    # ------------------------------------------------------------ qualification
    def notice(self, key: str, message: str) -> None:
        """Log ``message`` once per key (a fallback is reported once, not every round)."""
        if key not in self._noticed:
            self._noticed.add(key)
            log.log(self.notice_level, "%s", message)

    def model_fallback_reason(self) -> str | None:
        """Why this engine cannot train this model (None when it can); checked once."""
        if self._model_reason is False:
            self._model_reason = self.check_model()
        return self._model_reason  # type: ignore[return-value]

    def check_model(self) -> str | None:
        return None

    def client_fallback_reason(self, client: Client) -> str | None:
        return None if keeps_base_training(client) else "is not vectorisable"

    def qualifies(self, client: Client) -> bool:
        """Whether this engine trains ``client`` itself; otherwise it is trained sequentially,
        and a one-line notice says why (once)."""
        name = getattr(self, "registered_name", type(self).__name__)
        reason = self.model_fallback_reason()
        if reason is not None:
            self.notice("model", f"engine {name}: {reason}; training sequentially")
            return False
        reason = self.client_fallback_reason(client)
        if reason is not None:
            self.notice(f"client:{type(client).__qualname__}",
                        f"engine {name}: {type(client).__name__} {reason}; its clients are trained sequentially")
            return False
        return True

    # ------------------------------------------------------------ training
    def train(self, clients: list[Client], package: RoundPackage) -> list[ClientUpdate]:
        raise NotImplementedError

    def train_sequentially(self, client: Client, package: RoundPackage) -> ClientUpdate:
        self.stats["sequential_clients"] = self.stats.get("sequential_clients", 0) + 1
        return client.local_train(self.flat, package)

    def end_like_sequential(self, last_params: torch.Tensor | None, last_rng: tuple | None) -> None:
        """Leave the working model and the global RNG as the sequential engine does: holding the
        last cohort client's final model, with the RNG its ``finish_job`` left."""
        if last_params is not None:
            self.flat.load(last_params)
        if last_rng is not None:
            set_rng_state(last_rng)

    def rng_now(self) -> tuple:
        return rng_state(self.flat.device)

    def close(self) -> None:
        """Release threads, actors or files (the run is over)."""
