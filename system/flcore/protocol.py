"""The protocol types: what servers, clients, engines and plug-ins hand each other.

This module is the floor of the federated layer (``docs/architecture.md``, "Layers"): clients,
servers, engines, selectors and round plug-ins import their messages from here, and nothing here
imports any of them. A type that a lower module must name (an engine naming a client, a plug-in
naming the server it serves) is named through these types or under ``TYPE_CHECKING`` only.

* :class:`RoundPackage`: what the server sends to the round's cohort.
* :class:`SentOnce`: what each client already holds of the data a package sends once.
* :class:`ClientUpdate`: what one client uploads.
* :class:`Task`: what every client knows of the run besides its own data.
* :class:`LocalJob`: one client's local training in one round, as the sequence prepares it.
* :class:`RoundResult`: what one round produced (``Server.run_round``).
* :class:`Runtime`: what a service (evaluator, engine, plug-in) needs of a run: model, dataset,
  device, settings, clients, state store and history, without the server that owns them.

And the formulas that several layers above share, written once here: the cohort size a join
ratio gives (:func:`cohort_size`), FedAvg's sample weights (:func:`sample_weights`) and a filtering
defence's precision and recall against the attackers (:func:`filter_precision_recall`).
"""
from __future__ import annotations

import math
from argparse import Namespace
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch

from flcore.objectives import Objective, objective_of

if TYPE_CHECKING:  # annotations only: these modules sit at or below this layer's users
    from flcore.flat import FlatModel
    from flcore.state import ClientStateStore
    from fldata.loading import FederatedDataset
    from utils.metrics import EvalResult
    from reporting.results import RunHistory


