"""PFLlib's FedAvg round procedure, re-implemented as the benchmark's same-run baseline.

The speed target of the platform is stated against PFLlib "in the same conditions". PFLlib is not
installable here (it is not a package), and timings taken on different days on a shared machine
do not compare, so ``benchmark.py --engines sequential pfllib`` runs this loop on the same data,
model, seed and thread count as our engines. It does per round what PFLlib's ``serveravg`` and
``clientavg`` do (``../shared/specs/fedavg-fedprox.md`` and ``pfllib-cli.md``), with the same
torch kernels, so the ratio measures the overheads the platform removes, nothing else:

* every client owns a full model object, a deep copy of the global model made at start-up;
* every use of a client's data re-reads its npz files from disk (when the dataset has files) and
  builds a list of ``(x, y)`` sample pairs served by a ``DataLoader`` at the training batch size
  (train: shuffled, last partial batch dropped; test: shuffled, all samples);
* each round the global model is copied into every client's model parameter by parameter, then
  (on evaluation rounds) every client tests its model on its test split (accuracy and the
  micro-averaged one-vs-rest AUC of the raw outputs, by scikit-learn) and computes the loss of
  its model on its train split, at the training batch size;
* each selected client trains with its own ``torch.optim.SGD`` (no momentum), one batch at a time;
* aggregation deep-copies the first uploaded model, zeroes it and adds every upload weighted by
  its share of the training samples, parameter by parameter.

It is a measuring stick, not an engine: only FedAvg, no algorithm hooks, no result files.
"""
from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import label_binarize
from torch import nn
from torch.utils.data import DataLoader

from fldata.loading import FederatedDataset


#: reads one client's split: (index, "train" | "test") -> (float32 inputs, int64 labels) on the CPU
ClientReader = Callable[[int, str], tuple[torch.Tensor, torch.Tensor]]


def npz_reader(folder: Path | str) -> ClientReader:
    """Read ``<folder>/<split>/<index>.npz`` afresh on every call, as PFLlib's ``read_client_data``."""
    folder = Path(folder)

    def read(index: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        with np.load(folder / split / f"{index}.npz", allow_pickle=False) as archive:
            return torch.tensor(archive["x"], dtype=torch.float32), torch.tensor(archive["y"], dtype=torch.int64)

    return read


def npz_train_sizes(folder: Path | str, num_clients: int) -> list[int]:
    sizes = []
    for index in range(num_clients):
        with np.load(Path(folder) / "train" / f"{index}.npz", allow_pickle=False) as archive:
            sizes.append(len(archive["y"]))
    return sizes


def memory_reader(dataset: FederatedDataset) -> ClientReader:
    """In-memory data (the benchmark's random tensors), copied on every call as a file read would."""

    def read(index: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        data = dataset.clients[index]
        return data.inputs(split).detach().cpu().clone(), getattr(data, f"{split}_y").detach().cpu().clone()

    return read


class PFLlibStyleFedAvg:
    """FedAvg as PFLlib runs it: ``round(evaluate)`` is one round; curves in ``test_acc``."""

    def __init__(self, read_client: ClientReader, train_sizes: list[int], num_classes: int, global_model: nn.Module,
                 *, batch_size: int, lr: float, local_epochs: int, join_ratio: float, seed: int):
        self.read_client = read_client
        self.global_model = global_model
        self.batch_size, self.lr, self.local_epochs = int(batch_size), float(lr), int(local_epochs)
        self.num_clients = len(train_sizes)
        self.num_join = max(1, int(self.num_clients * join_ratio))
        self.num_classes = int(num_classes)
        self.rng = random.Random(seed)
        self.client_models = [copy.deepcopy(global_model) for _ in range(self.num_clients)]
        self.optimizers = [torch.optim.SGD(m.parameters(), lr=self.lr) for m in self.client_models]
        self.train_samples = list(train_sizes)
        self.test_acc: list[float] = []
        self.test_auc: list[float] = []
        self.train_loss: list[float] = []
        self.last_steps = 0

    def _loader(self, index: int, split: str) -> DataLoader:
        x, y = self.read_client(index, split)
        return DataLoader(list(zip(x, y)), self.batch_size, shuffle=True, drop_last=(split == "train"))

    # ------------------------------------------------------------------ the round
    def send_models(self) -> None:
        """Copy the global model into every client's model (PFLlib: all clients, not only the selected)."""
        for model in self.client_models:
            for new, old in zip(self.global_model.parameters(), model.parameters()):
                old.data = new.data.clone()

    def train_round(self) -> None:
        """Select, train one after another, aggregate."""
        selected = sorted(self.rng.sample(range(self.num_clients), self.num_join))
        self.last_steps = sum(self._train_client(index) for index in selected)
        self._aggregate(selected)

    def round(self, evaluate: bool) -> None:
        """One round of PFLlib's server loop: send, evaluate (on evaluation rounds), train, aggregate."""
        self.send_models()
        if evaluate:
            self.evaluate()
        self.train_round()

    def _train_client(self, index: int) -> int:
        model, optimizer = self.client_models[index], self.optimizers[index]
        loader = self._loader(index, "train")
        model.train()
        steps = 0
        for _ in range(self.local_epochs):
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                steps += 1
        return steps

    def _aggregate(self, selected: list[int]) -> None:
        total = sum(self.train_samples[i] for i in selected)
        merged = copy.deepcopy(self.client_models[selected[0]])
        for param in merged.parameters():
            param.data = torch.zeros_like(param.data)
        for index in selected:
            weight = self.train_samples[index] / total
            for mine, theirs in zip(merged.parameters(), self.client_models[index].parameters()):
                mine.data += theirs.data.clone() * weight
        self.global_model = merged

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> None:
        correct = tested = 0
        auc_sum = 0.0
        loss_sum, trained = 0.0, 0
        for index, model in enumerate(self.client_models):
            model.eval()
            probs, labels, hits = [], [], 0
            for x, y in self._loader(index, "test"):
                out = model(x)
                hits += int((out.argmax(1) == y).sum())
                probs.append(out.numpy())  # PFLlib scores the raw outputs
                labels.append(label_binarize(y.numpy(), classes=np.arange(self.num_classes + (self.num_classes == 2))))
            n = sum(len(p) for p in probs)
            if n:
                onehot = np.concatenate(labels)[:, : self.num_classes]
                auc_sum += roc_auc_score(onehot, np.concatenate(probs), average="micro") * n
            correct, tested = correct + hits, tested + n
            for x, y in self._loader(index, "train"):
                loss_sum += float(F.cross_entropy(model(x), y)) * len(y)
                trained += len(y)
        self.test_acc.append(correct / max(tested, 1))
        self.test_auc.append(auc_sum / max(tested, 1))
        self.train_loss.append(loss_sum / max(trained, 1))
