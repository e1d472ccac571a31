"""The server's side of differential privacy: start-up checks, DP-FedAvg's aggregation, and the
per-round ε recorded in the run's history.

``Server`` calls three things (``flcore/servers/serverbase.py``): :func:`make_server_privacy` once
(None when the run uses no DP), :meth:`ServerPrivacy.aggregate` in place of ``aggregate`` and
:meth:`ServerPrivacy.account` after each training round. What persists lives where a checkpoint
finds it: each client's DP-SGD step count in ``client.dp_steps`` (counted by ``finish_job``) and
the sampling rate of every DP-FedAvg round in ``server.dp_user_rates``.

Series (saved as ``rs_<name>``, one entry per training round):

* ``dp_epsilon``: sample-level ε of DP-SGD at ``--dp_delta``, the worst client's: client i took
  ``dp_steps`` steps at q_i = B/n_i with noise multiplier σ, and each client's training is its
  own mechanism over its own samples.
* ``dp_user_epsilon``: user-level ε of DP-FedAvg at ``--dp_delta``, over the rounds aggregated
  so far at q_t = |C_t|/N with noise multiplier z.
"""
from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from flcore.privacy import accounting, dpfedavg, dpsgd

if TYPE_CHECKING:
    from flcore.clients.clientbase import ClientUpdate, RoundPackage
    from flcore.servers.serverbase import Server

log = logging.getLogger("fl")


class ServerPrivacy:
    """DP-SGD's accounting and DP-FedAvg's aggregation for one server."""

    def __init__(self, server: "Server"):
        args = server.args
        self.server = server
        self.sgd = dpsgd.dp_sgd_config(args)  # the object every client holds as ``client.dp``
        self.central = dpfedavg.dp_fedavg_config(args, server.clients)
        self.accountant = str(args.dp_accountant)
        self.delta = float(args.dp_delta)
        self._epsilons: dict = {}  # a cache of ε per (q, steps): recomputed after a resume
        if self.sgd is not None:
            dpsgd.check_composable(server.client_cls, server.model)
        if self.central is not None:
            dpfedavg.check_composable(type(server))
            if not hasattr(server, "dp_user_rates"):
                server.dp_user_rates = []
        accounting.accountant_class(self.accountant)  # opacus is present, or one line now
        if self.sgd is not None and not self.sgd.poisson:
            log.warning("warning: --dp_sampling shuffle: ε is computed as for Poisson sampling at q = B/n "
                        "(PFLlib's reading), an approximation for shuffled batches")

    def aggregate(self, updates: list["ClientUpdate"], package: "RoundPackage") -> None:
        """DP-FedAvg's clipped, noised mean when ``--dp_update_clip`` is on, else the algorithm's own."""
        if self.central is None:
            self.server.aggregate(updates, package)
            return
        self.server.global_params = self.central.aggregate(self.server, updates, package)
        self.server.dp_user_rates.append(package.cohort_size / len(self.server.clients))

    def account(self) -> None:
        """Record this round's ε (the privacy spent so far) in the history."""
        if self.sgd is not None:
            self.server.history.add_series("dp_epsilon", self.sample_epsilon())
        if self.central is not None:
            self.server.history.add_series("dp_user_epsilon", self.user_epsilon())

    def sample_epsilon(self) -> float:
        clients = [(self.sgd.sample_rate(c.num_train, c.batch_size), c.dp_steps) for c in self.server.clients]
        return accounting.worst_client_epsilon(self.accountant, self.sgd.sigma, self.delta, clients, self._epsilons)

    def user_epsilon(self) -> float:
        steps = accounting.compress(self.server.dp_user_rates)
        return accounting.epsilon(self.accountant, self.central.sigma, steps, self.delta)


def make_server_privacy(server: "Server") -> ServerPrivacy | None:
    """The server's privacy machinery, or None when the run uses neither ``-dp`` nor DP-FedAvg."""
    if not getattr(server.args, "privacy", False) and float(getattr(server.args, "dp_update_clip", 0.0) or 0.0) <= 0:
        return None
    return ServerPrivacy(server)


def privacy_summary(history, args) -> dict[str, float]:
    """The final ε of each DP series of a run and its δ (for the summary and the h5 attributes)."""
    final = {name: float(values[-1]) for name, values in history.extra_series.items()
             if name in ("dp_epsilon", "dp_user_epsilon") and values}
    if final:
        final["dp_delta"] = float(args.dp_delta)
    return final


def privacy_lines(summary: dict) -> list[str]:
    """The summary lines that state the privacy guarantee of a run."""
    labels = {"dp_epsilon": "sample-level DP-SGD", "dp_user_epsilon": "user-level DP-FedAvg"}
    lines = []
    for name, label in labels.items():
        if name in summary:
            value = summary[name]
            shown = "inf (no noise: no guarantee)" if math.isinf(value) else f"{value:.3f}"
            lines.append(f"  privacy ({label}): epsilon {shown} at delta {summary['dp_delta']:g}")
    return lines
