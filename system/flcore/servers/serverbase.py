"""The base server: the only round loop of the platform.

One round (PFLlib's order), :meth:`Server.run_round`::

    plug-ins: before_selection(t, selecting)   the clock waits for an available client
    cohort  = select_clients(t)      the selection policy, among the clients the plug-ins allow
    evaluate(t)                      every -eg rounds, before training, so entry 0 is the initial model
    plug-ins: after_evaluation(...)            metrics of the evaluated model (the backdoor's success rate)
    package = make_package(t, cohort)
    updates = engine.train(clients, package)   the one seam to local training
    updates = plug-ins: after_training(...)    the virtual clock drops (-cdr) and times the round; -tth
    aggregate(updates, package)                or the one plug-in that takes it over (DP-FedAvg);
                                               then the private part of the model is restored
    after_round(t, package, updates)
    plug-ins: after_round(...)                 per-round series (ε of the privacy spent)

Round plug-ins (``flcore/features``: the virtual clock, differential privacy) are built from the
flags through their registry, here, so every way of building a server gets the same ones.

``train`` runs it for every round and hands each :class:`RoundResult` to callbacks (history,
progress bar, auto-break); the benchmark and the tests call ``run_round`` themselves.

PFLlib runs ``gr + 1`` rounds and evaluates before each, so the last round's training is never
measured. We evaluate at rounds 0..gr and train rounds 0..gr-1: the recorded curve is identical
and the unmeasured final training is skipped. ``rs_eval_rounds`` holds how many aggregations each
evaluation saw.

Algorithms subclass :class:`Server`, set ``client_cls`` and override the hooks above; flags are
declared with an ``add_args`` classmethod in the algorithm's own file. ``shared`` says which part
of the model is uploaded and aggregated (``"all"``, ``"body"``, ``"head"``, ``"no_norm"`` or
name prefixes); the rest stays with each client and is evaluated as part of its model.
"""
from __future__ import annotations

import logging
import time
from argparse import ArgumentParser, Namespace
from pathlib import Path
from typing import Callable, ClassVar, Sequence

import numpy as np
import torch
from torch import nn

from flcore.capabilities import SERVER_HOOKS, Capabilities
from flcore.clients.clientbase import Client
from flcore.clients.localstep import PLAIN_SGD, local_step_for
from flcore.evaluation import Evaluator, resolve_eval_batch
from flcore.flat import FlatModel
from flcore.extension import Carries, RoundPlugin
from flcore.features import plugins_for, split_for_features, wanted_plugins
from flcore.objectives import declares, objective_of, refusal
# RoundResult is the protocol's; importable from here as before
from flcore.protocol import ClientUpdate, RoundPackage, RoundResult, Runtime, SentOnce, Task, sample_weights, with_private_part  # noqa: F401
from flcore.registry import ALGORITHMS, ENGINES, SELECTORS
from flcore.state import make_state_store
from flcore.trainmodel.layout import resolve_conv_layout, use_channels_last
from cli.flags import hyperparameters
from fldata.loading import FederatedDataset
from utils.errors import Diverged, FLError
from utils.metrics import EvalResult
from fldata.public import PublicData, require_public_data
from reporting.results import RunHistory

log = logging.getLogger("fl")


def weighted_average(updates: list[ClientUpdate], weights: list[float] | np.ndarray | None = None) -> torch.Tensor:
    """Σ_k w_k · params_k accumulated in place, in update order (default w_k ∝ samples)."""
    if weights is None:
        weights = sample_weights([u.num_samples for u in updates])
    total = torch.zeros_like(updates[0].params)
    for update, weight in zip(updates, weights):
        total.add_(update.params, alpha=float(weight))
    return total


