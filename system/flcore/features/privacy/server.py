"""The server's side of differential privacy, as a round plug-in (``flcore/features``): start-up
checks, DP-FedAvg's aggregation, and the per-round ε recorded in the run's history.

:class:`PrivacyPlugin` is wanted when a run uses ``-dp`` (DP-SGD, whose steps are the clients'
local-step strategy, ``flcore/features/privacy/dpsgd.py``) or ``--dp_update_clip`` (DP-FedAvg, which then
takes over aggregation). What persists lives where a checkpoint finds it: each client's DP-SGD
step count in ``client.dp_steps`` (carried client state, counted by the strategy) and the sampling
rate of every DP-FedAvg round in this plug-in's ``state_dict``.

Series (saved as ``rs_<name>``, one entry per training round):

* ``dp_epsilon``: sample-level ε of DP-SGD at ``--dp_delta``, the worst client's: client i took
  ``dp_steps`` steps at q_i = B/n_i with noise multiplier σ, and each client's training is its
  own mechanism over its own samples.
* ``dp_user_epsilon``: user-level ε of DP-FedAvg at ``--dp_delta``, over the rounds aggregated
  so far at q_t = |C_t|/N with noise multiplier z.
"""
from __future__ import annotations

from argparse import ArgumentParser

import logging
import math

import torch

from flcore.extension import RoundPlugin
from flcore.features.privacy import accounting, dpfedavg, dpsgd
from flcore.protocol import ClientUpdate, RoundPackage, RoundResult, Runtime
from flcore.registry import register_plugin
from cli.flags import add_flag
from utils.errors import FLError

log = logging.getLogger("fl")


