"""The model a run trains: built from ``-m`` for the dataset's shapes and checked against it
(token ids inside the embedding table, a dry forward pass, the number of classes) before training."""
from __future__ import annotations

import argparse
import copy

import torch

from flcore.registry import MODELS
from flcore.trainmodel.checks import dry_run
from cli.flags import PFLLIB_VOCAB_SIZE
from fldata.loading import FederatedDataset
from utils.errors import FLError


def build_model(args: argparse.Namespace, dataset: FederatedDataset, device: torch.device) -> torch.nn.Module:
    factory = MODELS.get(args.model)
    refuse_other_models_flags(args, factory)
    model_args = with_vocab_size(args, dataset)
    try:
        module = factory(dataset.input_shape, dataset.num_classes, model_args)
        check_token_ids(model_args, dataset, module)
        out = dry_run(module, dataset.sample_inputs(2).to("cpu"))  # before training: a shape it cannot take
    except (ValueError, RuntimeError, IndexError) as exc:
        raise FLError(
            f"model {args.model} does not fit dataset {args.dataset} (inputs {list(dataset.input_shape)}): "
            f"{str(exc).splitlines()[0]}"
        ) from exc
    if out.shape[-1] != dataset.num_classes:
        raise FLError(f"model {args.model} outputs {out.shape[-1]} classes, dataset has {dataset.num_classes}")
    return module


def with_vocab_size(args: argparse.Namespace, dataset: FederatedDataset) -> argparse.Namespace:
    """The arguments a model is built with. Without -vs, text models get the vocabulary the generator
    recorded in config.json (token ids 0..vocab_size-1), and PFLlib's 80 for folders without one
    (PFLlib's own, converted ones). ``args`` keeps -vs unset, so the settings a result file records
    (and a resume or a sweep compares) are the ones the user gave."""
    if args.vocab_size is not None:
        return args
    recorded = dataset.config.get("vocab_size", PFLLIB_VOCAB_SIZE)
    if isinstance(recorded, bool) or not isinstance(recorded, int) or recorded < 1:
        raise FLError(f"dataset {args.dataset}: config.json's vocab_size {recorded!r} is not a positive integer; pass -vs")
    model_args = copy.copy(args)
    model_args.vocab_size = recorded
    return model_args


def check_token_ids(args: argparse.Namespace, dataset: FederatedDataset, module: torch.nn.Module) -> None:
    """Integer inputs index the model's embedding table: every id must be in [0, table size), or
    the first batch holding a larger one would stop the run with an indexing error."""
    tables = [m.num_embeddings for m in module.modules() if isinstance(m, torch.nn.Embedding)]
    inputs = [x for x in (dataset.split("train")[0], dataset.split("test")[0]) if x.numel() and not x.is_floating_point()]
    if not tables or not inputs:
        return
    low, high = min(int(x.min()) for x in inputs), max(int(x.max()) for x in inputs)
    if low < 0 or high >= min(tables):
        raise FLError(
            f"dataset {args.dataset} has token ids {low}..{high}, model {args.model} embeds {min(tables)} tokens "
            f"(-vs {args.vocab_size}); pass -vs {high + 1}"
        )


def refuse_other_models_flags(args: argparse.Namespace, factory) -> None:
    """A flag that only some models read (a factory's ``own_flags``, argparse dests) given for a model
    that does not read it changes nothing: refused in one line."""
    own = set(getattr(factory, "own_flags", ()))
    for name in MODELS:
        for dest in getattr(MODELS.get(name), "own_flags", ()):
            if dest not in own and getattr(args, dest, None) is not None:
                raise FLError(f"--{dest} is a flag of -m {name}; -m {args.model} does not read it, so drop it")
