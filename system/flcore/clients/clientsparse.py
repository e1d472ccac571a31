"""The client the mask-based algorithms share (pFedEff, LotteryFL): the model's layout and the
common initial model, given once by the server (``configure``), the ``-kf`` flag, and the personal
model and mask kept in the state store (``personal``, ``mask``), which never leave the client; its
uploads carry a sparse message only (``flcore/common/sparsemask.py``). The server side is
``flcore/servers/serversparse.py``."""
from __future__ import annotations

from argparse import ArgumentParser
from typing import ClassVar

import torch

from flcore.clients.clientbase import Client
from flcore.flat import Segment
from flcore.protocol import ClientUpdate
from cli.flags import add_flag


def sparse_update(client: Client, steps: int, loss: float, message: dict[str, torch.Tensor],
                  like: torch.Tensor) -> ClientUpdate:
    """An upload that carries only ``message`` (the model itself is not sent: ``params`` is empty)."""
    empty = like.new_empty(0)
    return ClientUpdate(client.index, client.data.num_train, steps, empty, loss, extras=message, uploads_params=False)


class SparseClient(Client):
    """What the mask-based clients share: ``-kf``, the model's layout and the common initial model
    (set once by the server), and the personal model and mask in the state store."""
    uploads_instead = "sparse, masked messages"

    settable: ClassVar[tuple[str, ...]] = (*Client.settable, "segments", "initial_params")

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-kf", "--kept_fraction", type=float, default=0.5, above=0, high=1,
                 help="fraction of the model each client keeps (0, 1]: pFedEff's magnitude masks and the exchanged "
                      "share of what is kept; LotteryFL's and Hermes' pruning target (0.75/0.5/0.25 = the -75/-50/-25 "
                      "variants; 1 = dense)")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.segments: tuple[Segment, ...] = ()
        self.initial_params: torch.Tensor | None = None

    def personal(self) -> torch.Tensor:
        """This client's model (the common initial model before its first participation)."""
        return self.state.get("personal", self.index, init=self.initial_params.clone)

    def mask(self) -> torch.Tensor:
        """This client's kept entries over the whole vector (all of it before its first pruning)."""
        return self.state.get("mask", self.index,
                              init=lambda: torch.ones(self.initial_params.numel(), dtype=torch.bool,
                                                      device=self.initial_params.device))
