"""Round plug-ins: features of every round that are not the algorithm's (the virtual clock,
differential privacy's accounting and DP-FedAvg; next: attacks, defences, asynchrony).

A plug-in subclasses :class:`RoundPlugin`, registers with ``@register_plugin(name)`` in a module of
this package (or of ``flcore/privacy``), and says from the flags whether a run uses it
(``wanted``). ``Server.__init__`` builds every wanted plug-in (:func:`plugins_for`), so ``main.py``,
``benchmark.py`` and the tests that build servers all get the same ones, and ``Server.run_round``
calls them at fixed points, in ``order``::

    before_selection(rnd, selecting)      a training round begins (``selecting``: the server draws
                                          its cohort); the clock waits for an available client
    selectable(rnd) -> mask | None        who may be selected (every selection policy honours it)
    after_selection(rnd, cohort) -> cohort
                                          the clients of the drawn (or given) cohort that train:
                                          the stragglers' busy clients sit the round out (may be
                                          empty: the round then trains nobody)
    after_evaluation(rnd, global_params, result)
                                          the server evaluated ``global_params`` (every -eg rounds
                                          and at the end): the backdoor's attack success rate
    after_training(package, trained, arrived, result) -> kept uploads
                                          the clock times the round; -tth drops late uploads
    aggregate(updates, package) -> new global parameters
                                          only the plug-in whose ``takes_aggregation`` is true
                                          (at most one per run): DP-FedAvg's noised mean
    after_round(rnd, package, updates, result)
                                          per-round series (ε of the privacy spent so far)
    record(result)                        when the training loop records a round in the history
                                          (``record_round``; not when a caller runs
                                          ``run_round`` alone): the clock's series

A plug-in gets the run's :class:`~flcore.protocol.Runtime` (model, data, device, flags, clients,
state, history) and the algorithm's server class (for start-up checks on its ``capabilities``),
never the server object. What it keeps across rounds it returns from ``state_dict`` (plain data,
tensors, arrays) and takes back in ``load_state_dict``: checkpoints save it under its name.
"""
from __future__ import annotations

from argparse import Namespace
from typing import Any, ClassVar

import numpy as np
import torch

from flcore.protocol import ClientUpdate, RoundPackage, RoundResult, Runtime
from flcore.registry import PLUGINS, import_submodules
from utils.errors import FLError


class RoundPlugin:
    """A round plug-in; every hook does nothing by default (module docstring)."""

    #: the registered name (set by ``@register_plugin``)
    registered_name: ClassVar[str]
    #: plug-ins run in increasing order at each point (ties: by name)
    order: ClassVar[int] = 100
    #: whether this plug-in replaces the algorithm's ``aggregate`` (set per run in ``__init__``)
    takes_aggregation: bool = False
    #: every plug-in of the run by name, this one included (set once all are built)
    peers: dict[str, "RoundPlugin"] = {}

    @classmethod
    def wanted(cls, args: Namespace) -> bool:
        """Whether a run with these flags uses this plug-in."""
        return True

    @classmethod
    def public_data_user(cls, args: Namespace) -> str | None:
        """The option that needs ``--public_data`` with these flags (None: none does); ``main.py``
        refuses a run without it before any data is read."""
        return None

    def __init__(self, runtime: Runtime, server_cls: type):
        """``server_cls``: the algorithm's server class (its ``capabilities`` and ``client_cls``)."""
        self.runtime = runtime
        self.args = runtime.args

    # ------------------------------------------------------------------ hooks
    def before_selection(self, rnd: int, selecting: bool) -> None:
        """A training round begins; ``selecting``: its cohort is drawn (not given by the caller)."""

    def selectable(self, rnd: int) -> np.ndarray | None:
        """Which clients may be selected (a boolean mask over client positions; None: any)."""
        return None

    def after_selection(self, rnd: int, cohort: list[int]) -> list[int]:
        """The clients of ``cohort`` (drawn, or given by the caller) that train in round ``rnd``."""
        return cohort

    def after_evaluation(self, rnd: int, global_params: torch.Tensor, result: RoundResult) -> None:
        """The server has evaluated the global model ``global_params`` of round ``rnd`` (the model
        before that round's training; the final one after the last round): metrics of the same model."""

    def after_training(self, package: RoundPackage, trained: list[ClientUpdate], arrived: list[ClientUpdate],
                       result: RoundResult) -> list[ClientUpdate]:
        """The uploads the server aggregates, of those that ``arrived`` (``trained``: every upload
        the engine produced, drop-outs included)."""
        return arrived

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> torch.Tensor:
        """The new global parameters (called only when ``takes_aggregation``)."""
        raise NotImplementedError

    def after_round(self, rnd: int, package: RoundPackage, updates: list[ClientUpdate], result: RoundResult) -> None:
        """After aggregation (and the algorithm's ``after_round``) of a training round."""

    def record(self, result: RoundResult) -> None:
        """A training round's entries in the run's history, written when the training loop records
        the round (``record_round``)."""

    # ------------------------------------------------------------------ persistence and reports
    def state_dict(self) -> dict[str, Any]:
        """What this plug-in keeps across rounds (for checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what ``state_dict`` returned (a resumed run)."""

    def summary(self) -> dict[str, object]:
        """Settings logged at the start of a run."""
        return {}


def wanted_plugins(args) -> list[type[RoundPlugin]]:
    """The plug-in classes the run's flags want, in calling order (not built: main.py asks them
    about the flags before any data is read)."""
    import_submodules("flcore.plugins")
    import_submodules("flcore.privacy")
    classes = [PLUGINS.get(name) for name in PLUGINS]
    return sorted((cls for cls in classes if cls.wanted(args)), key=lambda c: (c.order, c.registered_name))


def plugins_for(runtime: Runtime, server_cls: type) -> dict[str, RoundPlugin]:
    """Every plug-in the run's flags want, built and in calling order; at most one may take over
    aggregation."""
    built = {cls.registered_name: cls(runtime, server_cls) for cls in wanted_plugins(runtime.args)}
    for plugin in built.values():  # the stragglers plug-in retimes the clock's round
        plugin.peers = built
    takers = [name for name, plugin in built.items() if plugin.takes_aggregation]
    if len(takers) > 1:
        raise FLError(f"these options each replace the aggregation and exclude each other: {', '.join(takers)}")
    return built
