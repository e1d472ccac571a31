"""FedCP (Zhang et al., KDD 2023, arXiv:2307.01217): PFLlib's ``-algo FedCP``.

The server wraps the model with FedCP's global head and conditional policy network
(:class:`~flcore.clients.clientfedcp.FedCPModel`, ``build_module``), so both are part of the flat
vector. Clients upload the body, the CPN and their head mixture in the global head's place
(``shared``); FedAvg's sample-weighted mean of the uploads is the new global body, CPN and global
head, as PFLlib averages the three. The personalised heads stay with the clients; each client is
evaluated with its own (the initial head before its first round). There is no meaningful global
model. The client's side is in ``clientfedcp.py``.
"""
from __future__ import annotations

from torch import nn

from flcore.clients.clientfedcp import FedCPClient
from flcore.trainmodel.fedcp import FedCPLayout, FedCPModel
from flcore.common.labelmeans import require_body_head, require_linear_head
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from utils.errors import FLError


@register_algorithm("FedCP")
class FedCPServer(Server):
    client_cls = FedCPClient
    personalized = True
    has_global_model = False
    shared = ("body.", "global_head.", "policy.")

    def build_module(self, module: nn.Module) -> nn.Module:
        require_body_head(module, "FedCP", self.args.model)
        require_linear_head(module, "FedCP", self.args.model, bias=True)
        return FedCPModel(module)

    def setup(self) -> None:
        segments = {seg.name: seg for seg in self.model.segments}

        def span(name: str) -> tuple[int, int]:
            weight, bias = segments[f"{name}.weight"], segments[f"{name}.bias"]
            if weight.stop != bias.start:
                raise FLError(f"FedCP: the {name}'s weight and bias are not adjacent in the flat vector")
            return weight.start, bias.stop

        head = self.model.module.head
        layout = FedCPLayout(span("head"), span("global_head"), head.out_features, head.in_features)
        for client in self.clients:
            client.configure(fedcp_layout=layout)

    def summary(self) -> dict[str, object]:
        return {"lamda": self.hp.lamda, "head_mix": self.hp.fedcp_head_mix}
