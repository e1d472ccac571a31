"""FedLC client: logit calibration (Zhang et al., ICML 2022, arXiv:2209.00189).

Client c trains on the calibrated cross-entropy

    ℓ = −log( exp(f_y(x) − τ·n_{c,y}^{−1/4}) / Σ_{y'} exp(f_{y'}(x) − τ·n_{c,y'}^{−1/4}) ),

n_{c,y} being the number of training samples of class y at client c: every logit is lowered by a
per-class margin that is larger for rarer classes, so the raw logits the model learns are less
biased towards the client's frequent classes. Only training changes; evaluation uses the raw
logits. The softmax runs over all classes, as in PFLlib.

* ``--fedlc_counts client`` (default, the paper's n_{c,y}): the client's own label counts.
  ``global`` is PFLlib's reading: every client calibrates with the label counts summed over all
  clients (which the server gathers once at the start), so all clients share one margin vector.
* A class without samples (n = 0) gets an infinite margin, so it takes no part in the softmax:
  the limit of the formula, and what PFLlib computes (0^{−1/4} = ∞). With τ = 0 every margin is 0
  (also for absent classes) and the loss is the plain cross-entropy: FedAvg.

The margins are a per-client constant tensor in the round's context, so the batched engine runs
the loss. The server gives each client the task's number of classes (``serverfedlc.py``).
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import RoundPackage
from flcore.flat import Net
from cli.flags import add_flag


def calibration_margins(counts: torch.Tensor, tau: float, dtype: torch.dtype) -> torch.Tensor:
    """τ·n_y^{−1/4} per class y from the label counts n; ∞ for classes without samples when τ > 0."""
    counts = counts.to(dtype)
    margins = tau * counts.clamp(min=1).pow(-0.25)
    absent = torch.inf if tau > 0 else 0.0
    return torch.where(counts > 0, margins, torch.full_like(margins, absent))


class FedLCClient(Client):
    """Local SGD on the logit-calibrated cross-entropy."""
    hooks_draw_no_rng = True  # begin_round: margins from the label counts

    vmappable_loss = True
    #: PFLlib's label counts over all clients (``--fedlc_counts global``); None = this client's own
    global_counts: torch.Tensor | None = None
    settable = (*Client.settable, "global_counts")

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-tau", "--tau", type=float, default=1.0, low=0,
                 help="FedLC calibration strength τ in f_y − τ·n_y^(−1/4) (PFLlib default 1.0; 0 = FedAvg)")
        add_flag(parser, "--fedlc_counts", type=str, default="client", choices=["client", "global"],
                 help="label counts n_y of the margins: the client's own (paper) or summed over all clients (PFLlib)")

    def label_counts(self) -> torch.Tensor:
        if self.global_counts is not None:
            return self.global_counts
        return torch.bincount(self.data.train_y, minlength=self.task.num_classes)

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        margins = calibration_margins(self.label_counts(), self.hp.tau, package.global_params.dtype)
        return {"margins": margins.to(package.global_params.device)}

    def local_loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(net(x) - ctx["margins"], y)
