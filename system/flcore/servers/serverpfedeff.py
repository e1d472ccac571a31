"""pFedEff (Shi, Zhang, Fan, Ma, Guan, IEEE TCDS 2024, doi:10.1109/TCDS.2023.3288985): the server.

The clients' rules (magnitude masks, approximated regulariser, upload importance mask) are in
``clientpfedeff.py``. The server:

* personalised aggregation: each entry of the global model G is the sample-weighted mean of the
  values uploaded there this round (entries nobody uploaded keep their value), and each client's
  download is chosen for that client alone;
* download importance mask: the server keeps its view v_i of what client i holds (the values it
  sent to i and received from i; the initial model at first: the state ``known``) and sends i, per
  layer, the ⌈K · ⌈K · size⌉⌉ entries where G differs most from v_i (only entries that differ:
  nothing is sent that the client already has), as values plus indices or bitmap; float buffers
  that changed are always sent.

Clients are evaluated with their sparse personal models; G is reported as the global model. With
``-kf 1`` every upload and download is complete and G is FedAvg's model bit for bit (the download
sends every entry that differs from what the client holds, which is then exactly G).
"""
from __future__ import annotations

import torch

from flcore.protocol import RoundPackage
from flcore.clients.clientpfedeff import PFedEffClient
from flcore.common.sparsemask import encode, kept_count, keep_largest, param_groups
from flcore.registry import register_algorithm
from flcore.servers.serversparse import SparseExchangeServer


@register_algorithm("pFedEff")
class PFedEffServer(SparseExchangeServer):
    client_cls = PFedEffClient

    def summary(self) -> dict[str, object]:
        return {**super().summary(), "magnitude_decay": self.hp.magnitude_decay}

    def known(self, index: int) -> torch.Tensor:
        """The server's view of client ``index``'s model."""
        return self.state.get("known", index, init=self.initial_params.clone)

    def download_mask(self, known: torch.Tensor) -> torch.Tensor:
        importance = (self.global_params - known).abs()
        changed = importance > 0
        fraction = self.hp.kept_fraction
        groups = param_groups(self.model.segments)
        counts = [kept_count(kept_count(b - a, fraction), fraction) for a, b in groups]
        return keep_largest(importance, groups, fraction, eligible=changed, counts=counts) & changed

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        messages = {}
        for i in cohort:
            known = self.known(i).clone()
            down = self.download_mask(known)
            known[down] = self.global_params[down]
            self.state.set("known", i, known)
            messages[i] = encode(self.global_params, down)
        return self.sparse_package(rnd, cohort, messages)

    def received(self, index: int, sent: torch.Tensor, values: torch.Tensor) -> None:
        self.state.set("known", index, torch.where(sent, values, self.known(index)))
