"""FedMA client (Wang et al., ICLR 2020): trains its model of the original widths with the matched
layers frozen.

The client keeps its own trained model (the state ``local``; the common initial model before it
first trains). Each round the server sends it the values of the first ``received_layers`` layers
(hidden layers bottom-up, then the head), taken from the matched global model at the global units
its own units were matched to (``serverfedma.py``); the first ``frozen_layers`` of them are not
trained (their gradient is zeroed). During the layer-wise phase the received layers are the frozen
ones and the layers above are the client's own, retrained; in the later communication rounds the
whole model is received and trained. The upload is the trained layers (the frozen ones are not
sent) and the client's count of training samples per class (the head is averaged by them).
"""
from __future__ import annotations

from typing import ClassVar

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, RoundPackage


class FedMAClient(Client):
    """Local SGD from the received matched layers and its own layers above, the frozen ones fixed."""
    hooks_draw_no_rng = True  # start_point/begin_round/end_round read and write the state store and payload

    #: ``layer_masks``: row k marks the entries of layer k (hidden layers, then the head) in the flat
    #: vector; ``initial_params``: the common initial model. Both set once by the server.
    settable: ClassVar[tuple[str, ...]] = (*Client.settable, "layer_masks", "initial_params")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.layer_masks: torch.Tensor | None = None
        self.initial_params: torch.Tensor | None = None

    def layers(self, package: RoundPackage, name: str) -> torch.Tensor:
        """The entries of the first ``package.extras[name]`` layers."""
        count = int(package.extras[name])
        return self.layer_masks[:count].any(0)

    def start_point(self, package: RoundPackage) -> torch.Tensor:
        own = self.state.get("local", self.index, init=self.initial_params.clone)
        received = self.layers(package, "received_layers")
        start = own.clone()
        start[received] = package.payload(self.index)["model"].to(start.dtype)
        return start

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        frozen = self.layers(package, "frozen_layers")[: self.task.num_params]
        return {"trainable": (~frozen).to(self.initial_params.dtype)}

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        return g * ctx["trainable"]

    def end_round(self, params: torch.Tensor, package: RoundPackage, ctx: dict[str, torch.Tensor], steps: int,
                  loss: float) -> ClientUpdate:
        self.state.set("local", self.index, params)
        counts = torch.bincount(self.data.train_y.long(), minlength=self.task.num_classes).to(torch.float32)
        sent = int((~self.layers(package, "frozen_layers")).sum())
        return ClientUpdate(self.index, self.num_train, steps, params, loss, extras={"label_counts": counts},
                            shared_numel=sent)
