"""GPFL (Zhang et al., ICCV 2023, arXiv:2308.10279): PFLlib's ``-algo GPFL``.

The server wraps the model with GPFL's global category embedding and conditional valve
(:class:`~flcore.clients.clientgpfl.GPFLModel`, ``build_module``), so they are part of the flat
vector; clients upload the body, GCE and CoV (``shared``), which are averaged sample-weighted as
in FedAvg (PFLlib averages the three the same way), and keep their heads and conditions. Each
client is evaluated with its head on the personalised route, with the condition p_i its next
round would train with (``eval_params``; ``--gpfl_condition``); there is no meaningful global
model (its head is the initial one). The client's side is in ``clientgpfl.py``.
"""
from __future__ import annotations

import torch
from torch import nn

from flcore.clients.clientgpfl import GPFLClient
from flcore.trainmodel.gpfl import GPFLLayout, GPFLModel
from flcore.common.labelmeans import require_body_head, require_linear_head
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server


@register_algorithm("GPFL")
class GPFLServer(Server):
    client_cls = GPFLClient
    personalized = True
    has_global_model = False
    shared = ("body.", "gce.", "cov.")

    def build_module(self, module: nn.Module) -> nn.Module:
        require_body_head(module, "GPFL", self.args.model)
        require_linear_head(module, "GPFL", self.args.model)
        return GPFLModel(module, self.num_classes)

    def setup(self) -> None:
        segments = {seg.name: seg for seg in self.model.segments}
        gce, condition = segments["gce.weight"], segments["condition"]
        cov = [seg for seg in self.model.segments if seg.name.startswith("cov.")]
        layout = GPFLLayout(gce=(gce.start, gce.stop), decayed=(gce.start, cov[-1].stop),
                            condition=(condition.start, condition.stop), num_classes=self.num_classes,
                            dim=self.model.module.head.in_features)
        for client in self.clients:
            client.configure(gpfl_layout=layout)

    def summary(self) -> dict[str, object]:
        return {"lamda": self.hp.lamda, "mu": self.hp.mu, "mlg": self.hp.gpfl_mlg, "condition": self.hp.gpfl_condition}

    def eval_params(self, index: int) -> torch.Tensor:
        params = super().eval_params(index).clone()
        client = self.clients[index]
        a, b = client.gpfl_layout.condition
        params[a:b] = client.conditions(self.global_params)[1].to(params)
        return params
