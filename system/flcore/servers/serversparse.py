"""What the servers of the mask-based algorithms share (pFedEff, LotteryFL, Hermes); registers no
algorithm itself.

* The dense global model is never sent: each client's payload is a sparse message
  (``flcore/common/sparsemask.py``), and the package's ``global_params`` is empty, so
  ``rs_bytes_down`` counts exactly the values and index bytes sent; uploads carry only their
  message, so ``rs_bytes_up`` does too.
* ``aggregate``: each entry is the sample-weighted mean over the uploads that sent it; the others
  keep their value. Each upload's sent mask is handed to ``received`` (LotteryFL remembers it).
* Series: ``rs_sparsity`` (the mean share of the trainable entries that the personal masks of the
  round's uploaders drop; read from the state store as a measurement, as evaluation reads models) and ``rs_comm_volume`` (the round's bytes, both ways, over what FedAvg
  sends for the same cohort and uploads: the dense model each way).
* Clients are evaluated with their personal models (the initial model before they first train);
  the aggregate is reported as the global model.
"""
from __future__ import annotations

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.common.sparsemask import decode, masked_average
from flcore.servers.serverbase import Server
from utils.errors import FLError


class SparseExchangeServer(Server):
    personalized = True

    def setup(self) -> None:
        fraction = self.hp.kept_fraction
        if not 0.0 < fraction <= 1.0:
            raise FLError(f"-kf/--kept_fraction must be in (0, 1], got {fraction}")
        if any(plugin.takes_aggregation for plugin in self.plugins.values()):
            raise FLError(f"{self.args.algorithm} uploads sparse messages, which DP-FedAvg's clipped mean cannot take; "
                          "drop --dp_update_clip")
        self.initial_params = self.global_params.clone()
        for client in self.clients:
            client.configure(segments=self.model.segments, initial_params=self.initial_params)

    def summary(self) -> dict[str, object]:
        return {"kept_fraction": self.hp.kept_fraction}

    def sparse_package(self, rnd: int, cohort: list[int], messages: dict[int, dict[str, torch.Tensor]]) -> RoundPackage:
        """The round's package: per-client sparse messages and no dense model."""
        nothing = self.global_params.new_empty(0)
        return RoundPackage(rnd, nothing, cohort, payloads=messages)

    def received(self, index: int, sent: torch.Tensor, values: torch.Tensor) -> None:
        """What client ``index`` uploaded (its sent mask and the dense values); remembered by subclasses."""

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        n = self.global_params.numel()
        messages = []
        for update in updates:
            values, sent = decode(update.extras, n)
            self.received(update.index, sent, values)
            messages.append((values, sent))
        self.global_params = masked_average(messages, [u.num_samples for u in updates], self.global_params)

    def after_round(self, rnd: int, package: RoundPackage, updates: list[ClientUpdate]) -> None:
        num_params = self.model.num_params
        if updates:
            zeroed = [1.0 - float(self.state.get("mask", u.index)[:num_params].sum()) / num_params for u in updates]
            self.history.add_series("sparsity", sum(zeroed) / len(zeroed))
        else:
            self.history.add_series("sparsity", float("nan"))
        dense = self.global_params.numel() * self.global_params.element_size()
        sent = package.total_nbytes() + sum(u.nbytes() for u in updates)
        transfers = len(package.cohort) + len(updates)
        self.history.add_series("comm_volume", sent / (dense * transfers) if transfers else float("nan"))
        super().after_round(rnd, package, updates)

    def eval_params(self, index: int) -> torch.Tensor:
        personal = self.state.get("personal", index)
        return self.initial_params if personal is None else personal
