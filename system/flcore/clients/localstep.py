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
    data attacks' poisoned labels and triggers, ``features/attacks.py``);
  - ``"gradient"``: how a step's gradient is computed from the minibatch (``batch_gradient``;
    DP-SGD's clipping and noise per sample, ``flcore/features/privacy/dpsgd.py``);
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

from flcore.extension import Learner, LocalStep

if TYPE_CHECKING:
    from flcore.flat import FlatModel
    from flcore.protocol import LocalJob

@register_local_step("weight_decay")
class WeightDecayStep(LocalStep):
    """Plain SGD whose gradient carries L2 weight decay λ·w over every trainable parameter, as
    ``torch.optim.SGD(weight_decay=λ)``: the term is added to the loss gradient before the
    algorithm's own term (``adjust_grad``) and before ``--local_momentum``'s buffer (NIID-Bench and
    its Flower baseline train with λ = 1e-5). It is not ``plain`` but declares its ``l2_term``, which
    the batched engine adds to its per-client gradients itself. Clients with their own optimiser
    (those ``--local_momentum`` does not reach) are refused."""
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    name: ClassVar[str] = "weight_decay"
    transforms: ClassVar[frozenset[str]] = frozenset({"term"})
    order: ClassVar[int] = 90

    def __init__(self, weight_decay: float):
        self.weight_decay = weight_decay

    @classmethod
    def wanted(cls, args: Namespace) -> bool:
        return bool(args.weight_decay)

    @classmethod
    def from_args(cls, args: Namespace) -> "LocalStep":
        return cls(float(args.weight_decay))

    def prepare(self, client: "Learner") -> None:
        if not type(client).uses_local_momentum():
            raise FLError(f"--weight_decay: {type(client).__name__} trains with its own optimiser, not the base "
                          "client's SGD; run it without --weight_decay")

    @property
    def l2_term(self) -> float | None:
        return self.weight_decay

    def add_term(self, client: "Learner", model: "FlatModel") -> None:
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

    def prepare(self, client: "Learner") -> None:
        for link in self._links:
            link.prepare(client)

    def batch_plan(self, client: "Learner", rnd: int, epochs: int, purpose: str) -> list[torch.Tensor]:
        planner = next((link for link in self._links if "plan" in link.transforms), PLAIN_SGD)
        return planner.batch_plan(client, rnd, epochs, purpose)

    def job_finished(self, client: "Learner", job: "LocalJob") -> None:
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
    import_submodules("flcore.features.privacy")
    import_submodules("flcore.features")  # data poisoning (features/attacks.py) is a local step too
    return compose([LOCAL_STEPS.get(name).from_args(args) for name in LOCAL_STEPS if LOCAL_STEPS.get(name).wanted(args)])
