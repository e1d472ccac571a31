"""The start-up checks that need the dataset or the built server: a cohort, samples to train and
evaluate on, clients that train, and the warnings for a method that degenerates into another."""
from __future__ import annotations

import argparse
import logging
import math

import numpy as np

from fldata.loading import FederatedDataset
from utils.errors import FLError

log = logging.getLogger("fl")


def validate_with_data(args: argparse.Namespace, dataset: FederatedDataset) -> None:
    """The checks that need the dataset: samples to train on and to evaluate, a cohort of at least
    one client, and clients that train.

    Clients that take no local step (fewer training samples than -lbs with --drop_last, or none)
    are named in one warning; a run in which no client would take a step is refused."""
    clients = len(dataset.clients)
    if math.floor(clients * args.join_ratio + 1e-9) < 1:  # the cohort size of utils' uniform selection
        smallest = math.ceil(10_000 / clients) / 10_000
        raise FLError(f"-jr {args.join_ratio} selects no client of {clients} (floor({clients} x {args.join_ratio}) = 0); "
                      f"pass -jr {smallest:g} or more")
    for split in ("train", "test"):
        if not len(dataset.split(split)[1]):
            raise FLError(f"no client of dataset {args.dataset} has {split} samples ({dataset.path / split}); "
                          "regenerate the dataset")
    sizes = np.diff(dataset.bounds("train"))  # each client's training samples, without building the clients
    idle = np.flatnonzero(sizes < (args.batch_size if args.drop_last else 1))  # positions of clients that take no step
    if len(idle) == clients:
        raise FLError(f"-lbs {args.batch_size} is larger than every client's training set (largest: {sizes.max()} "
                      f"samples) and --drop_last skips the partial batch, so no client would train; "
                      f"pass -lbs {sizes.max()} or less, or --drop_last False")
    if len(idle):
        named = ", ".join(str(dataset.clients[i].cid) for i in idle[:5]) + (f" and {len(idle) - 5} more" if len(idle) > 5 else "")
        reason = f"fewer training samples than -lbs {args.batch_size}, with --drop_last" if args.drop_last else "no training samples"
        log.warning("warning: %d of %d clients take no local step (%s): %s", len(idle), clients, reason, named)


#: each named split of the model (``Server.shared``): (the shared part, the private part), in words
MODEL_SPLITS = {"body": ("the body", "the head"), "head": ("the head", "the body"),
                "no_norm": ("all but the normalisation layers", "the normalisation layers"),
                "no_batchnorm": ("all but the BatchNorm layers", "the BatchNorm layers")}


def warn_degenerate(args: argparse.Namespace, server) -> None:
    """One warning line for each setting under which the method asked for is another one: a split
    of the model whose private or shared part is empty with this model (FedBN on a model without
    normalisation layers is FedAvg, FedPer or FedRep on MLR, which has no body, is Local), and
    differential privacy without noise (epsilon is infinite)."""
    parts = server.shared_parts()
    body = getattr(server.model.module, "body", None)
    if getattr(server, "learns_from_features", False) and body is not None and not any(
            p.numel() for p in body.parameters()):
        # the split is not what degenerates (FedGH on MLR is no FedAvg): the representation is
        log.warning("warning: %s learns from the features of the model's body, and model %s's body has no "
                    "parameters: its features are the inputs themselves; use a model with a feature extractor "
                    "(e.g. DNN or CNN)", args.algorithm, args.model)
    elif isinstance(parts, str) and parts in MODEL_SPLITS:
        shared, private = MODEL_SPLITS[parts]
        if server.shared_mask is None:
            log.warning("warning: %s keeps %s on the clients, and model %s has none: every parameter is shared, "
                        "so this run is FedAvg", args.algorithm, private, args.model)
        elif not bool(server.shared_mask.any()):
            log.warning("warning: %s shares %s, and model %s has none: no parameter is shared, so this run is "
                        "Local", args.algorithm, shared, args.model)