class LazyClients(Sequence):
    """The server's clients, a sequence whose client ``i`` is built the first time it is read and kept
    from then on: start-up does no Python work per client, and a round builds its cohort's clients.
    Iterating builds them all. The client class's flags (``hp``) are read once for all of them."""

    def __init__(self, client_cls: type[Client], data: Sequence, args: Namespace, state, task: Task,
                 local_step) -> None:
        self.client_cls, self.data, self.args, self.state, self.task, self.local_step = (
            client_cls, data, args, state, task, local_step)
        self.hp = hyperparameters(args, client_cls)
        self._built: dict[int, Client] = {}

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = int(index)
        if not -len(self) <= index < len(self):
            raise IndexError(f"client {index} of {len(self)}")
        index %= len(self)
        client = self._built.get(index)
        if client is None:
            client = self._built[index] = self.client_cls(index, self.data[index], self.args, self.state, self.task,
                                                          self.local_step, hp=self.hp)
        return client

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    @property
    def built(self) -> int:
        """How many clients have been built so far."""
        return len(self._built)


class Server(Carries):
    """FedAvg's server; algorithms override hooks, never the loop."""

    #: what a server keeps across rounds (the persistence contract, ``flcore.extension.Carries``):
    #: the global model, the working model (its integer buffers) and what clients hold of the data
    #: sent once; an algorithm names its own state (momentum, controls, generators) in its class
    carried = ("global_params", "model", "sent_once")

    client_cls: ClassVar[type[Client]] = Client
    #: evaluate each client's own model (``eval_params``) instead of one global model
    personalized: ClassVar[bool] = False
    #: personalised algorithms with a meaningful shared model also report its accuracy
    has_global_model: ClassVar[bool] = True
    #: a selection policy this algorithm always uses (e.g. AdaFL); None = the ``--select`` flag
    selector_name: ClassVar[str | None] = None
    #: the part of the model clients upload and the server aggregates (see ``FlatModel.shared_mask``)
    shared: ClassVar[str | Sequence[str]] = "all"
    #: which hooks the class overrides, computed once per class (flcore/capabilities.py)
    capabilities: ClassVar[Capabilities]
    #: the global model's layout differs from the working model's (FedMA's matched widths): features
    #: that replay the global model in the working widths or mix uploads refuse it (``compatible``)
    changes_widths: ClassVar[bool] = False

    #: the population above which algorithms whose every round touches every client are refused
    #: (``population_limit``): their memory or time per round grows with the population
    ALL_CLIENTS_LIMIT: ClassVar[int] = 10_000

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.capabilities = Capabilities.of(cls, Server, SERVER_HOOKS)

    @classmethod
    def population_limit(cls, args: Namespace) -> tuple[int, str] | None:
        """The most clients this algorithm runs on with these flags and why (None: any number): an
        algorithm whose rounds need every client (all-pairs weights, every client trained) says so,
        and a larger population is refused in one line when the server is built."""
        return None

    def __init__(self, args: Namespace, dataset: FederatedDataset, module: nn.Module, device: torch.device):
        self.args = args
        self.hp = hyperparameters(args, type(self), self.client_cls)  # typed, frozen: this algorithm's own flags
        # the clients features hold out (-nnc's new clients), unless main.py split them off already
        self.dataset = dataset = split_for_features(args, dataset)
        limit = type(self).population_limit(args)
        if limit is not None and len(dataset.clients) > limit[0]:
            name = getattr(type(self), "registered_name", type(self).__name__)
            raise FLError(f"{name} runs on at most {limit[0]:,} clients and the dataset has {len(dataset.clients):,}: "
                          f"{limit[1]}; use a smaller population or another algorithm")
        objective = objective_of(dataset.config)
        local_step = local_step_for(args)  # plain SGD, or the chain the flags ask for (DP-SGD, poisoning)
        refusal(objective.name, self.run_parts(args, local_step),
                lambda: [name for name in ALGORITHMS if all(declares(cls, objective.name) for _, cls in
                                                            ALGORITHMS.get(name).run_parts(args, PLAIN_SGD)[:2])])
        if type(self).public_data_user(args):  # main.py refused it before any data was read; a server built directly
            self.public_data()  # is checked here
        self.device = device
        self.num_classes = dataset.num_classes
        # --eval_batch_size 0 = auto by device; written back, so every pass of the run (the
        # algorithms' own, the results' settings) reads the same number
        args.eval_batch_size = resolve_eval_batch(args.eval_batch_size, device)
        if resolve_conv_layout(args.conv_layout, device) == "channels_last":
            use_channels_last(module)
        self.model = FlatModel(self.build_module(module), device)
        self.global_params = self.model.snapshot()
        self.shared_mask = self.model.shared_mask(self.shared_parts())
        state = make_state_store(args, device)
        task = Task(dataset.num_classes, self.model.num_params, objective)
        #: each client built the first time it is touched (LazyClients); the first now, so that what a
        #: client class refuses of the flags is refused here
        self.clients = LazyClients(self.client_cls, dataset.clients, args, state, task, local_step)
        if len(self.clients):
            self.clients[0]
        self.history = RunHistory()
        #: what the evaluator, the engine and the plug-ins need of the run (flcore/protocol.py)
        self.runtime = Runtime(args, dataset, device, self.model, self.clients, state, self.history, self.shared_mask,
                               read_global=lambda: self.global_params)
        #: round plug-ins by name, in calling order (the virtual clock; privacy with -dp)
        self.plugins: dict[str, RoundPlugin] = plugins_for(self.runtime, type(self))
        #: the selection policy (flcore/selectors/), which sees the run's Runtime, not this server
        self.selector = SELECTORS.get(self.selector_name or args.select)(self.runtime)
        self.engine = ENGINES.get(args.engine)(self.runtime)
        self.evaluator = Evaluator(self.runtime)
        #: what each client holds of the data packages send once (``package(..., static=...)``)
        self.sent_once = SentOnce()
        self.setup()

    @classmethod
    def run_parts(cls, args: Namespace, local_step) -> list[tuple[str, type]]:
        """What trains and scores in a run of this algorithm with these flags, as (what the run
        calls it, its class): the server and client classes, the wanted round plug-ins and the
        local-step strategies. Each declares the label types it takes (flcore/objectives.py)."""
        name = getattr(cls, "registered_name", cls.__name__)
        return [(f"-algo {name}", cls), (f"-algo {name}'s client", cls.client_cls),
                *((f"the {plugin.registered_name} feature", plugin) for plugin in wanted_plugins(args)),
                *((f"the {link.name} local step", type(link)) for link in local_step.links)]

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        """Declare this algorithm's server flags (called once per class in the MRO)."""

    @classmethod
    def public_data_user(cls, args: Namespace) -> str | None:
        """The name under which this algorithm needs ``--public_data`` with these flags (None: it does
        not); ``main.py`` refuses a run without it before any data is read, and ``__init__`` checks
        again for servers built without ``main``."""
        return None

    def public_data(self) -> PublicData:
        """The server's public set, which ``public_data_user`` says this run needs (or the one-line advice)."""
        return require_public_data(self.dataset, type(self).public_data_user(self.args) or type(self).__name__)

    # ------------------------------------------------------------------ hooks
    def build_module(self, module: nn.Module) -> nn.Module:
        """The module the run trains: ``module``, or one that holds it with the algorithm's own
        layers (GPFL's category embedding and valve, FedCP's policy network and global head) and
        per-client constants (GPFL's label shares). Called once, before the flat model is built
        (``self.hp`` is ready), so these become parameters of the flat vector: sent, aggregated,
        kept private (``shared``), checkpointed and evaluated like the rest of the model."""
        return module

    def setup(self) -> None:
        """Create algorithm state (server momentum, controls, ...) after the base is built."""

    def select_clients(self, rnd: int) -> list[int]:
        return self.selector.select(rnd, self.selectable(rnd))

    def selectable(self, rnd: int) -> np.ndarray | None:
        """Which clients a selection policy may pick in round ``rnd`` (a boolean mask; None: any):
        what every plug-in allows (the virtual clock's availability and ``-ts``); every policy
        honours it."""
        allowed = None
        for plugin in self.plugins.values():
            mask = plugin.selectable(rnd)
            if mask is not None:
                allowed = mask if allowed is None else allowed & mask
        return allowed

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        return self.package(rnd, cohort)

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> int | None:
        """FedAvg: the new global model is the sample-weighted mean of the uploaded models. An
        algorithm that puts only some of the uploads into the model returns how many (None: all)."""
        self.global_params = weighted_average(updates)

    def after_round(self, rnd: int, package: RoundPackage, updates: list[ClientUpdate]) -> None:
        self.selector.observe(rnd, package, updates, self.global_params)

    def eval_params(self, index: int) -> torch.Tensor:
        """The model evaluated on client ``index``: the global model, with the client's private
        part where the algorithm shares only part of it (personalised algorithms override)."""
        if self.shared_mask is None:
            return self.global_params
        return with_private_part(self.global_params, self.shared_mask, self.state.get("private", index))

    def model_of(self, params: torch.Tensor) -> FlatModel:
        """The flat model whose layout ``params`` (the global model, or a client's evaluated model)
        has: the working model; FedMA's global model has widths of its own."""
        return self.model

    def shared_parts(self) -> str | Sequence[str]:
        """What clients upload and the server aggregates: ``shared``, or a choice a flag makes
        (``self.hp`` is ready); called once, before the clients are built."""
        return self.shared

    # ------------------------------------------------------------ helpers
    @property
    def state(self):
        """The per-client state store (``flcore/state.py``); an engine may replace it (Ray's driver
        copy), so it is read from the runtime they share."""
        return self.runtime.state

    def plugin(self, name: str) -> RoundPlugin:
        """The run's plug-in registered as ``name`` (``"clock"``, ``"privacy"``)."""
        return self.plugins[name]

    @property
    def virtual_time(self) -> float:
        """Virtual seconds since the start of training (the clock plug-in's reading)."""
        return self.plugins["clock"].now

    def package(self, rnd: int, cohort: list[int], **parts) -> RoundPackage:
        """The round's package with this server's global model and shared mask; ``parts`` are
        RoundPackage fields (``extras``, ``payloads``, ``static``: data a client keeps, counted in
        a client's download only while it lacks it; a package made counts as sent)."""
        package = RoundPackage(rnd, self.global_params, cohort, shared=self.shared_mask, **parts)
        if package.static:
            package.static_nbytes = self.sent_once.deliver(package.static, cohort)
        return package

    def summary(self) -> dict[str, object]:
        """Algorithm hyperparameters logged at the start of a run."""
        return {}

    def result_files(self, result: Path) -> dict[Path, Callable[[str], None]]:
        """Files this algorithm writes beside the finished results ``result`` (FLChain's ledger):
        {final path: write(temporary path)}; main.py renames them into place with the results."""
        return {}

    # ------------------------------------------------------------- the loop
    def run_round(self, rnd: int, evaluate: bool = True, train: bool = True, cohort: list[int] | None = None) -> "RoundResult":
        """One round: selection, evaluation (when ``evaluate``), local training and aggregation
        (when ``train``); ``cohort`` replaces the selection."""
        start = time.perf_counter()
        result = RoundResult(rnd)
        plugins = list(self.plugins.values())
        if train:
            for plugin in plugins:
                plugin.before_selection(rnd, selecting=cohort is None)
            result.cohort = drawn = self.select_clients(rnd) if cohort is None else list(cohort)
            for plugin in plugins:  # who of them trains (busy stragglers sit out)
                result.cohort = plugin.after_selection(rnd, result.cohort)
        if evaluate:
            result.evaluation = self.evaluate(rnd)
            for plugin in plugins:  # metrics of the same model (the backdoor's success rate)
                plugin.after_evaluation(rnd, self.global_params, result)
            result.eval_seconds = time.perf_counter() - start
        if train:
            package = result.package = self.make_package(rnd, result.cohort)
            package.drawn = drawn
            try:
                trained = self.engine.train([self.clients[i] for i in result.cohort], package)
            except Diverged as exc:  # a client's loss became NaN/inf
                self._diverged(exc)
            result.sent_nbytes = sum(u.nbytes() for u in trained)  # every upload made, whatever becomes of it
            updates = list(trained)  # those that arrive: the plug-ins say (the clock's -cdr drop-outs)
            for plugin in plugins:
                updates = plugin.after_training(package, trained, updates, result)
            result.updates = updates
            if updates:
                previous = self.global_params
                taker = next((p for p in plugins if p.takes_aggregation), None)
                if taker is not None:  # DP-FedAvg's clipped, noised mean
                    self.global_params = taker.aggregate(updates, package)
                else:
                    result.aggregated = self.aggregate(updates, package)
                if self.shared_mask is not None:  # the private part is no part of the global model
                    self.global_params = torch.where(self.shared_mask, self.global_params, previous)
                self._check_finite(rnd, updates)
            self.after_round(rnd, package, updates)
            for plugin in plugins:
                plugin.after_round(rnd, package, updates, result)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # a round's time includes the kernels it launched
        result.seconds = time.perf_counter() - start
        for plugin in plugins:  # observers of the complete round (DLG, new clients), outside its time
            plugin.observe_round(result)
        return result

    def train(self, progress: bool = True, callbacks: Sequence[Callable] = (), start_round: int = 0,
              round_end: Callable[["Server", int], None] | None = None) -> RunHistory:
        """Every round of the run from ``start_round`` (a resumed run's); each callback gets
        (server, result) and may stop the run by returning why (a string; True: "a callback stopped
        it"), and a callback object with a ``finish(server)`` method has it called once after the last
        round. ``round_end(server, next_round)`` runs once a training round is complete and the run
        goes on (checkpoints, interruption).

        A run that stops early evaluates the model it stops with (the evaluation a run of exactly
        that many training rounds ends with), says why in one line and records it
        (``history.stop_reason``)."""
        rounds = int(self.args.global_rounds)
        bar = ProgressBar(rounds + 1, self.args.algorithm, progress, initial=start_round)
        steps = [record_round, bar, *callbacks]
        if self.args.auto_break:
            steps.append(stop_when_stalled)
        for rnd in range(start_round, rounds + 1):
            is_last = rnd == rounds
            result = self.run_round(rnd, evaluate=is_last or rnd % self.args.eval_gap == 0, train=not is_last)
            reasons = [step(self, result) for step in steps]  # every step sees every round
            reason = next((r for r in reasons if r), None)
            if reason:
                self.stop_early(rnd, result, "a callback stopped it" if reason is True else str(reason), bar)
                break
            if round_end is not None and not is_last:
                round_end(self, rnd + 1)
        for plugin in self.plugins.values():  # work after the last round (the new clients' evaluation)
            plugin.finish()
        for step in steps:
            if hasattr(step, "finish"):
                step.finish(self)
        bar.close()
        return self.history

    def stop_early(self, rnd: int, result: RoundResult, reason: str, bar: "ProgressBar") -> None:
        """The run stops after round ``rnd`` for ``reason``: the model it stops with is evaluated
        (round ``rnd + 1``, as the final evaluation of a run that trains ``rnd + 1`` rounds)."""
        self.history.stop_reason = f"stopped after round {rnd}: {reason}"
        log.warning("%s", self.history.stop_reason)
        if result.trained:
            bar(self, self.run_round(rnd + 1, evaluate=True, train=False))

    def close(self) -> None:
        """Release the engine's and the evaluator's worker threads and the state store's files (the
        run is over)."""
        close_engine = getattr(self.engine, "close", None)
        if close_engine is not None:
            close_engine()
        self.evaluator.close()
        self.state.close()

    def _check_finite(self, rnd: int, updates: list[ClientUpdate]) -> None:
        if not bool(torch.isfinite(self.global_params).all()):
            culprits = [u.index for u in updates if not bool(torch.isfinite(u.params).all())]
            which = f" (non-finite uploads from client(s) {', '.join(map(str, culprits[:5]))})" if culprits else ""
            self._diverged(Diverged(f"the global model has NaN/inf values after round {rnd}{which}", rnd,
                                    advice="lower the learning rate (-lr)"))

    def _diverged(self, error: Diverged) -> None:
        """Training diverged: under a feature that explains it (an attack), the collapse is what the run
        measured (``Diverged.collapse``, without the advice); otherwise ``error``, with its advice."""
        note = next((p.divergence_note for p in self.plugins.values() if p.divergence_note), None)
        if note is None:
            raise error
        raise Diverged(f"{error.what}: {note}", error.round, collapse=note) from None

    # --------------------------------------------------------- evaluation
    def evaluate_models(self, params_for: Callable[[int], torch.Tensor], train_loss: bool = True) -> EvalResult:
        """Test accuracy/AUC on every client's test split (with the model ``params_for(i)``) and
        train loss on every train split; how the passes are grouped: ``flcore/evaluation.py``."""
        return self.evaluator.evaluate(params_for, train_loss)

    def evaluate(self, rnd: int) -> EvalResult:
        """Evaluate and record one point of the curves (PFLlib's ``evaluate``)."""
        self.evaluator.at_round(rnd)  # --eval_clients: this round's sample (flcore/evaluation.py)
        result = self.evaluate_models(self.eval_params)
        history = self.history
        history.eval_rounds.append(rnd)
        history.test_acc.append(result.test_acc)
        history.test_auc.append(result.test_auc)
        history.test_acc_std.append(result.test_acc_std)
        history.train_loss.append(result.train_loss)
        history.client_acc.append(result.client_acc)
        loss = f"{result.train_loss:.4f}" if self.args.eval_train_loss else "n/a"
        extra = ""
        if self.personalized and self.has_global_model:
            # Personalised runs also report the shared model where one exists (FedACS's Table 1).
            global_result = self.evaluate_models(lambda _: self.global_params, train_loss=False)
            history.add_series("test_acc_global", global_result.test_acc)
            history.add_series("test_auc_global", global_result.test_auc)
            extra = f" | global model acc {global_result.test_acc:.4f}"
        log.info(
            "round %4d | test %s %.4f (std %.4f) | test auc %.4f | train loss %s%s",
            rnd, self.runtime.objective.short, result.test_acc, result.test_acc_std, result.test_auc,
            loss, extra,
        )
        return result


