"""FedALA (Zhang et al., AAAI 2023, arXiv:2212.01197): FedAvg's server, clients aggregate adaptively.

Aggregation is FedAvg's (sample-weighted mean of the uploads); the algorithm is on the client
(``clientfedala.py``). What this file decides is when ALA runs and which model is evaluated:

* ``--ala_all_clients False`` (default): ALA runs on a client when it is selected, just before its
  local training. A client is evaluated with its latest local model (after local training), or
  the global model before its first participation. ALA therefore costs nothing for clients that
  do not train.
* ``--ala_all_clients True`` (PFLlib's ``send_models``): after every aggregation ALA runs on
  **every** client with the new global model, and clients are evaluated on the result, i.e. after
  ALA and before local training, as PFLlib does (its log says "Evaluate global model"). Every
  client's local model starts as the initial model, as in PFLlib, so a client that has never
  trained mixes the global model with the initial one.

Either way the global model's accuracy is recorded too (``rs_test_acc_global``).
"""
from __future__ import annotations

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedala import FedALAClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from utils.errors import FLError


@register_algorithm("FedALA")
class FedALAServer(Server):
    client_cls = FedALAClient
    personalized = True

    # --ala_all_clients is declared by FedALAClient, which reads it too (the server's hp holds its client's flags).

    def setup(self) -> None:
        hp = self.hp
        checks = {
            "-s must be in [0, 100]": 0 <= hp.rand_percent <= 100,
            "-p must be >= 0": hp.layer_idx >= 0,
            "-et must be >= 0": hp.eta >= 0,
            "--ala_threshold must be >= 0": hp.ala_threshold >= 0,
            "--ala_num_pre_loss must be >= 1": hp.ala_num_pre_loss >= 1,
            "--ala_max_init_epochs must be >= 1": hp.ala_max_init_epochs >= 1,
        }
        for message, ok in checks.items():
            if not ok:
                raise FLError(message)
        if hp.ala_all_clients:
            for client in self.clients:
                self.state.set("local", client.index, self.global_params)

    def after_round(self, rnd: int, package: RoundPackage, updates: list[ClientUpdate]) -> None:
        super().after_round(rnd, package, updates)
        if self.hp.ala_all_clients:
            for client in self.clients:
                mixed = client.adaptive_local_aggregation(self.model, self.global_params, rnd + 1)
                self.state.set("local", client.index, mixed)

    def eval_params(self, index: int) -> torch.Tensor:
        local = self.state.get("local", index)
        return self.global_params if local is None else local

    def summary(self) -> dict[str, object]:
        hp = self.hp
        return {"eta": hp.eta, "rand_percent": hp.rand_percent, "layer_idx": hp.layer_idx,
                "ala_sample": hp.ala_sample, "ala_threshold": hp.ala_threshold,
                "ala_all_clients": hp.ala_all_clients}
