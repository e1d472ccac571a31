"""The local-step strategies of a client: which minibatches a round takes, what a minibatch holds
and which gradient a step uses. The base client delegates all three to its ``local_step``, so ways
of computing a step that are not the algorithm's (DP-SGD's clipped, noised per-sample gradients and
Poisson batches, an attacker's poisoned minibatches) live in their own modules, and the base client
has no branch for them.

* :class:`LocalStep`: plain minibatch SGD (a fresh permutation per epoch; one backward pass).
* Other strategies register with ``@register_local_step(name)``, say from the flags whether a run
  uses them (``wanted(args)``) and declare what they transform (``transforms``) and where they
  stand in the chain (``order``). Each transforms some of:

  - ``"plan"``: which minibatches a round takes (``batch_plan``; DP-SGD's Poisson batches);
  - ``"data"``: what a minibatch holds (``transform_batch(client, x, y, package) -> (x, y)``; the
    data attacks' poisoned labels and triggers, ``plugins/attacks.py``);
  - ``"gradient"``: how a step's gradient is computed from the minibatch (``batch_gradient``;
    DP-SGD's clipping and noise per sample, ``flcore/privacy/dpsgd.py``);
  - ``"term"``: a term added to the step's gradient once it is computed (``add_term``;
    :class:`WeightDecayStep`'s λ·w, ``--weight_decay``), before the algorithm's own term
    (``adjust_grad``) and ``--local_momentum``'s buffer.

A run's strategies compose into one chain (:class:`LocalStepChain`, :func:`local_step_for`),
applied in increasing ``order``: the plan is drawn by the one strategy that transforms it (plain
SGD's shuffled plan otherwise); each step's minibatch ``(x, y)`` is read from the client's rows
and passed through every ``"data"`` strategy in turn; its gradient is then computed on the
result by the one strategy that transforms the gradient (the client's ``batch_gradient``,
``local_loss``'s backward pass, otherwise). So ``-dp --attack label_flip`` clips and noises, per
sample, the gradients of the *flipped* labels: the data attacks are ``order`` 10, DP-SGD 50.
Refused, in one line saying why, are only chains that mean nothing: two strategies that each draw
the plan, two that each compute the gradient, or one that transforms the data after the gradient
is taken.

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

#: what a strategy may transform, in the order a step applies them
TRANSFORMS = ("plan", "data", "gradient", "term")


class LocalStep:
    """Plain minibatch SGD: the client's shuffled batches and the loss gradient of one backward; the
    base of every strategy, and of the chain of several (module docstring)."""

    name: ClassVar[str] = "sgd"
    #: what this strategy transforms (of ``TRANSFORMS``); plain SGD none
    transforms: ClassVar[frozenset[str]] = frozenset()
    #: where this strategy stands in a chain (increasing)
    order: ClassVar[int] = 100
    #: client attributes this strategy keeps across rounds (saved by checkpoints, sent by Ray)
    carried: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def wanted(cls, args: Namespace) -> bool:
        """Whether a run with these flags uses this strategy."""
        return False

    @classmethod
    def from_args(cls, args: Namespace) -> "LocalStep":
        return cls()

    @property
    def links(self) -> tuple["LocalStep", ...]:
        """The strategies this one applies, in order (itself; none for plain SGD; a chain's links)."""
        return (self,) if self.transforms else ()

    @property
    def plain(self) -> bool:
        """Whether this is plain SGD's step, which an engine may compute its own way (threads, vmap)
        from the client's hooks."""
        return not self.links

    # ------------------------------------------------------------------ the client's calls
    def prepare(self, client: "Client") -> None:
        """Give a new client the starting values of the attributes this strategy carries."""

    def batch_plan(self, client: "Client", rnd: int, epochs: int, purpose: str) -> list[torch.Tensor]:
        """The minibatches of round ``rnd`` (plain SGD's shuffled plan; a ``"plan"`` strategy's own)."""
        return client.shuffled_plan(rnd, epochs, purpose)

    def gradient(self, client: "Client", model: "FlatModel", idx: torch.Tensor, ctx: dict, package: "RoundPackage",
                 step: int) -> torch.Tensor:
        """Leave the gradient of local step ``step`` of the round of ``package`` on the minibatch ``idx``
        in ``model.grad``; return the minibatch's loss: the rows through every ``"data"`` link in
        order, then the gradient of the ``"gradient"`` link (module docstring)."""
        links = self.links
        if not any(link.transforms & {"data", "gradient"} for link in links):
            loss = client.compute_gradient(model, idx, ctx)
        else:
            client.count_gradient_samples(idx)
            x, y = client.data.inputs("train", idx), client.data.train_y[idx]
            for link in links:
                if "data" in link.transforms:
                    x, y = link.transform_batch(client, x, y, package)
            computer = next((link for link in links if "gradient" in link.transforms), None)
            if computer is None:
                loss = client.batch_gradient(model, x, y, ctx)
            else:
                loss = computer.batch_gradient(client, model, x, y, ctx, package, step)
        for link in links:
            if "term" in link.transforms:
                link.add_term(client, model)
        return loss

    def job_finished(self, client: "Client", job: "LocalJob") -> None:
        """After a client's round of local training (counts what this strategy accounts for)."""

    # ------------------------------------------------------------------ what a link transforms
    def transform_batch(self, client: "Client", x: torch.Tensor, y: torch.Tensor,
                        package: "RoundPackage") -> tuple[torch.Tensor, torch.Tensor]:
        """A ``"data"`` strategy: the minibatch ``(x, y)`` of ``client`` in the round of ``package`` as
        it trains on it (new tensors; the client's own stay as they are)."""
        raise NotImplementedError

    def batch_gradient(self, client: "Client", model: "FlatModel", x: torch.Tensor, y: torch.Tensor, ctx: dict,
                       package: "RoundPackage", step: int) -> torch.Tensor:
        """A ``"gradient"`` strategy: leave the gradient of local step ``step`` on the minibatch
        ``(x, y)`` in ``model.grad``; return the minibatch's loss."""
        raise NotImplementedError

    def add_term(self, client: "Client", model: "FlatModel") -> None:
        """A ``"term"`` strategy: add its term to the step's gradient in ``model.grad``."""
        raise NotImplementedError


@register_local_step("weight_decay")
class WeightDecayStep(LocalStep):
    """Plain SGD whose gradient carries L2 weight decay λ·w over every trainable parameter, as
    ``torch.optim.SGD(weight_decay=λ)``: the term is added to the loss gradient before the
    algorithm's own term (``adjust_grad``) and before ``--local_momentum``'s buffer (NIID-Bench and
    its Flower baseline train with λ = 1e-5). It is not ``plain``: the batched engine trains such
    clients sequentially rather than dropping the term. Clients with their own optimiser (those
    ``--local_momentum`` does not reach) are refused."""

    name: ClassVar[str] = "weight_decay"
    transforms: ClassVar[frozenset[str]] = frozenset({"term"})
    order: ClassVar[int] = 90

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

    def add_term(self, client: "Client", model: "FlatModel") -> None:
        model.grad.add_(model.params, alpha=self.weight_decay)


#: the strategy of every run without another one (it holds no state: one object serves all)
PLAIN_SGD = LocalStep()


class LocalStepChain(LocalStep):
    """Several strategies applied as one (module docstring); built by :func:`local_step_for`."""

    def __init__(self, links: tuple[LocalStep, ...]):
        self._links = links

    @property
    def links(self) -> tuple[LocalStep, ...]:
        return self._links

    @property
    def name(self) -> str:  # type: ignore[override]
        return " then ".join(link.name for link in self._links)

    @property
    def carried(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(name for link in self._links for name in link.carried)

    def prepare(self, client: "Client") -> None:
        for link in self._links:
            link.prepare(client)

    def batch_plan(self, client: "Client", rnd: int, epochs: int, purpose: str) -> list[torch.Tensor]:
        planner = next((link for link in self._links if "plan" in link.transforms), PLAIN_SGD)
        return planner.batch_plan(client, rnd, epochs, purpose)

    def job_finished(self, client: "Client", job: "LocalJob") -> None:
        for link in self._links:
            link.job_finished(client, job)


def compose(steps: list[LocalStep]) -> LocalStep:
    """The strategies ``steps`` as one, in increasing ``order`` (plain SGD for none, a strategy
    itself when alone); a chain that means nothing is refused in one line saying why."""
    links = tuple(sorted(steps, key=lambda step: step.order))
    for what, meaning in (("plan", "draw the round's minibatches"), ("gradient", "compute the step's gradient")):
        doers = [link.name for link in links if what in link.transforms]
        if len(doers) > 1:
            raise FLError(f"{' and '.join(doers)} each {meaning} their own way, and a step has one; choose one of them")
    computer = next((link for link in links if "gradient" in link.transforms), None)
    late = [link.name for link in links if "data" in link.transforms and computer is not None and link.order > computer.order]
    if late:
        raise FLError(f"{', '.join(late)} would change the minibatch after {computer.name} took its gradient; "
                      f"it must come before it in the chain (a lower order)")
    if not links:
        return PLAIN_SGD
    return links[0] if len(links) == 1 else LocalStepChain(links)


def local_step_for(args: Namespace) -> LocalStep:
    """The local step the run's flags ask for: plain SGD, one strategy, or their chain."""
    import_submodules("flcore.privacy")
    import_submodules("flcore.plugins")  # data poisoning (plugins/attacks.py) is a local step too
    return compose([LOCAL_STEPS.get(name).from_args(args) for name in LOCAL_STEPS if LOCAL_STEPS.get(name).wanted(args)])