def record_round(server: Server, result: RoundResult) -> None:
    """Callback: time, traffic and uploads of a training round into the run's history."""
    if not result.trained:
        return
    history = server.history
    history.round_time.append(result.seconds)
    history.bytes_down.append(result.package.total_nbytes())
    history.bytes_up.append(result.sent_nbytes)  # sent in this round (stragglers' arrive later, or never)
    history.add_series("bytes_up_arrived", sum(u.nbytes() for u in result.updates) + result.discarded_nbytes)
    history.clients_per_round.append(len(result.updates))
    if result.aggregated is not None:  # the algorithm put fewer into the model than arrived
        history.add_series("uploads_aggregated", result.aggregated)
    for plugin in server.plugins.values():
        plugin.record(result)


def stop_when_stalled(server: Server, result: RoundResult) -> str | bool:
    """Callback for ``-ab``: stop once the best accuracy is more than ``-tc`` evaluations old."""
    acc, patience = server.history.test_acc, server.args.top_cnt
    if result.trained and len(acc) > patience and int(np.argmax(acc)) < len(acc) - patience:
        return f"auto-break (-ab): the best accuracy is more than {patience} evaluations old"
    return False


class ProgressBar:
    """Callback: a tqdm bar over rounds showing the latest accuracy."""

    def __init__(self, total: int, name: str, enabled: bool, initial: int = 0):
        try:
            from tqdm.auto import tqdm
        except ImportError:  # pragma: no cover - tqdm is a declared dependency
            tqdm = None
        self.bar = tqdm(total=total, initial=initial, desc=name, unit="round", disable=not enabled or tqdm is None,
                        leave=False)

    def __call__(self, server: Server, result: RoundResult) -> None:
        if result.evaluation is not None:
            self.bar.set_postfix(acc=f"{result.evaluation.test_acc:.4f}")
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
