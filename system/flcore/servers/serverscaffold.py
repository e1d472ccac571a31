"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, ICML 2020, arXiv:1910.06378).

The server keeps a control variate c (zero at start) and sends it with the model, so download
bytes count it; clients upload their model y_i and Δc_i (upload bytes count both). With S the
uploads received and N the number of clients,

    x ← x + η_g · Σ_{i∈S} p_i (y_i − x),        c ← c + (1/N) · Σ_{i∈S} Δc_i.

Choices:

* ``--scaffold_weighting uniform`` (default, the paper's and PFLlib's rule) takes p_i = 1/|S| over
  the uploads actually received; PFLlib divides by the planned cohort size even when uploads are
  dropped (``-cdr``), which shrinks the step. ``samples`` uses p_i ∝ n_i (FedAvg's weighting).
* The global step acts on trainable parameters; float buffers (BatchNorm statistics, which have
  no control variate) take the plain p-weighted mean (PFLlib leaves them un-aggregated).
* A client whose upload is dropped has still updated its own c_i, as a real client would.
"""
from __future__ import annotations

from argparse import ArgumentParser

import numpy as np
import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientscaffold import ScaffoldClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from cli.flags import add_flag
from utils.errors import FLError


@register_algorithm("SCAFFOLD")
class ScaffoldServer(Server):
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    #: what persists across rounds (checkpoints): the server control variate
    carried = ("control",)

    client_cls = ScaffoldClient

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-slr", "--server_learning_rate", type=float, default=1.0, above=0,
                 help="SCAFFOLD global step size η_g in x ← x + η_g·mean(y_i − x)")
        add_flag(parser, "--scaffold_weighting", type=str, default="uniform", choices=["uniform", "samples"],
                 help="mean of the model updates: uniform over received uploads (paper, PFLlib) or by samples")

    def setup(self) -> None:
        if self.args.scaffold_correction == "step" and not self.args.local_momentum:
            raise FLError("--scaffold_correction step differs from the default only with --local_momentum "
                          "(without momentum both are the same step); set --local_momentum or drop it")
        self.control = torch.zeros_like(self.global_params[: self.model.num_params])

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        return self.package(rnd, cohort, extras={"control": self.control})

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        n = self.model.num_params
        weights = None if self.hp.scaffold_weighting == "samples" else np.full(len(updates), 1 / len(updates))
        mean = weighted_average(updates, weights)
        mean[:n] = self.global_params[:n] + self.hp.server_learning_rate * (mean[:n] - self.global_params[:n])
        self.global_params = mean
        delta_c = torch.zeros_like(self.control)
        for update in updates:
            delta_c.add_(update.extras["delta_control"].to(delta_c.device))
        # A new tensor, so the package that carried the old control is not modified.
        self.control = self.control + delta_c / len(self.clients)

    def summary(self) -> dict[str, object]:
        return {"server_learning_rate": self.hp.server_learning_rate,
                "scaffold_weighting": self.hp.scaffold_weighting}