def tensor_nbytes(tensors: dict[str, torch.Tensor]) -> int:
    """Bytes of a dictionary of tensors, as they travel (numel × element size)."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def with_private_part(params: torch.Tensor, shared: torch.Tensor | None, private: torch.Tensor | None) -> torch.Tensor:
    """``params`` with a client's ``private`` entries (those ``shared`` excludes) put in; ``params``
    itself when nothing is private or the client has no private part yet."""
    if shared is None or private is None:
        return params
    merged = params.clone()
    merged[~shared] = private.to(merged.dtype)
    return merged


@dataclass
class RoundPackage:
    """What the server sends to the selected clients in one round.

    ``extras`` go to every client; ``payloads[i]`` only to client ``i`` (FedAMP's and FedACS's
    personalised models). ``shared`` masks the entries of the model that are sent and aggregated
    (None: all of it); the others are each client's own. ``static`` is data a client keeps once it
    has it (KT-pFL's public inputs, FedMix's means): every client of the cohort reads it, but client
    ``i`` downloads only the ``static_nbytes[i]`` bytes it lacks (:class:`SentOnce`)."""

    round: int
    global_params: torch.Tensor
    cohort: list[int]
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    payloads: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    shared: torch.Tensor | None = None
    static: dict[str, torch.Tensor] = field(default_factory=dict)
    static_nbytes: dict[int, int] = field(default_factory=dict)
    #: the clients drawn for the round before plug-ins let busy ones sit out (None: ``cohort``)
    drawn: list[int] | None = None

    @property
    def cohort_size(self) -> int:
        return len(self.cohort)

    @property
    def drawn_cohort(self) -> list[int]:
        """The clients drawn for the round, those that sat it out included (``--straggler_busy skip``)."""
        return self.cohort if self.drawn is None else self.drawn

    def payload(self, index: int) -> dict[str, torch.Tensor]:
        return self.payloads.get(index, {})

    @cached_property
    def shared_numel(self) -> int:
        """How many entries of the model are sent and aggregated (counted once per round)."""
        return self.global_params.numel() if self.shared is None else int(self.shared.sum())

    def nbytes(self, index: int | None = None) -> int:
        """Bytes client ``index`` downloads (the shared part of the model, extras, its payload and
        the static data it lacks)."""
        own = tensor_nbytes(self.payload(index)) + self.static_nbytes.get(index, 0) if index is not None else 0
        return self.shared_numel * self.global_params.element_size() + tensor_nbytes(self.extras) + own

    def total_nbytes(self) -> int:
        """Bytes the whole cohort downloads."""
        return sum(self.nbytes(i) for i in self.cohort)


def _rows(value: torch.Tensor) -> int:
    return value.shape[0] if value.dim() else 1


def _extends(value: torch.Tensor, earlier: torch.Tensor) -> bool:
    """Whether ``value`` is ``earlier`` with rows appended at the end (or ``earlier`` itself)."""
    if value.dtype != earlier.dtype or value.dim() != earlier.dim():
        return False
    if value.dim() == 0:
        return bool(torch.equal(value, earlier))
    return (value.shape[1:] == earlier.shape[1:] and len(value) >= len(earlier)
            and bool(torch.equal(value[: len(earlier)], earlier)))


@dataclass
class SentOnce:
    """What each client holds of the data sent once (``RoundPackage.static``), so that a download
    counts an entry only where a client lacks it: the first time, and again after it changed. An
    entry that grows by rows appended at its end (FedMix's means, as clients join) costs a client
    that holds the earlier rows only the new ones. The server keeps one (``Server.sent_once``);
    checkpoints save it with the server's attributes."""

    #: the last value sent of each entry (a copy: a sender may change its tensor in place)
    sent: dict[str, torch.Tensor] = field(default_factory=dict)
    #: per entry, how many leading rows of its last value each client holds
    held: dict[str, dict[int, int]] = field(default_factory=dict)

    def deliver(self, static: dict[str, torch.Tensor], cohort: list[int]) -> dict[int, int]:
        """Bytes of ``static`` each client of ``cohort`` downloads; the cohort holds all of it after."""
        nbytes = dict.fromkeys(cohort, 0)
        for name, value in static.items():
            earlier, held = self.sent.get(name), self.held.setdefault(name, {})
            if earlier is None or not _extends(value, earlier):
                held.clear()  # new or changed: nobody holds it
            if earlier is None or earlier.shape != value.shape or held == {}:
                self.sent[name] = value.detach().clone()
            rows = _rows(value)
            row_bytes = value.numel() * value.element_size() // rows if rows else 0
            for i in cohort:
                nbytes[i] += (rows - held.get(i, 0)) * row_bytes
                held[i] = rows
        return nbytes


@dataclass
class ClientUpdate:
    """What one client uploads after local training (``params`` = its final model vector)."""

    index: int
    num_samples: int
    num_steps: int
    params: torch.Tensor
    loss: float
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    uploads_params: bool = True
    #: how many entries of ``params`` are really sent (the shared part); None = all
    shared_numel: int | None = None
    #: training samples the client processed this round (its work on the virtual clock)
    samples_processed: int = 0
    #: the round whose global model the upload started from (None: the round that aggregates it);
    #: the stragglers plug-in stamps it on the uploads it releases (features/stragglers.py)
    origin_round: int | None = None
    #: the global model the upload started from (None: the package of the round that aggregates it)
    origin_params: torch.Tensor | None = None
    #: whether the client attacked in the round it trained in (ground truth, for metrics only;
    #: None: no attack in the run), stamped by the attack plug-in (features/attacks.py)
    attacker: bool | None = None

    def nbytes(self) -> int:
        count = self.params.numel() if self.shared_numel is None else self.shared_numel
        size = count * self.params.element_size() if self.uploads_params else 0
        return size + tensor_nbytes(self.extras)

    def origin(self, package: RoundPackage) -> tuple[int, torch.Tensor]:
        """(the round this upload started from, that round's global model), aggregated in the round
        of ``package``: the package's own unless the upload arrived late."""
        start = package.round if self.origin_round is None else self.origin_round
        return start, package.global_params if self.origin_params is None else self.origin_params


@dataclass(frozen=True)
class Task:
    """What every client knows of the run besides its own data: the task's classes (not only those
    it holds), the length of the model's trainable prefix of the flat vector and the objective of
    the dataset's label type (its loss and metrics, flcore/objectives.py)."""

    num_classes: int
    num_params: int
    objective: "Objective" = field(default_factory=lambda: objective_of({}))


@dataclass
class LocalJob:
    """One client's local training in one round, as the sequence prepares it for an engine.
    ``client`` is the :class:`~flcore.clients.clientbase.Client` that runs it."""

    client: Any
    package: RoundPackage
    plan: list  # of index tensors; a lean job's may be one [steps, B] tensor of them (Client.plan_job)
    rng: tuple | None  # None: the engine left the global RNG alone (engines/batched.py: leaves_rng_alone)
    ctx: dict = field(default_factory=dict)
    start: torch.Tensor | None = None
    lr: float = 0.0

    @property
    def steps(self) -> int:
        return len(self.plan)


@dataclass
class RoundResult:
    """What one round produced (``Server.run_round``)."""

    round: int
    cohort: list[int] = field(default_factory=list)
    package: RoundPackage | None = None
    updates: list[ClientUpdate] = field(default_factory=list)
    evaluation: "EvalResult | None" = None
    seconds: float = 0.0
    eval_seconds: float = 0.0
    #: the round's duration on the virtual clock (flcore/features/clock.py), waits included
    virtual_seconds: float = 0.0
    #: bytes of every upload the round's clients made (``rs_bytes_up``), whether it reaches the
    #: server in this round, in a later one (a straggler) or never (a ``-cdr`` drop-out, a late upload
    #: the server ignores)
    sent_nbytes: int = 0
    #: bytes of uploads that reached the server in this round but that it threw away unread (those
    #: ``-tth`` rejects): with the uploads it kept they are what arrived (``rs_bytes_up_arrived``)
    discarded_nbytes: int = 0
    #: how many of ``updates`` the algorithm put into the model (None: all of them); FedBuff's
    #: buffered ones wait for a server step, Sageflow's filtered ones never enter it
    aggregated: int | None = None

    @property
    def trained(self) -> bool:
        return self.package is not None


@dataclass
class Runtime:
    """What the services of a run share: the working model, the data, the device, the settings,
    the clients, their state store and the run's history. The server builds it once and hands it
    to its evaluator, engine and plug-ins, which need nothing else of the server."""

    args: Namespace
    dataset: "FederatedDataset"
    device: torch.device
    model: "FlatModel"
    clients: list = field(default_factory=list)
    state: "ClientStateStore | None" = None
    history: "RunHistory | None" = None
    #: the entries of the model that clients upload and the server aggregates (None: all)
    shared: torch.Tensor | None = None
    #: reads the server's current global model (set by the server that owns the run)
    read_global: "Callable[[], torch.Tensor] | None" = None
    #: where the run's side files go, as a path without suffix (``<results>/<data>_<algo>_<goal>_<run>``;
    #: None: the run writes none, as in the benchmark): DLG's pictures
    artifacts: "Path | None" = None

    @property
    def global_params(self) -> torch.Tensor:
        """The server's current global model."""
        return self.read_global()

    @property
    def num_classes(self) -> int:
        return self.dataset.num_classes

    @cached_property
    def objective(self) -> "Objective":
        """The loss and metrics of the dataset's label type (flcore/objectives.py)."""
        return objective_of(self.dataset.config)


# ----------------------------------------------------------------------------- shared formulas
def cohort_size(num_clients: int, join_ratio: float) -> int:
    """The clients a round selects: :func:`joined_clients`, between 1 and N."""
    return max(1, min(num_clients, joined_clients(num_clients, join_ratio)))


def joined_clients(num_clients: int, join_ratio: float) -> int:
    """⌊N · jr⌋ (0: ``-jr`` selects nobody); the 1e-9 stops 0.29 · 100 from truncating to 28 (a
    PFLlib bug)."""
    return math.floor(num_clients * join_ratio + 1e-9)


def sample_weights(num_samples: Sequence[int] | np.ndarray) -> np.ndarray:
    """FedAvg's weights n_k / Σ n (float64); equal weights when no client has a sample."""
    counts = np.asarray(num_samples, dtype=np.float64)
    return counts / counts.sum() if counts.sum() > 0 else np.full(len(counts), 1 / len(counts))


def filter_precision_recall(kept: Sequence[ClientUpdate], dropped: Sequence[ClientUpdate]) -> tuple[float, float]:
    """(precision, recall) of a filter that left out ``dropped`` and kept ``kept``, against the
    uploads' ground truth (``ClientUpdate.attacker``): the share of attackers' among those left out,
    and the share of the attackers' uploads left out; NaN where nothing was left out, or no attacker
    uploaded."""
    caught = sum(1 for u in dropped if u.attacker)
    present = caught + sum(1 for u in kept if u.attacker)
    precision = caught / len(dropped) if dropped else float("nan")
    return precision, caught / present if present else float("nan")
