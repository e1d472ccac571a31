"""New clients (``-nnc``, ``-ften``): clients that never train with the federation and are
evaluated on how well the final global model serves them.

As PFLlib (``Server.set_new_clients``, ``fine_tuning_new_clients``, ``test_metrics_new_clients``):

* **Who.** The last ``nnc`` clients of the dataset (PFLlib reads ids ``nc .. nc+nnc-1`` from a
  dataset generated for ``nc + nnc`` clients). Here ``-nc`` is read from config.json, so ``-nc``
  may be left out, or be the dataset's number of clients, or PFLlib's ``total - nnc``.
  :func:`hold_out` cuts the dataset in two; training, selection and the ordinary evaluation
  (``rs_test_acc``, ``rs_client_acc``) see only the first part.
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
from typing import TYPE_CHECKING

import torch

from flcore.clients.clientbase import Client
from flcore.evaluation import Evaluator
from flcore.protocol import RoundPackage, Runtime, Task
from utils.data_utils import FederatedDataset
from utils.errors import FLError
from utils.metrics import EvalResult
from utils.seeding import rng_state, seed_global_rng, set_rng_state

if TYPE_CHECKING:
    from flcore.servers.serverbase import Server
    from flcore.protocol import RoundResult

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
        x, y, owner = dataset.split(split)
        offsets = [*dataset.offsets(split), len(y)]
        rows = slice(offsets[first], offsets[stop])
        merged[split] = (x[rows], y[rows], owner[rows] - first if first else owner[rows])
    return FederatedDataset(name=dataset.name, path=dataset.path, config=dict(dataset.config, num_clients=stop - first),
                            clients=dataset.clients[first:stop], merged=merged, input_table=dataset.input_table)


class NewClientEvaluation:
    """``Server.train`` callback for ``-nnc``: evaluates the held-out clients after training
    (``finish``), and at every evaluation round with ``--new_clients_every_eval``."""

    def __init__(self, server: "Server", data: FederatedDataset):
        self.data = data
        self.epochs = int(server.args.fine_tuning_epoch_new)
        self.every_eval = bool(server.args.new_clients_every_eval)
        task = Task(server.num_classes, server.model.num_params)
        # the base client with the plain SGD step, also in a -dp run (see the module docstring)
        self.clients = [Client(i, client_data, server.args, server.state, task) for i, client_data in enumerate(data.clients)]
        self.evaluator = Evaluator(Runtime(server.args, data, server.device, server.model, self.clients, server.state))

    def __call__(self, server: "Server", result: "RoundResult") -> None:
        # the final evaluation round is left to ``finish``, which also runs after an auto-break
        if self.every_eval and result.evaluation is not None and result.trained:
            self.evaluate(server, result.round)

    def finish(self, server: "Server") -> None:
        self.evaluate(server, len(server.history.round_time))

    def evaluate(self, server: "Server", rnd: int) -> EvalResult:
        """Fine-tune every new client from the current global model and evaluate it; recorded."""
        # fine-tuning seeds the global RNG (dropout): restored, so training goes on as without it
        saved = rng_state(server.device)
        result = self.evaluator.evaluate(lambda i: self.fine_tuned(server, i, rnd), train_loss=False)
        set_rng_state(saved)
        history = server.history
        history.add_series("new_client_rounds", rnd)
        history.add_series("new_client_acc", result.test_acc)
        history.add_series("new_client_auc", result.test_auc)
        log.info("new clients (%d, fine-tuned %d epoch(s)) after %d round(s): test acc %.4f (std %.4f) | test auc %.4f",
                 len(self.clients), self.epochs, rnd, result.test_acc, result.test_acc_std, result.test_auc)
        return result

    def fine_tuned(self, server: "Server", position: int, rnd: int) -> torch.Tensor:
        """New client ``position``'s model: the global model after ``-ften`` epochs of its local
        SGD (the global model itself, the same tensor, when there is no step to take)."""
        client = self.clients[position]
        plan = client.batch_plan(rnd, epochs=self.epochs, purpose="new-client") if self.epochs else []
        if not plan:
            return server.global_params
        seed_global_rng(server.args.seed, "new-client", rnd, client.cid)  # dropout
        model = server.model
        model.load(server.global_params)
        client.sgd(model, RoundPackage(rnd, server.global_params, [position]), {}, plan, client.learning_rate())
        return model.snapshot()
