"""Natural-client datasets read and written one user at a time (StackOverflow, Sent140).

``dataset_utils.generate`` reads every sample into one :class:`~datagen.sources.RawDataset`
before partitioning; a population of hundreds of thousands of users does not fit that. A
:class:`StreamedSource` instead names its users and their sample counts up front (from an
index: TFF's ``client_metadata`` table, a counting pass over a CSV) and hands out one user's
samples at a time, which :func:`generate_streamed` splits and passes straight to
``dataset_utils.write_clients`` (the packed layout by default). Only the natural partition
applies: the clients are the users.

Each user's randomness comes from ``(seed, client)`` alone (:func:`client_rng`): its train/test
split draws first, then ``--few-shot`` and ``--samples-per-client``. A source that needs a
user's split before writing (Sent140 trains its tokenizer on the training tweets) calls
:func:`split_units` and gets the same split the writer makes.

The split is made over a source's *units* (a sentence, a tweet) before they become samples, so
the rows of one StackOverflow sentence never straddle train and test. ``--test-split client``
(the default) splits each user's units with ``--train-ratio``; ``--test-split global`` is for a
source with an official per-user test split (StackOverflow's by date): each client trains on all
its training units and is tested on its own official test units.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .dataset_utils import NATURAL, build_parser, check_split_sizes, guarded, is_generated, partition_options, write_clients
from .errors import DatasetError
from .out_dir import output_folder
from .partition import cap_samples, few_shot, train_test_split

#: a user's units (sentences, tweets) -> (inputs, labels) of the samples they make, and for a
#: source with ``flagged`` a bool per sample
Encoder = Callable[[Sequence[Any]], tuple[np.ndarray, ...]]


@dataclass
class StreamedSource:
    """A natural-client source read user by user.

    ``names`` and ``sizes`` (training units per user) are in writing order; ``units(c)`` reads
    user ``c``'s training units, ``test_units(c)`` its official test units (None: the source has
    no official test split, and ``test_sizes`` is None too). Labels are ``[n]`` (one class a
    sample) or ``[n, T]`` (multi-label, -1 padding). ``flagged`` names the config.json key counting
    the written samples the encoder flags (``encode`` then returns ``(inputs, labels, flags)``);
    ``flagged_note`` says what a flag means, for the line printed at the end."""

    names: list[str]
    sizes: np.ndarray
    units: Callable[[int], Sequence[Any]]
    encode: Encoder
    num_classes: int
    class_names: list[str]
    input_shape: list[int]
    test_sizes: np.ndarray | None = None
    test_units: Callable[[int], Sequence[Any]] | None = None
    extra_config: dict[str, Any] = field(default_factory=dict)
    extra_files: dict[str, str] | None = None
    flagged: str | None = None
    flagged_note: str = ""


def client_rng(seed: int, client: int) -> np.random.Generator:
    """The random stream of client ``client`` (its split, few-shot and cap), from the seed alone."""
    return np.random.default_rng([seed, client])


def split_units(count: int, client: int, options: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.random.Generator]:
    """(training unit indices, test unit indices, the client's stream after the split), as
    :func:`generate_streamed` draws them for ``--test-split client``."""
    rng = client_rng(options["seed"], client)
    train, test = train_test_split(np.arange(count), options["train_ratio"], rng)
    return np.sort(train), np.sort(test), rng


def keep_largest(names: Sequence[str], sizes: np.ndarray, keep: int | None) -> np.ndarray:
    """Indices of the ``keep`` users with the most units (all if None), largest first, ties in
    ``names`` order: the natural partition's rule (``dataset_utils.natural_parts``)."""
    order = np.argsort(-np.asarray(sizes), kind="stable")
    order = order[np.asarray(sizes)[order] > 0]
    if keep is not None:
        if keep > len(order):
            raise DatasetError(f"--num-clients {keep} exceeds the {len(order)} users of this dataset")
        order = order[:keep]
    return order


def streamed_options(args: argparse.Namespace, name: str, num_classes: int | None, *,
                     official_test: bool) -> dict[str, Any]:
    """The options of a streamed dataset (``partition_options`` of the natural partition);
    ``--test-split global`` only where the source has an official per-user test split."""
    if args.niid != "noniid" or args.partition != NATURAL:
        raise DatasetError(f"{name}'s clients are its users: only the natural partition applies "
                           f"(leave out the positional arguments)")
    if args.test_split == "global" and not official_test:
        raise DatasetError(f"--test-split global needs an official test split; {name} has none "
                           f"(each user's samples are split with --train-ratio)")
    if args.feature_skew is not None:
        raise DatasetError("--feature-skew needs an image dataset")
    options = partition_options(argparse.Namespace(**{**vars(args), "test_split": "client"}),
                                name, num_classes)
    options["test_split"] = args.test_split
    return options


def check_official_test(names: Sequence[str], test_sizes: np.ndarray) -> None:
    """Refuse an official test split holding none of the kept users; name (one warning line) the
    users it leaves without test samples."""
    missing = np.flatnonzero(test_sizes == 0)
    if len(missing) == len(names):
        raise DatasetError(f"the official test split holds none of the {len(names)} users kept; "
                           f"pass --test-split client (each user's own samples split with --train-ratio)")
    if len(missing):
        shown = ", ".join(repr(names[i]) for i in missing[:5]) + \
            (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        print(f"warning: {len(missing)} of {len(names)} users have no samples in the official test "
              f"split ({shown}): their test parts are empty", file=sys.stderr)


def _client_samples(source: StreamedSource, client: int,
                    options: dict[str, Any]) -> tuple[tuple[np.ndarray, ...], int]:
    """(train x, train y, test x, test y) of one client, and how many of them the encoder flags."""
    units = source.units(client)
    if options["test_split"] == "global":
        train_units, test_units = units, source.test_units(client)
        rng = client_rng(options["seed"], client)
    else:
        train, test, rng = split_units(len(units), client, options)
        train_units, test_units = [units[i] for i in train], [units[i] for i in test]
    train, test = source.encode(train_units), source.encode(test_units)
    (train_x, train_y), (test_x, test_y) = train[:2], test[:2]
    keep = few_shot(np.arange(len(train_y)), train_y, options.get("few_shot"), rng)
    keep = cap_samples(keep, options["samples_per_client"], rng)
    flagged = int(train[2][keep].sum() + test[2].sum()) if source.flagged else 0
    return (train_x[keep], train_y[keep], test_x, test_y), flagged


def generate_streamed(args: argparse.Namespace, name: str, script_dir: Path,
                      open_source: Callable[[Path | None, Path, dict[str, Any]], StreamedSource], *,
                      extra_options: dict[str, Any], official_test: bool = False) -> int:
    """Generate ``name`` as ``args`` asks, user by user; returns the exit status.

    ``open_source(raw_dir, download_dir, options)`` reads the index of the raw files (downloading
    them when ``raw_dir`` is None) and returns the source; nothing is written before it and the
    size check pass."""
    options = {**streamed_options(args, name, None, official_test=official_test), **extra_options}
    out_dir = output_folder(args.out_dir, Path(script_dir) / name)
    if not args.force and is_generated(out_dir, options):
        print(f"Dataset already generated in {out_dir} with these options; "
              f"skipped (pass --force to regenerate).")
        return 0
    source = open_source(args.raw_dir, out_dir / "rawdata", options)
    sizes = np.asarray(source.sizes, dtype=np.int64)
    if options["test_split"] == "global":
        check_official_test(source.names, np.asarray(source.test_sizes, dtype=np.int64))
    else:
        train_sizes = np.floor(options["train_ratio"] * sizes + 1e-9).astype(np.int64)
        check_split_sizes(sizes, train_sizes, sizes - train_sizes, options)

    flagged = [0, 0]  # flagged samples, samples

    def clients() -> Iterator[tuple[np.ndarray, ...]]:
        for client in range(len(source.names)):
            samples, count = _client_samples(source, client, options)
            flagged[0] += count
            flagged[1] += len(samples[1]) + len(samples[3])
            yield samples

    write_clients(out_dir, options, clients(), num_clients=len(source.names),
                  num_classes=source.num_classes, class_names=source.class_names,
                  input_shape=source.input_shape,
                  extra_config=lambda: {**source.extra_config,
                                        **({source.flagged: flagged[0]} if source.flagged else {}),
                                        "client_names": list(source.names)},
                  extra_files=source.extra_files)
    if source.flagged:
        print(f"{flagged[0]} of {flagged[1]} samples {source.flagged_note} ({source.flagged} in config.json)")
    return 0


def main_streamed(argv: Sequence[str] | None, name: str, script_dir: Path,
                  open_source: Callable[[Path | None, Path, dict[str, Any]], StreamedSource], *,
                  raw_dir_help: str, add_arguments: Callable[[argparse.ArgumentParser], None],
                  extra_options: Callable[[argparse.Namespace], dict[str, Any]],
                  official_test: bool = False) -> int:
    """Entry point of a streamed dataset's ``generate_<name>.py``: the shared command line (natural
    partition, all users by default) plus the dataset's flags, and the packed layout by default
    (``--layout npz`` still works)."""
    parser = build_parser(name, default_num_clients=None, raw_dir_help=raw_dir_help, natural=True)
    add_arguments(parser)
    parser.set_defaults(layout="packed")
    parser.epilog = f"{name}'s clients are its users: only the natural partition applies."
    for action in parser._actions:
        if "--test-split" in action.option_strings:
            action.help = ("'client': each user's samples split with --train-ratio"
                           + ("; 'global': each user trains on all its training samples and is tested "
                              "on its own samples of the official test split" if official_test else
                              f" ({name} has no official test split)") + " (default client)")
    args = parser.parse_args(argv)
    return guarded(lambda: generate_streamed(args, name, script_dir, open_source,
                                             extra_options=extra_options(args),
                                             official_test=official_test))
