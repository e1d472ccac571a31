"""A public (proxy) dataset held by the server (``--public_data FRACTION|FOLDER``).

Some methods need unlabeled-by-clients data the server owns: KT-pFL (each client's soft
predictions on it), Sageflow and FAIR (scoring uploads). Two sources:

* ``--public_data 0.02``: a fraction of the dataset's *training pool*, drawn without replacement
  over all clients' training samples from ``--seed`` (so every run of a ``-t`` series, and every
  algorithm given the same seed, gets the same public set). The drawn samples are removed from
  their clients' training data, so no client ever trains on them; test data is untouched.
  Sageflow's setting (PFLlib-style) is 2%.
* ``--public_data path/to/folder``: a dataset folder made by a generator (config.json and
  ``train/*.npz``); the union of all its clients' training samples is the public set. Its inputs
  must have the task's shape and its labels must be classes of the task.

The public set lives on the dataset object (``dataset.public``, a :class:`PublicData`, None
without the flag), so a server finds it with :func:`public_data_of`; ``args.public_data`` (the
spec) and ``args.public_data_size`` (the number of samples) are part of the run's recorded config.
Labels are kept for methods that are allowed them; KT-pFL uses the inputs only.
"""
from __future__ import annotations

import logging
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fldata.loading import ClientData, FederatedDataset, decode_inputs, load_federated_dataset, split_views
from utils.errors import FLError
from utils.seeding import numpy_rng

log = logging.getLogger("fl")


@dataclass
class PublicData:
    """The server's public samples and where they came from: inputs as the dataset holds them (uint8
    codes with their float ``table`` for 8-bit images, else floats or int64 token ids) and labels."""

    x: torch.Tensor
    y: torch.Tensor
    source: str
    table: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def inputs(self) -> torch.Tensor:
        """The decoded inputs (floats, or token ids)."""
        return decode_inputs(self.x, self.table)


def public_data_of(dataset: FederatedDataset) -> PublicData | None:
    """The public set the run holds (None without ``--public_data``)."""
    return getattr(dataset, "public", None)


def public_data_needed(user: str) -> FLError:
    """The one-line advice for ``user`` (an algorithm, or the option that needs it) to give a public set."""
    return FLError(f"{user} needs a public dataset held by the server: pass --public_data 0.02 "
                   "(2% of the training pool) or --public_data <generated dataset folder>")


def require_public_data(dataset: FederatedDataset, algorithm: str) -> PublicData:
    """The public set, or the one-line advice to give one."""
    public = public_data_of(dataset)
    if public is None or len(public) == 0:
        raise public_data_needed(algorithm)
    return public


def with_public_data(args: Namespace, dataset: FederatedDataset) -> FederatedDataset:
    """``dataset`` with the public set of ``args.public_data`` attached (and, for a fraction, its
    samples removed from the clients); ``dataset`` itself without the flag."""
    spec = args.public_data
    if spec in (None, ""):
        return dataset
    try:
        fraction = float(spec)
    except ValueError:
        fraction = None
    if fraction is not None:
        if not 0.0 < fraction < 1.0:
            raise FLError(f"--public_data {spec}: a fraction of the training pool must be in (0, 1), e.g. 0.02")
        dataset = _draw_from_pool(dataset, fraction, int(args.seed))
    else:
        dataset.public = _from_folder(Path(spec), dataset, args)
    args.public_data_size = len(dataset.public)
    log.info("public data: %d samples (%s)", len(dataset.public), dataset.public.source)
    return dataset


def _draw_from_pool(dataset: FederatedDataset, fraction: float, seed: int) -> FederatedDataset:
    """The dataset without round(fraction · pool) training samples drawn from all clients, and those."""
    x, y = dataset.split("train")
    total = len(y)
    count = int(round(fraction * total))
    if count < 1:
        raise FLError(f"--public_data {fraction} of {total} training samples draws none; give a larger fraction")
    drawn = np.sort(numpy_rng(seed, "public-data").choice(total, size=count, replace=False))
    keep = np.ones(total, dtype=bool)
    keep[drawn] = False
    offsets = [*dataset.offsets("train"), total]
    sizes = [int(keep[offsets[i] : offsets[i + 1]].sum()) for i in range(len(dataset.clients))]
    kept = torch.from_numpy(np.flatnonzero(keep)).to(y.device)
    drawn_rows = torch.from_numpy(drawn).to(y.device)
    train_x, train_y = x[kept], y[kept]
    clients = [ClientData(c.cid, cx, cy, c.test_x, c.test_y, c.table)
               for c, (cx, cy) in zip(dataset.clients, split_views(train_x, train_y, sizes))]
    merged = {"train": (train_x, train_y)}
    if "test" in dataset.merged:
        merged["test"] = dataset.merged["test"]
    out = FederatedDataset(name=dataset.name, path=dataset.path, config=dict(dataset.config), clients=clients,
                           merged=merged, input_table=dataset.input_table)
    out.reserved = getattr(dataset, "reserved", None)  # the clients features hold out (-nnc) stay held out
    out.public = PublicData(x[drawn_rows], y[drawn_rows].clone(), f"{fraction:g} of the training pool, drawn from "
                            f"--seed {seed}", dataset.input_table)
    return out


def _from_folder(folder: Path, dataset: FederatedDataset, args: Namespace) -> PublicData:
    """Every training sample of the dataset folder ``folder``."""
    if not (folder / "config.json").is_file():
        raise FLError(f"--public_data {folder}: neither a fraction in (0, 1) nor a dataset folder with config.json")
    other = load_federated_dataset(str(folder), dataset.split("train")[1].device,
                                   legacy_pickle=bool(args.legacy_pickle))
    x, y = other.split("train")
    if tuple(x.shape[1:]) != tuple(dataset.split("train")[0].shape[1:]):
        raise FLError(f"--public_data {folder}: inputs of shape {tuple(x.shape[1:])}, the task's are "
                      f"{tuple(dataset.split('train')[0].shape[1:])}")
    if len(y) and int(y.max()) >= dataset.num_classes:
        raise FLError(f"--public_data {folder}: label {int(y.max())} is no class of the task "
                      f"({dataset.num_classes} classes)")
    return PublicData(x, y, f"every training sample of {folder}", other.input_table)
