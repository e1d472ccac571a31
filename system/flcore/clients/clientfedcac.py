"""FedCAC client (Wu, Liu, Niu, Zhu, Tang, "Bold but Cautious: Unlocking the Potential of
Personalized Federated Learning through Cautiously Aggressive Collaboration", ICCV 2023,
arXiv:2309.11103).

A client trains FedAvg's local SGD from its start point and then marks its critical parameters:
with w⁰ the start and w the trained model, the sensitivity of each parameter is |(w − w⁰) ⊙ w|,
and within every parameter tensor the top τ fraction (τ = ``-tau``) is critical (PFLlib's rule:
the threshold is the ⌊τ·size⌋-th largest sensitivity; when that is below 1e-10 it becomes the
smallest sensitivity above 1e-20, so parameters that did not move are not critical). It uploads
w and its critical mask (``extras["critical"]``, one byte per parameter) and keeps the mask
(state ``cac_mask``).

Its next start point takes the critical parameters from the customised model the server built
for it (``payload["customized"]``) and every other entry from the global model; float buffers
(BatchNorm statistics) come from the global model (PFLlib keeps the client's own). Before its
first mask the start is the global model. The server's side is in ``serverfedcac.py``.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, RoundPackage
from cli.flags import add_flag


def critical_mask(sensitivity: torch.Tensor, bounds: list[int], tau: float) -> torch.Tensor:
    """The top-τ entries of ``sensitivity`` within each tensor [bounds[k], bounds[k+1])."""
    mask = torch.zeros_like(sensitivity, dtype=torch.bool)
    for start, stop in zip(bounds[:-1], bounds[1:]):
        metric = sensitivity[start:stop]
        count = int(tau * metric.numel())
        if count == 0:
            continue  # PFLlib: an infinite threshold, nothing critical
        threshold = torch.topk(metric, count).values[-1]
        if threshold <= 1e-10:
            moved = metric[metric > 1e-20]
            if moved.numel():
                threshold = moved.min()
        mask[start:stop] = metric >= threshold
    return mask


class FedCACClient(Client):
    """FedAvg's local SGD from the critical/global mixture; uploads the critical mask."""
    hooks_draw_no_rng = True  # start_point/end_round: the state store's mask, the payload, top-k

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-tau", "--tau", type=float, default=0.5, low=0, high=1,
                 help="τ: fraction of each parameter tensor marked critical (PFLlib default 1: all of it)")
        add_flag(parser, "-bt", "--beta", type=float, default=50.0, above=0,
                 help="β: after β rounds only the most similar clients collaborate on critical parameters "
                      "(PFLlib default 0 fails its own check)")

    def start_point(self, package: RoundPackage) -> torch.Tensor:
        mask = self.state.get("cac_mask", self.index)
        customized = package.payload(self.index).get("customized")
        if mask is None or customized is None:
            return package.global_params
        start = package.global_params.clone()
        params = start[: mask.shape[0]]
        params[mask] = customized[: mask.shape[0]][mask]
        return start

    def end_round(self, params, package: RoundPackage, ctx, steps, loss) -> ClientUpdate:
        bounds = package.extras["cac_segments"].tolist()
        start = self.start_point(package)[: bounds[-1]]
        trained = params[: bounds[-1]]
        mask = critical_mask(((trained - start) * trained).abs(), bounds, self.hp.tau)
        self.state.set("cac_mask", self.index, mask)
        update = super().end_round(params, package, ctx, steps, loss)
        update.extras["critical"] = mask
        return update
