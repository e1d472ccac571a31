"""Differential privacy: sample-level DP-SGD on the client and user-level DP-FedAvg on the server,
accounted with opacus's RDP or PRV accountant (imported only when a run uses DP).

* :mod:`.dpsgd`: per-sample clipping and noise in the local step (``Client.step_gradient``),
  Poisson batches (``Client.batch_plan``), which algorithms and models compose with it.
* :mod:`.dpfedavg`: DP-FedAvg's clipped, noised, fixed-denominator mean (McMahan et al. 2018).
* :mod:`.accounting`: ε of the sampled Gaussian mechanism from opacus.
* :mod:`.server`: the server's checks, aggregation hook and per-round ε (``rs_dp_epsilon``,
  ``rs_dp_user_epsilon``).
"""
from flcore.features.privacy.dpsgd import DPSGD, dp_sgd_config

__all__ = ["DPSGD", "dp_sgd_config"]
