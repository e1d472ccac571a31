"""The extension contract: what a cross-cutting feature (the virtual clock, differential privacy,
attacks, robust aggregation, stragglers, DLG, new clients) tells the platform about itself.

This module sits on the protocol's floor (``docs/architecture.md``, "Layers"): it imports the
protocol types and the flag machinery only. ``main.py``, ``cli/flags.py``, the result files and
the base classes never name a feature; they ask every registered one (:func:`flcore.features.features`):

Before any data is read (class level, from the flags):

    add_args(parser)                  the feature's flags, declared in its own file (every run
                                      has them: whether the feature is wanted depends on them)
    wanted(args) -> bool              whether the run uses it
    check(args)                       flags that contradict each other or lack the feature they
                                      belong to: raise ``FLError`` (one line; ``main.py`` exits 2).
                                      Asked of every feature, wanted or not
    warnings(args, server_cls) -> [line]
                                      settings under which the feature does something else than
                                      its name says (DP without noise): logged once
    compatible(server_cls) -> reason | None
                                      the algorithm's server class cannot take the feature (FedMA's
                                      global model changes widths): the run is refused with the reason
    public_data_user(args) -> name | None
                                      the option that needs ``--public_data``
    takes_clients(args) -> bool       the feature holds clients of the dataset out of training
                                      (``-nnc``), so it checks ``-nc`` itself
    split_dataset(args, dataset) -> (dataset, reserved)
                                      the clients it holds out, before the others are built
    summarize_series(history, target_acc) -> dict
                                      the summary's figures read off the series the feature
                                      records (the clock's virtual time to the target, the
                                      stragglers' staleness histogram): from a history alone,
                                      so ``reporting`` names no feature (``run_summary``)

While the run goes (instance level; a :class:`RoundPlugin` is built from the run's
:class:`~flcore.protocol.Runtime`): the round hooks (``flcore/features/__init__.py``), then

    finish()                          once after the last round (the new clients' evaluation)
    results(history) -> dict          the run's figures of this feature for the summary and the h5
                                      attributes (final ε, new clients' accuracy, DLG's PSNR)
    lines(results) -> [line]          the printed summary's lines of those figures
    summary() -> dict                 the settings logged at the start of the run
    carried, state_dict()             what it keeps across rounds, for checkpoints (:class:`Carries`,
                                      the persistence contract servers, selection policies and
                                      clients follow too)

A feature reads its own flags typed, as algorithms do: :meth:`Feature.flags` (built from its
``add_args``), never ``getattr(args, name, default)``.

A feature that changes how a client computes a local step (DP-SGD, data poisoning, weight decay)
is a :class:`LocalStep` (the interface of the local-step chain, ``flcore/clients/localstep.py``
composes them), written against :class:`Learner`, what a step asks of a client.
"""
from __future__ import annotations

from argparse import ArgumentParser, Namespace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import torch

from flcore.protocol import ClientUpdate, RoundPackage, RoundResult, Runtime
from cli.flags import declared_actions, hyperparameters
from utils.errors import FLError

if TYPE_CHECKING:  # annotations only
    from flcore.flat import FlatModel
    from flcore.protocol import LocalJob
    from fldata.loading import FederatedDataset
    from reporting.results import RunHistory


# ------------------------------------------------------------------ persistence
def carried_names(cls: type) -> tuple[str, ...]:
    """The attribute names ``cls`` and its bases declare ``carried``, bases' first, each once."""
    names: dict[str, None] = {}
    for klass in reversed(cls.__mro__):
        names.update(dict.fromkeys(vars(klass).get("carried", ())))
    return tuple(names)