@register_plugin("privacy")
class PrivacyPlugin(RoundPlugin):
    """DP-SGD's accounting and DP-FedAvg's aggregation for one run."""
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    flag_group = "differential privacy (PFLlib's -dp/-dps, plus ours; flcore/features/privacy)"
    flag_order = 20
    #: what persists (checkpoints): DP-FedAvg's sampling rate of every round so far
    carried = ("user_rates",)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-dp", "--privacy", type=bool, default=False,
                 help="sample-level DP-SGD on every client: per-sample clipping to --dp_clip, Gaussian noise -dps, "
                      "epsilon at --dp_delta recorded each round (rs_dp_epsilon; needs opacus)")
        add_flag(parser, "-dps", "--dp_sigma", type=float, default=0.0, low=0, help="DP-SGD noise multiplier sigma (noise std sigma*C)")
        add_flag(parser, "--dp_clip", type=float, default=1.0, above=0, help="DP-SGD per-sample gradient clipping norm C (PFLlib's 1.0)")
        add_flag(parser, "--dp_delta", type=float, default=1e-5, above=0, below=1, help="delta at which epsilon is reported (PFLlib's 1e-5)")
        add_flag(parser, "--dp_accountant", type=str, default="rdp", choices=["rdp", "prv"],
                 help="opacus accountant: rdp (Renyi DP of the sampled Gaussian mechanism) or prv (numerical composition)")
        add_flag(parser, "--dp_sampling", type=str, default="poisson", choices=["poisson", "shuffle"],
                 help="DP-SGD batches: poisson (each sample in each step with probability B/n: what the accountant "
                      "assumes) or shuffle (PFLlib's batches; epsilon is then an approximation)")
        add_flag(parser, "--dp_update_clip", type=float, default=0.0, low=0,
                 help="user-level DP-FedAvg (McMahan et al. 2018): clip each client's model update to this L2 norm S "
                      "(0 = off); epsilon recorded as rs_dp_user_epsilon")
        add_flag(parser, "--dp_server_sigma", type=float, default=0.0, low=0,
                 help="DP-FedAvg noise multiplier z: N(0, (z*S)^2) added to the weighted sum of clipped updates")
        add_flag(parser, "--dp_weight_cap", type=float, default=0.0, low=0,
                 help="DP-FedAvg weight cap w^: client weight min(n_k/w^, 1) (0 = the largest client's n_k, FedAvg's weights)")

    order = 50

    @classmethod
    def wanted(cls, args) -> bool:
        flags = cls.flags(args)
        return flags.privacy or flags.dp_update_clip > 0

    @classmethod
    def check(cls, args) -> None:
        """DP noise given without the mechanism it belongs to, DP-SGD in another precision than fp32
        (the ranges are declared with the flags)."""
        flags = cls.flags(args)
        if flags.privacy and args.precision != "fp32":
            raise FLError(f"--precision {args.precision} is not available with -dp (DP-SGD's clipping is checked in "
                          "fp32 only); drop --precision or -dp")
        if flags.dp_sigma > 0 and not flags.privacy:
            raise FLError("-dps sets DP-SGD's noise, which needs -dp (DP-SGD) to be on")
        if flags.dp_server_sigma > 0 and flags.dp_update_clip <= 0:
            raise FLError("--dp_server_sigma sets DP-FedAvg's noise, which needs --dp_update_clip > 0 (DP-FedAvg) to be on")

    @classmethod
    def warnings(cls, args, server_cls: type) -> list[str]:
        """Differential privacy without noise: epsilon is infinite."""
        flags, lines = cls.flags(args), []
        if flags.privacy and flags.dp_sigma == 0:
            lines.append("warning: -dp with -dps 0 (PFLlib's default) clips but adds no noise: epsilon is infinite, "
                         "no privacy; pass -dps > 0 (e.g. 1.0)")
        if flags.dp_update_clip > 0 and flags.dp_server_sigma == 0:
            lines.append("warning: --dp_update_clip without --dp_server_sigma clips the updates but adds no noise: "
                         "epsilon is infinite, no user-level privacy; pass --dp_server_sigma > 0")
        return lines

    def __init__(self, runtime: Runtime, server_cls: type):
        super().__init__(runtime, server_cls)
        args = runtime.args
        flags = self.flags(args)
        self.sgd = dpsgd.dp_sgd_config(args)  # the local-step strategy every client holds
        self.central = dpfedavg.dp_fedavg_config(flags, runtime.clients)
        self.takes_aggregation = self.central is not None
        self.accountant = flags.dp_accountant
        self.delta = flags.dp_delta
        self._epsilons: dict = {}  # a cache of ε per (q, steps): recomputed after a resume
        #: q_t = |C_t| / N of every round DP-FedAvg aggregated (the user-level accountant's steps)
        self.user_rates: list[float] = []
        if self.sgd is not None:
            dpsgd.check_composable(server_cls.client_cls, runtime.model)
        if self.central is not None:
            dpfedavg.check_composable(server_cls)
        accounting.accountant_class(self.accountant)  # opacus is present, or one line now
        if self.sgd is not None and not self.sgd.poisson:
            log.warning("warning: --dp_sampling shuffle: ε is computed as for Poisson sampling at q = B/n "
                        "(PFLlib's reading), an approximation for shuffled batches")

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> torch.Tensor:
        """DP-FedAvg's clipped, noised mean (only with ``--dp_update_clip``)."""
        clients = self.runtime.clients
        self.user_rates.append(package.cohort_size / len(clients))
        return self.central.aggregate(clients, self.args.seed, updates, package)

    def after_round(self, rnd: int, package: RoundPackage, updates: list[ClientUpdate], result: RoundResult) -> None:
        """Record this round's ε (the privacy spent so far) in the history."""
        if self.sgd is not None:
            self.runtime.history.add_series("dp_epsilon", self.sample_epsilon())
        if self.central is not None:
            self.runtime.history.add_series("dp_user_epsilon", self.user_epsilon())

    def sample_epsilon(self) -> float:
        clients = [(self.sgd.sample_rate(c.num_train, c.batch_size), c.dp_steps) for c in self.runtime.clients]
        return accounting.worst_client_epsilon(self.accountant, self.sgd.sigma, self.delta, clients, self._epsilons)

    def user_epsilon(self) -> float:
        steps = accounting.compress(self.user_rates)
        return accounting.epsilon(self.accountant, self.central.sigma, steps, self.delta)

    def results(self, history) -> dict[str, float]:
        """The final ε of each DP series of the run and its δ (for the summary and the h5 attributes)."""
        final = {name: float(values[-1]) for name, values in history.extra_series.items()
                 if name in ("dp_epsilon", "dp_user_epsilon") and values}
        if final:
            final["dp_delta"] = self.delta
        return final

    def lines(self, results: dict[str, float]) -> list[str]:
        """The summary lines that state the privacy guarantee of the run."""
        labels = {"dp_epsilon": "sample-level DP-SGD", "dp_user_epsilon": "user-level DP-FedAvg"}
        lines = []
        for name, label in labels.items():
            if name in results:
                value = results[name]
                shown = "inf (no noise: no guarantee)" if math.isinf(value) else f"{value:.3f}"
                lines.append(f"  privacy ({label}): epsilon {shown} at delta {results['dp_delta']:g}")
        return lines
