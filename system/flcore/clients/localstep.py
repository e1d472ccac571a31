"""The local-step strategy of a client: which minibatches a round takes and which gradient a step
uses. The base client delegates both to its ``local_step``, so ways of computing a step that are
not the algorithm's (DP-SGD's clipped, noised per-sample gradients and Poisson batches) live in
their own module, and the base client has no branch for them.

* :class:`LocalStep`: plain minibatch SGD (a fresh permutation per epoch; one backward pass).
* :class:`WeightDecayStep`: plain SGD with L2 weight decay (``--weight_decay λ``).
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

from flcore.registry import LOCAL_STEPS, import_submodules, register_local_step
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


@register_local_step("weight_decay")
class WeightDecayStep(LocalStep):
    """Plain SGD whose gradient carries L2 weight decay λ·w over every trainable parameter, as
    ``torch.optim.SGD(weight_decay=λ)``: the term is added to the loss gradient before the
    algorithm's own term (``adjust_grad``) and before ``--local_momentum``'s buffer (NIID-Bench and
    its Flower baseline train with λ = 1e-5). It is not ``plain``: the batched engine trains such
    clients sequentially rather than dropping the term. Clients with their own optimiser (those
    ``--local_momentum`` does not reach) are refused."""

    name: ClassVar[str] = "weight_decay"
    plain: ClassVar[bool] = False

    def __init__(self, weight_decay: float):
        self.weight_decay = weight_decay

    @classmethod
    def wanted(cls, args: Namespace) -> bool:
        return bool(getattr(args, "weight_decay", 0.0))

    @classmethod
    def from_args(cls, args: Namespace) -> "LocalStep":
        return cls(float(args.weight_decay))

    def prepare(self, client: "Client") -> None:
        if not type(client).uses_local_momentum():
            raise FLError(f"--weight_decay: {type(client).__name__} trains with its own optimiser, not the base "
                          "client's SGD; run it without --weight_decay")

    def gradient(self, client: "Client", model: "FlatModel", idx: torch.Tensor, ctx: dict, package: "RoundPackage",
                 step: int) -> torch.Tensor:
        loss = client.compute_gradient(model, idx, ctx)
        model.grad.add_(model.params, alpha=self.weight_decay)
        return loss


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
