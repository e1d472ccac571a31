"""Round plug-ins: the features of a run that are not the algorithm's (the virtual clock,
differential privacy, attacks, robust aggregation, stragglers, DLG, new clients).

A plug-in subclasses :class:`~flcore.extension.RoundPlugin` (the contract: its flags, start-up
checks, warnings, compatibility and summary lines, ``flcore/extension.py``), registers with ``@register_plugin(name)`` in a module of
this package (or of ``flcore/features/privacy``), and says from the flags whether a run uses it
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
                                          the clock drops -cdr's uploads and times the round;
                                          -tth drops late uploads
    aggregate(updates, package) -> new global parameters
                                          only the plug-in whose ``takes_aggregation`` is true
                                          (at most one per run): DP-FedAvg's noised mean
    after_round(rnd, package, updates, result)
                                          per-round series (ε of the privacy spent so far)
    observe_round(result)                 the round is complete and timed: DLG attacks its
                                          uploads, the new clients are evaluated (-nnc)
    record(result)                        when the training loop records a round in the history
                                          (``record_round``; not when a caller runs
                                          ``run_round`` alone): the clock's series

A plug-in gets the run's :class:`~flcore.protocol.Runtime` (model, data, device, flags, clients,
state, history) and the algorithm's server class (for start-up checks on its ``capabilities``),
never the server object. What it keeps across rounds it names in ``carried`` (the persistence
contract, :class:`~flcore.extension.Carries`: plain data, tensors, arrays); checkpoints save its
``state_dict()`` under its name.
"""
from __future__ import annotations

import functools
from argparse import Namespace

from typing import Any

from flcore.extension import RoundPlugin
from flcore.protocol import Runtime
from flcore.registry import PLUGINS, import_submodules
from reporting.results import RunHistory, summarize
from utils.errors import FLError

__all__ = ["RoundPlugin", "features", "wanted_plugins", "plugins_for", "split_for_features", "run_summary"]


@functools.cache
def _import_features() -> None:
    """Import every feature module once, so that their decorators fill the plug-in registry."""
    import_submodules("flcore.features")
    import_submodules("flcore.features.privacy")


@functools.lru_cache(maxsize=None)
def _in_flag_order(classes: tuple[type[RoundPlugin], ...]) -> tuple[type[RoundPlugin], ...]:
    return tuple(sorted(classes, key=lambda c: (c.flag_order, c.registered_name)))


def features() -> list[type[RoundPlugin]]:
    """Every registered feature class, in the order ``main.py -h`` lists their flags and start-up
    asks them (``flag_order``, then name). The packages are walked and the order computed once
    (again only for a registry that changed since: a test's own plug-in)."""
    _import_features()
    return list(_in_flag_order(tuple(PLUGINS.get(name) for name in PLUGINS)))


def wanted_plugins(args: Namespace) -> list[type[RoundPlugin]]:
    """The plug-in classes the run's flags want, in calling order (not built: main.py asks them
    about the flags before any data is read)."""
    return sorted((cls for cls in features() if cls.wanted(args)), key=lambda c: (c.order, c.registered_name))


def incompatibility(args: Namespace, server_cls: type) -> str | None:
    """Why the algorithm of ``server_cls`` cannot take a feature the flags want (None: it takes all)."""
    for cls in wanted_plugins(args):
        reason = cls.compatible(server_cls)
        if reason:
            return reason
    return None


def split_for_features(args: Namespace, dataset):
    """``dataset`` without the clients the wanted features hold out (``-nnc``'s new clients), each
    feature's part kept on it under the feature's name (``dataset.reserved``). Idempotent: a
    dataset split once (by ``main.py``, before the public set is drawn) is returned as it is."""
    if getattr(dataset, "reserved", None) is not None:
        return dataset
    reserved = {}
    for cls in wanted_plugins(args):
        if cls.takes_clients(args):
            dataset, reserved[cls.registered_name] = cls.split_dataset(args, dataset)
    dataset.reserved = reserved
    return dataset


def plugins_for(runtime: Runtime, server_cls: type) -> dict[str, RoundPlugin]:
    """Every plug-in the run's flags want, built and in calling order; at most one may take over
    aggregation, and each must fit the algorithm (``compatible``)."""
    reason = incompatibility(runtime.args, server_cls)
    if reason:
        raise FLError(reason)
    built = {cls.registered_name: cls(runtime, server_cls) for cls in wanted_plugins(runtime.args)}
    for plugin in built.values():  # the stragglers plug-in retimes the clock's round
        plugin.peers = built
    takers = [name for name, plugin in built.items() if plugin.takes_aggregation]
    if len(takers) > 1:
        raise FLError(f"these options each replace the aggregation and exclude each other: {', '.join(takers)}")
    return built


def run_summary(history: RunHistory, avg_last: int, target_acc: float | None, model_bytes: int) -> dict[str, Any]:
    """The headline figures of the run ``history`` recorded: the platform's (``summarize``) and
    those every feature reads off its own series (``summarize_series``); {} before any evaluation."""
    summary = summarize(history, avg_last, target_acc, model_bytes)
    if summary:
        for cls in features():
            summary.update(cls.summarize_series(history, target_acc))
    return summary
