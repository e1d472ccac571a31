"""What a client or server class does differently from the base, computed once per class.

Engines and privacy ask "does this algorithm train by the base sequence's SGD?" or "does it
aggregate its own way?". Each used to answer it by comparing methods with the base classes, which
made them import the base classes they sit below. Instead, ``Client`` and ``Server`` compute a
:class:`Capabilities` for every subclass when it is defined (``__init_subclass__``) and store it
as the class attribute ``capabilities``; readers look it up on the class they are handed.

One trait is the batched engine's alone, computed here so that the base client does not carry it:
``rng_free_sequence``, whether a client class's local sequence outside ``train_job`` may read the
global torch RNG (``RNG_FREE_SEQUENCE``, the promise ``hooks_draw_no_rng`` and
:func:`promise_covers`). Where it may not, that engine plans the class's jobs lean
(``flcore/engines/batched.py``).
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
    #: a client class keeps the base version of every method of ``RNG_FREE_SEQUENCE``, or overrides
    #: only hooks it promises draw nothing (``hooks_draw_no_rng``, :func:`promise_covers`): nothing of
    #: its sequence outside ``train_job`` reads the global RNG (False for servers)
    rng_free_sequence: bool = False

    @classmethod
    def of(cls, subclass: type, base: type, hooks: tuple[str, ...]) -> "Capabilities":
        overrides = frozenset(name for name in hooks if getattr(subclass, name) is not getattr(base, name)
                              and not is_base_step_shortcut(subclass, name))
        rng_free = hasattr(base, "hooks_draw_no_rng") and keeps_rng_free_sequence(subclass, base)
        return cls(overrides, bool(getattr(subclass, "vectorisable", True)), bool(getattr(subclass, "vmappable_loss", False)),
                   rng_free)

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
LOCAL_PROCEDURE = ("train_job", "local_train", "sgd", "step_gradient", "compute_gradient", "batch_gradient")
#: the hooks a class may override with a shortcut of the base step (``base_step_shortcuts``)
SHORTCUT_HOOKS = ("compute_gradient",)
#: client hooks on the working model around the base SGD (an engine runs them per client)
AROUND_SGD = ("pre_training", "post_training")
#: every client hook whose override ``Capabilities`` records
CLIENT_HOOKS = (*LOCAL_PROCEDURE, "local_loss", "adjust_grad", "begin_round", "end_round", "start_point",
                "batch_plan", *AROUND_SGD)
#: every server hook whose override ``Capabilities`` records
SERVER_HOOKS = ("setup", "select_clients", "make_package", "aggregate", "after_round", "eval_params")


#: what a client's local sequence runs outside ``train_job``: the base versions draw nothing from the
#: global RNG (the plan draws from its own generator), so a class keeping all of them leaves it as
#: ``seed_round`` does
RNG_FREE_SEQUENCE = ("plan_job", "open_job", "finish_job", "seed_round", "batch_plan", "shuffled_plan",
                     "epochs_this_round", "begin_round", "start_point", "with_private", "learning_rate",
                     "pre_training", "post_training", "end_round", "samples_processed", "count_gradient_samples",
                     "check_loss")
#: the methods of ``RNG_FREE_SEQUENCE`` a class may override and still be planned lean, when it
#: promises ``hooks_draw_no_rng`` (not the plan's, nor those an engine runs from the saved RNG state)
RNG_PROMISABLE = ("begin_round", "start_point", "end_round")


def keeps_rng_free_sequence(cls: type, base: type) -> bool:
    """Whether client class ``cls`` keeps ``base``'s version of every method of ``RNG_FREE_SEQUENCE``,
    or overrides only promisable hooks its promise covers."""
    own = {name for name in RNG_FREE_SEQUENCE if getattr(cls, name) is not getattr(base, name)}
    return not own or (own <= set(RNG_PROMISABLE) and promise_covers(cls))


def promise_covers(cls: type) -> bool:
    """Whether ``cls``'s promisable hooks are those a ``hooks_draw_no_rng = True`` was made for: the
    nearest class of its MRO that sets the attribute says True, and ``cls`` has that class's versions
    of the hooks. A promise is made by someone who read the hooks, so one inherited by a subclass
    that replaces a hook (FedRep's ``begin_round`` over FedBABU's) does not vouch for the new one."""
    maker = next(k for k in cls.__mro__ if "hooks_draw_no_rng" in vars(k))  # the base client at the latest
    return bool(maker.hooks_draw_no_rng) and all(getattr(cls, name) is getattr(maker, name) for name in RNG_PROMISABLE)


def is_base_step_shortcut(cls: type, name: str) -> bool:
    """Whether ``cls``'s hook ``name`` is a shortcut of the base step that a class of its MRO declared
    in ``base_step_shortcuts``: the same gradient of the same loss, computed faster (FedRep's head
    steps on the frozen body's features). Such an override is not recorded, so engines and features
    that compute the base step their own way (threads, the batched engine's vmap, DP-SGD, data
    attacks) still take the class; it covers the declaring class's version only, as a promise does."""
    maker = next((k for k in cls.__mro__ if name in vars(k).get("base_step_shortcuts", ())), None)
    if maker is None:
        return False
    if name not in SHORTCUT_HOOKS:
        raise TypeError(f"{maker.__name__}.base_step_shortcuts names {name!r}; only {', '.join(SHORTCUT_HOOKS)} "
                        "may be a shortcut of the base step")
    return getattr(cls, name) is getattr(maker, name)
