"""Divergence as a measured outcome (``--record_divergence``).

By default a run whose training produces NaN/inf (a client's loss, or the aggregated model) stops
with one line of advice and exit status 2: the setting is to be fixed, and its results so far are
kept in a file marked unfinished. Some published settings diverge by design: NIID-Bench's #C = 1
rows and SCAFFOLD on Fashion-MNIST #C = 2 read 10% (chance) in its table, so a reproduction has
to show whether the same run diverges, not refuse to report it. With ``--record_divergence`` the
divergence is the run's result instead, as it is for an attack that collapses the model: the file
is written finished, with ``diverged_round`` (the round whose training produced NaN/inf) and the
accuracies evaluated before it, the run exits 0, and reports count it among the collapsed runs.
"""
from __future__ import annotations

from argparse import ArgumentParser

from cli.flags import add_flag
from flcore.extension import RoundPlugin
from flcore.protocol import Runtime
from flcore.registry import register_plugin


@register_plugin("divergence")
class RecordDivergence(RoundPlugin):
    """Makes a NaN/inf in training the run's recorded outcome (module docstring); no round hooks."""

    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)
    flag_group = "divergence (flcore/features/divergence.py)"
    flag_order = 90

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--record_divergence", type=bool, default=False,
                 help="record a run whose training produces NaN/inf as diverged (finished file with diverged_round, "
                      "exit 0) instead of stopping with an error; for settings that diverge by design")

    @classmethod
    def wanted(cls, args) -> bool:
        return bool(cls.flags(args).record_divergence)

    def __init__(self, runtime: Runtime, server_cls: type):
        super().__init__(runtime, server_cls)
        self.divergence_note = "the model diverged; recorded as the run's outcome (--record_divergence)"
