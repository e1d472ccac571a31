"""New clients (``-nnc``, ``-ften``): clients that never train with the federation and are
evaluated on how well the final global model serves them.

As PFLlib (``Server.set_new_clients``, ``fine_tuning_new_clients``, ``test_metrics_new_clients``):

* **Who.** The last ``nnc`` clients of the dataset (PFLlib reads ids ``nc .. nc+nnc-1`` from a
  dataset generated for ``nc + nnc`` clients). Here ``-nc`` is read from config.json, so ``-nc``
  may be left out, or be the dataset's number of clients, or PFLlib's ``total - nnc``.
  :func:`hold_out` cuts the dataset in two before the server builds its clients (the plug-in's
  ``split_dataset``); training, selection and the ordinary evaluation (``rs_test_acc``,
  ``rs_client_acc``) see only the first part.
* **When.** After training, once (PFLlib evaluates them after its last round, and also after an
  auto-break). ``--new_clients_every_eval`` also evaluates them at every ``-eg`` evaluation round
  (PFLlib has no such option); each evaluation appends to the series.
* **How.** Each new client starts from the global model, trains ``-ften`` epochs on its own
  train split and is evaluated on its own test split; ``-ften 0`` evaluates the global model as
  it is. PFLlib fine-tunes with plain minibatch SGD on the cross-entropy at ``-lr`` whatever the
  algorithm (its new clients never took part, so an algorithm's per-client terms have nothing to
  start from); we run the platform's own local step for that (``Client.sgd`` of the base client:
  batch size ``-lbs``, ``--drop_last`` as training, lr ``-lr`` of a first participation), with the
  batches and dropout drawn from (seed, "new-client", round, client). In a ``-dp`` run too: the
  plain SGD step, not DP-SGD's (new clients take no part in training, so the run's privacy
  accounting does not cover them, and PFLlib fine-tunes them without DP). Fine-tuned models are
  vectors made one client at a time in the server's working model: no model copies.
* **Reported** apart: ``rs_new_client_acc``, ``rs_new_client_auc`` (sample-weighted over the new
  clients' test data, like ``rs_test_acc``), ``rs_new_client_rounds`` (rounds of aggregation
  the evaluated global model had seen), and a line of the printed summary.

The few-shot option ``-fs`` (keep the first ``fs`` training samples of each label of every
client, in file order; test data untouched) applies to new clients too, as in PFLlib, whose
``set_new_clients`` reads their data with the same ``few_shot``.
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser, Namespace
from typing import Any

import torch

from flcore.clients.clientbase import Client
from flcore.evaluation import Evaluator
from flcore.extension import RoundPlugin, refused_by_changing_widths
from flcore.protocol import RoundPackage, RoundResult, Runtime, Task
from flcore.registry import register_plugin
from cli.flags import add_flag
from fldata.loading import FederatedDataset
from utils.errors import FLError
from utils.metrics import EvalResult
from utils.seeding import rng_state, seed_global_rng, set_rng_state

log = logging.getLogger("fl")


def hold_out(dataset: FederatedDataset, count: int, requested: int | None = None) -> tuple[FederatedDataset, FederatedDataset | None]:
    """(training clients, new clients): the dataset without its last ``count`` clients, and those.

    ``requested`` is ``-nc``: the dataset's number of clients or PFLlib's ``total - count``. Both
    parts are views of the loaded tensors (each split holds clients in order, so a part's rows are
    one contiguous block)."""
    total = len(dataset.clients)
    if requested is not None and requested not in (total, total - count):
        raise FLError(
            f"-nc {requested} with -nnc {count}: dataset {dataset.name!r} has {total} clients; "
            f"pass -nc {total - count} (the training clients, PFLlib's meaning) or leave -nc out"
        )
    if count == 0:
        return dataset, None
    if count >= total:
        raise FLError(f"-nnc {count} leaves no client to train: dataset {dataset.name!r} has {total} clients")
    keep = total - count
    return _part(dataset, 0, keep), _part(dataset, keep, total)


def _part(dataset: FederatedDataset, first: int, stop: int) -> FederatedDataset:
    """Clients ``first .. stop-1`` of ``dataset`` as a dataset of their own (views, no copies)."""
    merged = {}
    for split in ("train", "test"):
        x, y = dataset.split(split)
        offsets = [*dataset.offsets(split), len(y)]
        rows = slice(offsets[first], offsets[stop])
        merged[split] = (x[rows], y[rows])
    return FederatedDataset(name=dataset.name, path=dataset.path, config=dict(dataset.config, num_clients=stop - first),
                            clients=dataset.clients[first:stop], merged=merged, input_table=dataset.input_table)


@register_plugin("new_clients")
class NewClientEvaluation(RoundPlugin):
    """``-nnc``: holds the last clients out of training (``split_dataset``), evaluates them after
    training (``finish``), and at every evaluation round with ``--new_clients_every_eval``."""
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    flag_group = "new clients (PFLlib's -nnc -ften; flcore/features/newclients.py)"
    flag_order = 70
    order = 210  # observes the round once every other plug-in has had it

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-nnc", "--num_new_clients", type=int, default=0, low=0,
                 help="hold the last nnc clients of the dataset out of training; after training they fine-tune the "
                      "global model (-ften) and are evaluated apart (rs_new_client_acc)")
        add_flag(parser, "-ften", "--fine_tuning_epoch_new", type=int, default=0, low=0,
                 help="epochs each new client (-nnc) fine-tunes the global model on its train data (0: evaluated as is)")
        add_flag(parser, "--new_clients_every_eval", type=bool, default=False,
                 help="also evaluate the new clients (-nnc) at every evaluation round, not only after training (PFLlib)")

    @classmethod
    def wanted(cls, args: Namespace) -> bool:
        return cls.flags(args).num_new_clients > 0

    @classmethod
    def check(cls, args: Namespace) -> None:
        flags = cls.flags(args)
        if flags.num_new_clients == 0 and (flags.fine_tuning_epoch_new > 0 or flags.new_clients_every_eval):
            raise FLError("-ften and --new_clients_every_eval act on new clients: give -nnc N as well")

    @classmethod
    def compatible(cls, server_cls: type) -> str | None:
        return refused_by_changing_widths(server_cls, "-nnc")

    @classmethod
    def takes_clients(cls, args: Namespace) -> bool:
        return cls.wanted(args)

    @classmethod
    def split_dataset(cls, args: Namespace, dataset: FederatedDataset) -> tuple[FederatedDataset, FederatedDataset]:
        return hold_out(dataset, cls.flags(args).num_new_clients, args.num_clients)

    def __init__(self, runtime: Runtime, server_cls: type):
        super().__init__(runtime, server_cls)
        self.data: FederatedDataset = runtime.dataset.reserved[self.registered_name]
        flags = self.flags(runtime.args)
        self.epochs = flags.fine_tuning_epoch_new
        self.every_eval = flags.new_clients_every_eval
        task = Task(runtime.num_classes, runtime.model.num_params, runtime.objective)
        # the base client with the plain SGD step, also in a -dp run (see the module docstring)
        self.clients = [Client(i, client_data, runtime.args, runtime.state, task)
                        for i, client_data in enumerate(self.data.clients)]
        self.evaluator = Evaluator(Runtime(runtime.args, self.data, runtime.device, runtime.model, self.clients, runtime.state))

    def observe_round(self, result: RoundResult) -> None:
        # the final evaluation round is left to ``finish``, which also runs after an auto-break
        if self.every_eval and result.evaluation is not None and result.trained:
            self.evaluate(result.round)

    def finish(self) -> None:
        self.evaluate(len(self.runtime.history.round_time))

    def evaluate(self, rnd: int) -> EvalResult:
        """Fine-tune every new client from the current global model and evaluate it; recorded."""
        # fine-tuning seeds the global RNG (dropout): restored, so training goes on as without it
        saved = rng_state(self.runtime.device)
        result = self.evaluator.evaluate(lambda i: self.fine_tuned(i, rnd), train_loss=False)
        set_rng_state(saved)
        history = self.runtime.history
        history.add_series("new_client_rounds", rnd)
        history.add_series("new_client_acc", result.test_acc)
        history.add_series("new_client_auc", result.test_auc)
        log.info("new clients (%d, fine-tuned %d epoch(s)) after %d round(s): test %s %.4f (std %.4f) | test auc %.4f",
                 len(self.clients), self.epochs, rnd, self.runtime.objective.short, result.test_acc, result.test_acc_std, result.test_auc)
        return result

    def fine_tuned(self, position: int, rnd: int) -> torch.Tensor:
        """New client ``position``'s model: the global model after ``-ften`` epochs of its local
        SGD (the global model itself, the same tensor, when there is no step to take)."""
        client = self.clients[position]
        global_params = self.runtime.global_params
        plan = client.batch_plan(rnd, epochs=self.epochs, purpose="new-client") if self.epochs else []
        if not plan:
            return global_params
        seed_global_rng(self.runtime.args.seed, "new-client", rnd, client.cid)  # dropout
        model = self.runtime.model
        model.load(global_params)
        client.sgd(model, RoundPackage(rnd, global_params, [position]), {}, plan, client.learning_rate())
        return model.snapshot()

    def results(self, history) -> dict[str, Any]:
        """The new clients' final accuracy and AUC."""
        series = history.extra_series
        if not series.get("new_client_acc"):
            return {}
        return {"new_client_acc": float(series["new_client_acc"][-1]), "new_client_auc": float(series["new_client_auc"][-1])}

    def lines(self, results: dict[str, Any]) -> list[str]:
        if "new_client_acc" not in results:
            return []
        metric = self.runtime.objective.metric  # a multi-label dataset's recall@5
        return [f"  new clients: {metric} {results['new_client_acc']:.4f}, auc {results['new_client_auc']:.4f}"]
