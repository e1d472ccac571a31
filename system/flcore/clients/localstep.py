"""The local-step strategy of a client: which minibatches a round takes and which gradient a step
uses. The base client delegates both to its ``local_step``, so ways of computing a step that are
not the algorithm's (DP-SGD's clipped, noised per-sample gradients and Poisson batches) live in
their own module, and the base client has no branch for them.

* :class:`LocalStep`: plain minibatch SGD (a fresh permutation per epoch; one backward pass).
* Other strategies register with ``@register_local_step(name)`` and say from the flags whether a
  run uses them (``wanted(args)``); :func:`local_step_for` picks the one a run's flags ask for
  (at most one may be wanted). DP-SGD (``flcore/privacy/dpsgd.py``) is one.

A strategy holds no per-client state itself: what it counts per client lives in the client
attributes it names in ``carried`` (part of the client-state contract, ``Client.carried_state``).
"""
from __future__ import annotations

from argparse import Namespace
from typing import TYPE_CHECKING, ClassVar

import torch

from flcore.registry import LOCAL_STEPS, import_submodules
from utils.errors import FLError

if TYPE_CHECKING:
    from flcore.clients.clientbase import Client
    from flcore.flat import FlatModel
    from flcore.protocol import LocalJob, RoundPackage


class LocalStep:
    """Plain minibatch SGD: the client's shuffled batches and the loss gradient of one backward."""

    name: ClassVar[str] = "sgd"
    #: client attributes this strategy keeps across rounds (saved by checkpoints, sent by Ray)
    carried: ClassVar[tuple[str, ...]] = ()
    #: whether an engine may compute this step its own way (threads, vmap) from the client's hooks
    plain: ClassVar[bool] = True

    @classmethod
    def wanted(cls, args: Namespace) -> bool:
        """Whether a run with these flags uses this strategy."""
        return False

    @classmethod
    def from_args(cls, args: Namespace) -> "LocalStep":
        return cls()

    def prepare(self, client: "Client") -> None:
        """Give a new client the starting values of the attributes this strategy carries."""

    def batch_plan(self, client: "Client", rnd: int, epochs: int, purpose: str) -> list[torch.Tensor]:
        return client.shuffled_plan(rnd, epochs, purpose)

    def gradient(self, client: "Client", model: "FlatModel", idx: torch.Tensor, ctx: dict, package: "RoundPackage",
                 step: int) -> torch.Tensor:
        """Leave the gradient of local step ``step`` of the round of ``package`` in ``model.grad``;
        return the minibatch's loss."""
        return client.compute_gradient(model, idx, ctx)

    def job_finished(self, client: "Client", job: "LocalJob") -> None:
        """After a client's round of local training (counts what this strategy accounts for)."""


#: the strategy of every run without another one (it holds no state: one object serves all)
PLAIN_SGD = LocalStep()


def local_step_for(args: Namespace) -> LocalStep:
    """The local-step strategy the run's flags ask for (plain SGD when none does)."""
    import_submodules("flcore.privacy")
    import_submodules("flcore.plugins")  # data poisoning (plugins/attacks.py) is a local step too
    wanted = [LOCAL_STEPS.get(name) for name in LOCAL_STEPS if LOCAL_STEPS.get(name).wanted(args)]
    if len(wanted) > 1:
        raise FLError(f"these local-step options exclude each other: {', '.join(c.name for c in wanted)}; choose one")
    return wanted[0].from_args(args) if wanted else PLAIN_SGD