def carried_values(obj: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The values of ``obj``'s attributes ``names`` (as they are: a checkpoint encodes copies)."""
    return {name: getattr(obj, name) for name in names}


def set_carried_values(obj: Any, names: tuple[str, ...], values: dict[str, Any], who: str) -> None:
    """Set the attributes ``values`` names on ``obj``; each must be one of ``names``, and every one of
    them must be given (a checkpoint holds all, or it is not this run's)."""
    unknown, missing = set(values) - set(names), set(names) - set(values)
    if unknown:
        raise FLError(f"{who}: {', '.join(sorted(unknown))} is no part of its carried state")
    if missing:
        raise FLError(f"{who}: the saved state lacks {', '.join(sorted(missing))}; rerun with --overwrite")
    for name, value in values.items():
        setattr(obj, name, value)


class Carries:
    """The persistence contract of what a run builds once and keeps across rounds: a server, a
    selection policy, a round plug-in (engines keep nothing across rounds). A class names, in ``carried``, the attributes
    that change from one round to the next (its bases' names are kept: a subclass names only its
    own); ``state_dict`` returns exactly those and ``load_state_dict`` puts them back into a freshly
    built object of the same run. Checkpoints save that and nothing else (``runner/checkpoint.py``
    encodes the values: tensors, arrays, plain data, modules, optimizers, generators, objects with
    ``checkpoint_state``). Everything else is rebuilt from the flags and the data. Clients declare
    ``carried`` the same way (``Client.carried_state``, the client-state contract)."""

    #: the attributes that change across rounds (this class's own; the bases' are added)
    carried: ClassVar[tuple[str, ...]] = ()

    def state_dict(self) -> dict[str, Any]:
        """What this object keeps across rounds (for checkpoints): its ``carried`` attributes."""
        return carried_values(self, carried_names(type(self)))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what ``state_dict`` returned (a resumed run)."""
        set_carried_values(self, carried_names(type(self)), state, type(self).__name__)


class Feature:
    """The class-level half of the contract (module docstring); every method has a neutral default."""

    #: the registered name (set by the registry's decorator)
    registered_name: ClassVar[str]
    #: the heading of this feature's flags in ``main.py -h`` (None: no flags of its own)
    flag_group: ClassVar[str | None] = None
    #: features are listed in ``-h`` and asked at start-up in increasing ``flag_order`` (ties: by name)
    flag_order: ClassVar[int] = 100

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        """Declare this feature's flags (called once per class in the MRO)."""

    @classmethod
    def flags(cls, args: Namespace) -> Any:
        """This feature's flags read from ``args`` as typed, frozen attributes (declared defaults
        for any ``args`` lacks)."""
        return hyperparameters(args, cls)

    @classmethod
    def wanted(cls, args: Namespace) -> bool:
        """Whether a run with these flags uses this feature."""
        return False

    @classmethod
    def changed_flags(cls, args: Namespace, besides: tuple[str, ...] = ()) -> list[str]:
        """This feature's flags (by first spelling) whose value is not their declared default,
        those of ``besides`` (destinations) left out."""
        return [action.option_strings[0] for action in declared_actions(cls)
                if action.dest not in besides and getattr(args, action.dest, action.default) != action.default]

    @classmethod
    def refuse_flags_without(cls, args: Namespace, switch: str, *dests: str) -> None:
        """One line when flags of this feature are given while its switch (the flag ``dests``, or one of
        them, spelt ``switch``) is off: they would change nothing."""
        given = cls.changed_flags(args, besides=dests)
        if given:
            raise FLError(f"{', '.join(given)} {'acts' if len(given) == 1 else 'act'} on {switch}, which is not given: "
                          f"add {switch} or drop {'it' if len(given) == 1 else 'them'}")

    @classmethod
    def check(cls, args: Namespace) -> None:
        """Refuse (``FLError``) flags of this feature that contradict each other or need it on."""

    @classmethod
    def warnings(cls, args: Namespace, server_cls: type) -> list[str]:
        """Warning lines for settings under which the feature is not what its name says."""
        return []

    @classmethod
    def compatible(cls, server_cls: type) -> str | None:
        """Why the algorithm of ``server_cls`` cannot take this feature (None: it can)."""
        return None

    @classmethod
    def public_data_user(cls, args: Namespace) -> str | None:
        """The option that needs ``--public_data`` with these flags (None: none does)."""
        return None

    @classmethod
    def takes_clients(cls, args: Namespace) -> bool:
        """Whether the feature holds clients of the dataset out of training (and checks ``-nc``)."""
        return False

    @classmethod
    def split_dataset(cls, args: Namespace, dataset: "FederatedDataset") -> tuple["FederatedDataset", Any]:
        """(the dataset the federation trains on, what this feature keeps apart); called once,
        before the clients are built, for a wanted feature that ``takes_clients``."""
        return dataset, None

    @classmethod
    def summarize_series(cls, history: "RunHistory", target_acc: float | None) -> dict[str, Any]:
        """Summary fields this feature reads off the series it records in ``history`` (``target_acc``:
        the run's ``--target_acc``, None without); {} when the history holds none of them."""
        return {}


class RoundPlugin(Carries, Feature):
    """A round plug-in; every hook does nothing by default (``flcore/features/__init__.py`` lists
    where ``Server.run_round`` calls them)."""

    #: plug-ins run in increasing order at each point (ties: by name)
    order: ClassVar[int] = 100
    #: whether this plug-in replaces the algorithm's ``aggregate`` (set per run in ``__init__``)
    takes_aggregation: bool = False
    #: why a model that diverges in this run has collapsed as measured, not by a setting to fix (the
    #: attack plug-in's "the model collapsed under --attack X"; None: divergence is an error)
    divergence_note: str | None = None
    #: every plug-in of the run by name, this one included (set once all are built)
    peers: dict[str, "RoundPlugin"] = {}

    @classmethod
    def wanted(cls, args: Namespace) -> bool:
        """Whether a run with these flags uses this plug-in (a round plug-in is wanted by default)."""
        return True

    def __init__(self, runtime: Runtime, server_cls: type):
        """``server_cls``: the algorithm's server class (its ``capabilities`` and ``client_cls``)."""
        self.runtime = runtime
        self.args = runtime.args

    # ------------------------------------------------------------------ hooks
    def before_selection(self, rnd: int, selecting: bool) -> None:
        """A training round begins; ``selecting``: its cohort is drawn (not given by the caller)."""

    def selectable(self, rnd: int) -> np.ndarray | None:
        """Which clients may be selected (a boolean mask over client positions; None: any)."""
        return None

    def after_selection(self, rnd: int, cohort: list[int]) -> list[int]:
        """The clients of ``cohort`` (drawn, or given by the caller) that train in round ``rnd``."""
        return cohort

    def after_evaluation(self, rnd: int, global_params: torch.Tensor, result: RoundResult) -> None:
        """The server has evaluated the global model ``global_params`` of round ``rnd`` (the model
        before that round's training; the final one after the last round): metrics of the same model."""

    def after_training(self, package: RoundPackage, trained: list[ClientUpdate], arrived: list[ClientUpdate],
                       result: RoundResult) -> list[ClientUpdate]:
        """The uploads the server aggregates, of those that ``arrived`` (``trained``: every upload
        the engine produced, drop-outs included)."""
        return arrived

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> torch.Tensor:
        """The new global parameters (called only when ``takes_aggregation``)."""
        raise NotImplementedError

    def after_round(self, rnd: int, package: RoundPackage, updates: list[ClientUpdate], result: RoundResult) -> None:
        """After aggregation (and the algorithm's ``after_round``) of a training round."""

    def observe_round(self, result: RoundResult) -> None:
        """The round is complete and timed: observers that measure it (DLG's reconstructions, the new
        clients' evaluation) run here, outside the round's recorded time."""

    def record(self, result: RoundResult) -> None:
        """A training round's entries in the run's history, written when the training loop records
        the round (``record_round``)."""

    # ------------------------------------------------------------------ reports
    def finish(self) -> None:
        """Once after the run's last round (also after an early stop)."""

    def summary(self) -> dict[str, object]:
        """Settings logged at the start of a run."""
        return {}

    def results(self, history: RunHistory) -> dict[str, Any]:
        """This plug-in's figures of the whole run, for the printed summary and the h5 attributes."""
        return {}

    def lines(self, results: dict[str, Any]) -> list[str]:
        """The printed summary's lines for the figures ``results`` returned."""
        return []


def refused_by_changing_widths(server_cls: type, option: str) -> str | None:
    """The reason an algorithm whose global model changes widths (``Server.changes_widths``: FedMA)
    cannot take ``option``, a feature that replays or mixes models in the working model's widths."""
    if not getattr(server_cls, "changes_widths", False):
        return None
    return (f"{server_cls.registered_name}'s global model changes widths (it aggregates by matching units), "
            f"which {option} cannot take; drop {option}")


# ------------------------------------------------------------------ local steps
class Learner(Protocol):
    """What a local-step strategy asks of the client it steps (``flcore/clients/clientbase.py``'s
    ``Client`` is one): its data, its shuffled batches, and its loss gradient on a minibatch."""

    data: Any

    def shuffled_plan(self, rnd: int, epochs: int, purpose: str) -> list[torch.Tensor]: ...

    def compute_gradient(self, model: "FlatModel", idx: torch.Tensor, ctx: dict) -> torch.Tensor: ...

    def count_gradient_samples(self, idx: torch.Tensor) -> None: ...

    def batch_gradient(self, model: "FlatModel", x: torch.Tensor, y: torch.Tensor, ctx: dict) -> torch.Tensor: ...


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

    @property
    def l2_term(self) -> float | None:
        """λ when this step is plain SGD whose gradient carries λ·w and nothing else (0.0 for plain
        SGD), which an engine that computes plain SGD its own way adds itself; None when it does more."""
        return 0.0 if self.plain else None

    # ------------------------------------------------------------------ the client's calls
    def prepare(self, client: "Learner") -> None:
        """Give a new client the starting values of the attributes this strategy carries."""

    def batch_plan(self, client: "Learner", rnd: int, epochs: int, purpose: str) -> list[torch.Tensor]:
        """The minibatches of round ``rnd`` (plain SGD's shuffled plan; a ``"plan"`` strategy's own)."""
        return client.shuffled_plan(rnd, epochs, purpose)

    def gradient(self, client: "Learner", model: "FlatModel", idx: torch.Tensor, ctx: dict, package: "RoundPackage",
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

    def job_finished(self, client: "Learner", job: "LocalJob") -> None:
        """After a client's round of local training (counts what this strategy accounts for)."""

    # ------------------------------------------------------------------ what a link transforms
    def transform_batch(self, client: "Learner", x: torch.Tensor, y: torch.Tensor,
                        package: "RoundPackage") -> tuple[torch.Tensor, torch.Tensor]:
        """A ``"data"`` strategy: the minibatch ``(x, y)`` of ``client`` in the round of ``package`` as
        it trains on it (new tensors; the client's own stay as they are)."""
        raise NotImplementedError

    def batch_gradient(self, client: "Learner", model: "FlatModel", x: torch.Tensor, y: torch.Tensor, ctx: dict,
                       package: "RoundPackage", step: int) -> torch.Tensor:
        """A ``"gradient"`` strategy: leave the gradient of local step ``step`` on the minibatch
        ``(x, y)`` in ``model.grad``; return the minibatch's loss."""
        raise NotImplementedError

    def add_term(self, client: "Learner", model: "FlatModel") -> None:
        """A ``"term"`` strategy: add its term to the step's gradient in ``model.grad``."""
        raise NotImplementedError
