"""What a client or server class does differently from the base, computed once per class.

Engines and privacy ask "does this algorithm train by the base sequence's SGD?" or "does it
aggregate its own way?". Each used to answer it by comparing methods with the base classes, which
made them import the base classes they sit below. Instead, ``Client`` and ``Server`` compute a
:class:`Capabilities` for every subclass when it is defined (``__init_subclass__``) and store it
as the class attribute ``capabilities``; readers look it up on the class they are handed.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    """The hooks a class overrides (of those its base class lists) and its declared traits."""

    overrides: frozenset[str]
    #: the client's hooks touch only its own state, so engines may reorder or vectorise them
    vectorisable: bool = True
    #: an overridden ``local_loss`` is a pure tensor function (the batched engine may vmap it)
    vmappable_loss: bool = False

    @classmethod
    def of(cls, subclass: type, base: type, hooks: tuple[str, ...]) -> "Capabilities":
        overrides = frozenset(name for name in hooks if getattr(subclass, name) is not getattr(base, name))
        return cls(overrides, bool(getattr(subclass, "vectorisable", True)), bool(getattr(subclass, "vmappable_loss", False)))

    def overrides_any(self, *names: str) -> bool:
        return not self.overrides.isdisjoint(names)

    @property
    def own_loss(self) -> bool:
        """Whether the class changes the minibatch loss (``local_loss``)."""
        return "local_loss" in self.overrides

    @property
    def keeps_base_training(self) -> bool:
        """Whether the class trains by the base sequence's SGD (with possibly its own loss and
        gradient term) and promises that its hooks touch only its own state."""
        return self.vectorisable and not self.overrides_any(*LOCAL_PROCEDURE)


#: client hooks that replace the local procedure itself (not just a term of it)
LOCAL_PROCEDURE = ("train_job", "local_train", "sgd", "step_gradient", "compute_gradient")
#: client hooks on the working model around the base SGD (an engine runs them per client)
AROUND_SGD = ("pre_training", "post_training")
#: every client hook whose override ``Capabilities`` records
CLIENT_HOOKS = (*LOCAL_PROCEDURE, "local_loss", "adjust_grad", "begin_round", "end_round", "start_point",
                "batch_plan", *AROUND_SGD)
#: every server hook whose override ``Capabilities`` records
SERVER_HOOKS = ("setup", "select_clients", "make_package", "aggregate", "after_round", "eval_params")
