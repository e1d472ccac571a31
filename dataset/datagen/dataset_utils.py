"""Shared command line and writer of the ``generate_<Name>.py`` scripts.

PFLlib's positional convention still works (``python generate_MNIST.py noniid - dir``:
``noniid|iid``, ``balance|-``, ``pat|dir|exdir|shard|-``), and the constants PFLlib
hard-codes are flags (``--num-clients``, ``--alpha``, ``--train-ratio``, ``--seed``...).

Pipeline, as in PFLlib: merge the raw training and test sets, partition over
clients, split every client into train/test with ``--train-ratio`` (seeded), then,
if ``--samples-per-client`` is given, keep at most that many of each client's
*training* samples (the client's test part is left whole, so evaluation is not
starved; this is the data-scarce setting of FedACS, "only 50 training samples
kept").

Output (format ``npz-xy-v1``)::

    <out>/config.json          PFLlib's keys plus ours (see ``write_federated``)
    <out>/train/<client>.npz   x float32 (images NCHW in [-1, 1]), y int64
    <out>/test/<client>.npz

The npz files hold plain arrays (``np.load(f, allow_pickle=False)`` works). ``--layout packed``
(the default above ``layout.PACKED_ABOVE`` clients) writes every client's rows into one ``.npy``
file per split and array instead, with the clients' offsets (``layout.py``). Every
file is written to a temporary name and renamed; ``config.json`` comes last and
is removed first when regenerating, so a folder holding ``config.json`` is
complete. Running the same configuration again is a no-op unless ``--force``. While it writes, a
generator holds the folder's writer marker (``lock.py``), so a run started meanwhile (or a second
generator) refuses the folder, and one killed midway is told apart from one still running.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .errors import DatasetError
from . import feature_skew
from .layout import FORMATS, LAYOUTS, NPZ_FORMAT, PACKED_ABOVE, PACKED_FILES, WRITERS, resolve_layout
from .lock import writing
from .out_dir import output_folder
from .partition import (DIR_FALLBACKS, LABEL_SETS, PARTITIONS, cap_samples, few_shot, make_partition,
                        train_test_split)
from .picture import Population, label_bincount, label_skew, save_partition_png, summary_lines
from .sources import Loader, RawDataset
from .synthetic import SIZE_LOG_MEAN, SIZE_LOG_STD, SIZE_MIN, synthetic_clients, synthetic_sizes

FORMAT = NPZ_FORMAT
CONFIG_NAME = "config.json"
STATS_KEY = "Size of samples for labels in clients"
PICTURE_NAME = "partition.png"
NATURAL = "natural"
TEST_SPLITS = ("client", "global")
#: seeds are 32-bit, as in main.py (whose streams keep 32 bits of the seed): one rule for both tools
MAX_SEED = 2**32 - 1


def _add_shared_arguments(parser: argparse.ArgumentParser, default_num_clients: int | None,
                          natural: bool = False) -> None:
    if natural:
        default = "all" if default_num_clients is None else default_num_clients
        help_text = (f"natural partition: keep the N natural clients with the most samples "
                     f"(default {default}); other partitions: number of clients")
    else:
        help_text = f"number of clients (default {default_num_clients})"
    parser.add_argument("--num-clients", type=int, default=default_num_clients, help=help_text)
    parser.add_argument("--train-ratio", type=float, default=0.75,
                        help="share of each client's samples used for training (default 0.75)")
    parser.add_argument("--seed", type=int, default=1,
                        help=f"seed of the partition, split and sample cap, 0 to {MAX_SEED} "
                             f"(default 1)")
    parser.add_argument("--samples-per-client", type=int, default=None, metavar="N",
                        help="keep at most N training samples per client, chosen at random "
                             "after the train/test split (default: keep all)")
    parser.add_argument("--batch-size", type=int, default=10,
                        help="batch size of the minimum-client-size rule, stored in "
                             "config.json as PFLlib does (default 10)")
    # a str, not a Path: Path("") is ".", and an empty --out-dir (an unset variable) must be refused
    parser.add_argument("--out-dir", default=None,
                        help="output folder, new or written by a generator before (default: "
                             "dataset/<Name> next to the script)")
    parser.add_argument("--force", action="store_true",
                        help="regenerate even if the folder already holds this configuration")
    parser.add_argument("--layout", choices=LAYOUTS, default="auto",
                        help=f"npz: PFLlib's train/<i>.npz per client; packed: one memory-mapped "
                             f"file per split and an index of client offsets (layout.py); auto: "
                             f"packed above {PACKED_ABOVE} clients (default auto)")


def build_parser(name: str, *, default_num_clients: int = 20,
                 raw_dir_help: str | None = None, natural: bool = False) -> argparse.ArgumentParser:
    """Parser of a dataset's generator (PFLlib positionals + flags).

    ``natural`` datasets (writers, subjects, speaking roles, domains) default to
    the ``natural`` partition, one client per natural group, and ``--num-clients``
    then keeps the largest groups.
    """
    parser = argparse.ArgumentParser(
        prog=f"generate_{name}.py",
        description=f"Partition {name} over federated clients (PFLlib-compatible output "
                    f"plus a pickle-free npz format).",
        epilog="Examples: 'noniid - dir' (Dirichlet), 'noniid - pat' (2 classes per client), "
               "'noniid - classes --class-per-client 3' (#C=3), 'noniid - quantity --alpha 0.5', "
               "'iid balance -', 'noniid - shard --num-clients 100'.")
    partitions = [*PARTITIONS, "-"] + ([NATURAL] if natural else [])
    parser.add_argument("niid", nargs="?", default="noniid", choices=["noniid", "iid"],
                        help="PFLlib argument 1: noniid or iid (default noniid)")
    parser.add_argument("balance", nargs="?", default="-", choices=["balance", "-"],
                        help="PFLlib argument 2: 'balance' for equal sizes in pat/iid, '-' "
                             "for PFLlib's random sizes (default -)")
    parser.add_argument("partition", nargs="?", default=NATURAL if natural else "dir",
                        choices=partitions,
                        help=f"PFLlib argument 3: {', '.join(partitions)} "
                             f"(default {NATURAL if natural else 'dir'})")
    _add_shared_arguments(parser, default_num_clients, natural=natural)
    parser.add_argument("--alpha", type=float, default=0.1,
                        help="Dirichlet concentration for dir/exdir and of the client sizes "
                             "for quantity (default 0.1; PFLlib suggests 100 for exdir)")
    parser.add_argument("--class-per-client", type=int, default=2,
                        help="labels per client for pat/exdir/classes (default 2)")
    parser.add_argument("--label-sets", choices=LABEL_SETS, default="cover",
                        help="how classes (#C=k) picks each client's classes: 'cover' takes classes nobody holds "
                             "yet first, 'niid-bench' gives client i class i mod K and k-1 random others, as "
                             "NIID-Bench's code does (default cover)")
    parser.add_argument("--shards-per-client", type=int, default=2,
                        help="shards per client for shard (default 2)")
    parser.add_argument("--dir-fallback", choices=DIR_FALLBACKS, default="repair",
                        help="when 100 dir/exdir draws leave a client below PFLlib's minimum "
                             "size: 'repair' tops it up from the largest clients, 'error' "
                             "stops (PFLlib redraws forever) (default repair)")
    parser.add_argument("--few-shot", type=int, default=None, metavar="N",
                        help="PFLlib's few-shot: keep at most N training samples per label "
                             "and client (default: all)")
    parser.add_argument("--test-split", choices=TEST_SPLITS, default="client",
                        help="'client': PFLlib's per-client train/test split; 'global': "
                             "clients hold training data only and share one test set (the "
                             "official one where the dataset has it), dealt out IID over "
                             "the clients' test files (default client)")
    parser.add_argument("--feature-skew", choices=feature_skew.FEATURE_SKEWS, default=None,
                        help="per-client feature shift of image data: rotation, noise or "
                             "jitter (default none)")
    parser.add_argument("--skew-strength", type=float, default=None,
                        help="rotation: max angle in degrees (180); noise: std of the last "
                             "client (0.5); jitter: factor range 1+-s (0.5)")
    parser.add_argument("--raw-dir", type=Path, default=None,
                        help=raw_dir_help or "folder holding the raw files; skips the download")
    return parser


def _check_shared(args: argparse.Namespace) -> None:
    if args.num_clients is not None and args.num_clients < 1:
        raise DatasetError(f"--num-clients must be at least 1, got {args.num_clients}")
    if not 0 < args.train_ratio < 1:
        raise DatasetError(f"--train-ratio must be between 0 and 1, got {args.train_ratio}")
    if args.samples_per_client is not None and args.samples_per_client < 1:
        raise DatasetError(f"--samples-per-client must be at least 1, got {args.samples_per_client}")
    if args.batch_size < 1:
        raise DatasetError(f"--batch-size must be at least 1, got {args.batch_size}")
    if not 0 <= args.seed <= MAX_SEED:
        raise DatasetError(f"--seed must be between 0 and {MAX_SEED}, got {args.seed}")


def layout_option(layout: str, num_clients: int | None) -> dict[str, str]:
    """The ``format`` key of the options, where the layout is known before the data are read (not
    for ``auto`` over natural clients, whose number comes from the data)."""
    if layout == "auto" and num_clients is None:
        return {}
    return {"format": FORMATS[resolve_layout(layout, num_clients)]}


def partition_options(args: argparse.Namespace, name: str,
                      num_classes: int | None) -> dict[str, Any]:
    """Every option that shapes the output; equal options mean an identical dataset.

    ``num_classes`` None: the class count comes from the raw files (checked after loading).
    """
    _check_shared(args)
    non_iid = args.niid == "noniid"
    partition = None if args.partition == "-" else args.partition
    if non_iid and partition is None:
        raise DatasetError(f"noniid needs a partition: {', '.join(PARTITIONS)}")
    if not (args.alpha > 0 and np.isfinite(args.alpha)):
        raise DatasetError(f"--alpha must be a positive number, got {args.alpha}")
    if args.class_per_client < 1 or (num_classes is not None
                                     and args.class_per_client > num_classes):
        raise DatasetError(f"--class-per-client must be between 1 and {num_classes}, "
                           f"got {args.class_per_client}")
    if args.shards_per_client < 1:
        raise DatasetError(f"--shards-per-client must be at least 1, got {args.shards_per_client}")
    if args.few_shot is not None and args.few_shot < 1:
        raise DatasetError(f"--few-shot must be at least 1, got {args.few_shot}")
    if args.partition == NATURAL and args.test_split == "global":
        raise DatasetError("--test-split global needs a partition of the training set; the "
                           "natural clients hold their own test data")
    strength = args.skew_strength
    if args.feature_skew is not None:
        strength = feature_skew.DEFAULT_STRENGTH[args.feature_skew] if strength is None \
            else strength
    elif strength is not None:
        raise DatasetError("--skew-strength needs --feature-skew")
    options = {
        "dataset": name, "num_clients": args.num_clients, "num_classes": num_classes,
        "non_iid": non_iid, "balance": args.balance == "balance", "partition": partition,
        "alpha": args.alpha, "batch_size": args.batch_size, "train_ratio": args.train_ratio,
        "seed": args.seed, "class_per_client": args.class_per_client,
        "samples_per_client": args.samples_per_client,
        "shards_per_client": args.shards_per_client,
        **layout_option(args.layout, args.num_clients),
        "dir_fallback": args.dir_fallback, "few_shot": args.few_shot,
        "test_split": args.test_split, "feature_skew": args.feature_skew,
        "skew_strength": strength,
    }
    if partition == "classes" and args.label_sets != "cover":  # recorded only where it applies
        options["label_sets"] = args.label_sets
    elif args.label_sets != "cover":
        raise DatasetError("--label-sets applies to the classes partition (noniid - classes)")
    if num_classes is None:
        del options["num_classes"]
    if partition == NATURAL and non_iid:
        # The client count comes from the data; what the user chose is the cap.
        options["natural_clients"] = options.pop("num_clients")
    elif args.num_clients is None:
        raise DatasetError(f"--num-clients is needed for the {partition or 'iid'} partition "
                           f"(only the natural partition takes its clients from the data)")
    return options


def is_generated(out_dir: Path, options: dict[str, Any]) -> bool:
    """True when ``out_dir`` is a complete dataset made with exactly ``options``. A folder of
    multi-label data (config.json's ``label_type``) is never that of options without it, though it
    may share all their keys (StackOverflow's two tasks)."""
    try:
        config = json.loads((out_dir / CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict) or any(config.get(k) != v for k, v in options.items()) \
            or config.get("label_type") != options.get("label_type"):
        return False
    num_clients = config.get("num_clients")
    if not isinstance(num_clients, int):
        return False
    if config.get("format") == FORMATS["packed"]:
        return all((out_dir / part / name).is_file() for part in ("train", "test") for name in PACKED_FILES)
    return all((out_dir / part / f"{i}.npz").is_file()
               for part in ("train", "test") for i in range(num_clients))


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to a temporary file and rename it over ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj) + "\n")
    os.replace(tmp, path)


def _prepare_out_dir(out_dir: Path) -> None:
    """Mark the folder incomplete and drop client files a previous run left behind."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CONFIG_NAME).unlink(missing_ok=True)
    for part in ("train", "test"):
        folder = out_dir / part
        folder.mkdir(exist_ok=True)
        for old in folder.iterdir():
            name = old.name.removesuffix(".tmp")
            stem = name.removesuffix(".npz")
            if old.is_file() and (name.endswith(".npz") and stem.isdigit() or name in PACKED_FILES):
                old.unlink()


#: per-client lines printed for the packed layout (PFLlib prints every client)
PRINTED_CLIENTS = 10
#: clients drawn in the partition picture (the first ones; the summary covers them all)
PICTURE_CLIENTS = 1000
#: (clients x classes) label counts held for the summary of a packed population (64 MB of int32);
#: above it, only the first PICTURE_CLIENTS clients' counts and every client's size and class count
FULL_COUNTS_LIMIT = 1 << 24
#: (clients x classes) label counts read back at a time for a packed population's label skew (2 MB)
SKEW_ENTRIES = 1 << 18


def print_client_stats(counts: np.ndarray, limit: int | None = None, total_clients: int | None = None,
                       sizes: np.ndarray | None = None) -> None:
    """PFLlib's per-client summary lines (of the first ``limit`` clients, if given; ``counts`` may
    hold only the first of ``total_clients``); ``sizes`` gives the samples per client where they are
    not the counts' sums (multi-label samples)."""
    shown = counts if limit is None else counts[:limit]
    for client, row in enumerate(shown):
        labels = np.flatnonzero(row)
        size = int(row.sum()) if sizes is None else int(sizes[client])
        print(f"Client {client}\t Size of data: {size}\t Labels: ", labels)
        print("\t\t Samples of labels: ", [(int(k), int(row[k])) for k in labels])
        print("-" * 50)
    total = len(counts) if total_clients is None else total_clients
    if len(shown) < total:
        print(f"... and {total - len(shown)} more clients")


def _split_clients(parts: Sequence[np.ndarray], shared_test: np.ndarray | None,
                   options: dict[str, Any], labels: np.ndarray,
                   rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's training and test indices, after few-shot and the sample cap.

    With a shared test set the clients keep all their samples for training and
    the shared set is shuffled and cut into equal slices, one per client: the
    simulator's sample-weighted accuracy over all clients' test files is then
    the accuracy on the whole shared test set, with no copy of it per client.
    """
    train_parts, test_parts = [], []
    if shared_test is not None:
        test_parts = np.array_split(rng.permutation(shared_test), len(parts))
    for idx in parts:
        if shared_test is None:
            train, test = train_test_split(idx, options["train_ratio"], rng)
            test_parts.append(test)
        else:
            train = rng.permutation(idx)
        train = few_shot(train, labels, options.get("few_shot"), rng)
        train_parts.append(cap_samples(train, options["samples_per_client"], rng))
    return train_parts, list(test_parts)


def _named(clients: Sequence[int]) -> str:
    shown = [int(c) for c in clients[:5]]
    return ", ".join(map(str, shown)) + (f" and {len(clients) - 5} more" if len(clients) > 5 else "")


def check_client_sizes(parts: Sequence[np.ndarray], train_parts: Sequence[np.ndarray],
                       test_parts: Sequence[np.ndarray], options: dict[str, Any]) -> None:
    """:func:`check_split_sizes` of index arrays."""
    check_split_sizes(np.array([len(p) for p in parts]), np.array([len(t) for t in train_parts]),
                      np.array([len(t) for t in test_parts]), options)


def check_split_sizes(sizes: np.ndarray, train_sizes: np.ndarray, test_sizes: np.ndarray,
                      options: dict[str, Any]) -> None:
    """Refuse a dataset in which a client holds nothing, or no client can train or be tested;
    warn (one line each) when only some clients lack training or test samples.

    A natural partition can hold a writer or a role of one or two samples, which the split
    leaves with nothing to train on: legitimate, and ``main.py`` skips such clients."""
    num = len(sizes)
    empty = np.flatnonzero(sizes == 0)
    if len(empty):
        raise DatasetError(f"the {options['partition'] or 'iid'} partition leaves {len(empty)} of "
                           f"{num} clients without samples ({_named(empty)}); lower --num-clients")
    ratio = options["train_ratio"]
    for missing, split, fix in ((np.flatnonzero(train_sizes == 0), "training", "raise --train-ratio"),
                                (np.flatnonzero(test_sizes == 0), "test", "lower --train-ratio")):
        if len(missing) == num:
            raise DatasetError(f"--train-ratio {ratio:g} leaves every client without {split} "
                               f"samples (a client of n samples trains on floor({ratio:g} x n)); "
                               f"{fix} or lower --num-clients")
        if len(missing):
            print(f"warning: --train-ratio {ratio:g} leaves {len(missing)} of {num} clients "
                  f"without {split} samples ({_named(missing)}); {fix} or lower --num-clients",
                  file=sys.stderr)


def write_federated(out_dir: Path, data: RawDataset, parts: Sequence[np.ndarray],
                    options: dict[str, Any], rng: np.random.Generator, *,
                    shared_test: np.ndarray | None = None,
                    client_domains: Sequence[str] | None = None) -> dict[str, Any]:
    """Split each client's samples (train/test, few-shot, the cap), check the clients' sizes,
    then write under the folder's writer marker (``lock.py``): a run started meanwhile refuses
    the folder instead of reading half-written files. Nothing in ``out_dir`` changes before the
    checks pass.

    ``options`` (from :func:`partition_options` or the Synthetic generator) is stored in
    ``config.json`` next to the derived keys (:func:`write_clients`); ``client_domains`` names
    each client's domain (feature-shift datasets)."""
    train_parts, test_parts = _split_clients(parts, shared_test, options, data.y, rng)
    check_client_sizes(parts, train_parts, test_parts, options)
    skew = options.get("feature_skew")
    skew_values: list[float] = []

    def clients():
        for client, (train, test) in enumerate(zip(train_parts, test_parts)):
            x = data.features(np.concatenate([train, test]))
            if skew is not None:
                # Train and test of a client are shifted together: one domain per client.
                x, value = feature_skew.apply(skew, x, options["skew_strength"], client,
                                              len(train_parts), options["seed"])
                skew_values.append(value)
            yield x[:len(train)], data.y[train], x[len(train):], data.y[test]

    def extra() -> dict[str, Any]:
        config = dict(data.extra_config or {})
        if client_domains is not None:
            config["client_domains"] = list(client_domains)
        if skew is not None:
            config["feature_skew_values"] = skew_values
        return config

    domains = (skew_values, feature_skew.PARAMETER_NAMES[skew]) if skew is not None else \
        (list(client_domains), "domain") if client_domains is not None else None
    return write_clients(out_dir, options, clients(), num_clients=len(train_parts),
                         num_classes=data.num_classes, class_names=data.class_names,
                         input_shape=list(data.x.shape[1:]), extra_config=extra,
                         domains=domains, extra_files=data.extra_files)


def layout_of(options: dict[str, Any], num_clients: int) -> str:
    """The layout ``options`` ask for (``auto`` by the client count when they name no format)."""
    named = [layout for layout, fmt in FORMATS.items() if options.get("format") == fmt]
    return named[0] if named else resolve_layout("auto", num_clients)


def write_clients(out_dir: Path, options: dict[str, Any], clients: Iterable[tuple[np.ndarray, ...]], *,
                  num_clients: int, num_classes: int, class_names: Sequence[Any],
                  input_shape: list[int],
                  extra_config: Callable[[], dict[str, Any]] | None = None,
                  domains: tuple[Sequence[object], str] | None = None,
                  extra_files: dict[str, str] | None = None) -> dict[str, Any]:
    """Write ``clients`` (``(train_x, train_y, test_x, test_y)`` each, in client order) as they
    come, under the folder's writer marker; then ``config.json``, the picture and the summary.

    Only the current client and the ``[clients, classes]`` label counts are held, so the memory
    does not grow with the samples. config.json holds PFLlib's keys (its per-client statistic and
    our per-client sample counts only in the npz layout: the packed layout's offsets are them)
    plus ``options``, ``class_names`` and ``input_shape``; ``extra_config()`` (read after the
    last client) adds keys computed on the way. ``domains`` is (one value per client, its name)
    for the picture's strip."""
    layout = layout_of(options, num_clients)
    with writing(out_dir):
        try:
            written, stats = _write_all(out_dir, WRITERS[layout](out_dir), clients, num_clients, num_classes)
        except OSError as exc:  # a full disk, a folder made read-only meanwhile
            raise DatasetError(f"cannot write {exc.filename or out_dir} ({exc.strerror or exc}); "
                               f"free some space or pass another --out-dir") from None
        label_matrix, multilabel = stats["labels"], stats["multilabel"]
        client_sizes = None
        if multilabel:
            client_sizes = stats["train_sizes"] + stats["test_sizes"] if layout == "npz" else stats["totals"].sizes
        print_client_stats(label_matrix, None if layout == "npz" else PRINTED_CLIENTS,
                           total_clients=num_clients, sizes=client_sizes)
        if layout == "npz":
            train_sizes, test_sizes = stats["train_sizes"], stats["test_sizes"]
            print("Total number of samples:", int(train_sizes.sum() + test_sizes.sum()))
            print("The number of train samples:", train_sizes.tolist())
            print("The number of test samples:", test_sizes.tolist())
        else:
            print("Total number of samples:", stats["train_rows"] + stats["test_rows"])
            print(f"The number of train samples: {stats['train_rows']} (packed: "
                  f"{out_dir / 'train'}), test samples: {stats['test_rows']}")
        config = {
            "num_clients": num_clients, "num_classes": num_classes,
            "non_iid": options["non_iid"], "balance": options["balance"],
            "partition": options["partition"],
            **({STATS_KEY: [[[int(k), int(row[k])] for k in np.flatnonzero(row)] for row in label_matrix]}
               if layout == "npz" else {}),
            "alpha": options["alpha"], "batch_size": options["batch_size"],
            **options, "format": FORMATS[layout],
            "class_names": list(class_names), "input_shape": input_shape,
            **({"train_samples": train_sizes.tolist(), "test_samples": test_sizes.tolist()}
               if layout == "npz" else written),
        }
        config.update(extra_config() if extra_config is not None else {})
        shown = label_matrix[:PICTURE_CLIENTS]
        title = (f"{options['dataset']}: {num_clients} clients"
                 + (f" (the first {len(shown)} drawn)" if len(shown) < num_clients else "")
                 + f", partition {options['partition']}"
                 + (f", alpha {options['alpha']:g}" if options["partition"] in ("dir", "exdir", "quantity")
                    else "") + (f", {options['feature_skew']} skew" if options.get("feature_skew") else ""))
        save_partition_png(out_dir / PICTURE_NAME, shown, [str(c) for c in class_names],
                           title=title, domains=None if domains is None else list(domains[0])[:PICTURE_CLIENTS],
                           domain_label=domains[1] if domains is not None else "domain",
                           unit="labels" if multilabel else "samples")
        for file_name, text in (extra_files or {}).items():
            tmp = out_dir / (file_name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, out_dir / file_name)
        write_json_atomic(out_dir / CONFIG_NAME, config)
    for line in summary_lines(label_matrix, None if domains is None else domains[0], totals=stats["totals"],
                              sizes=client_sizes, multilabel=multilabel):
        print(line)
    print(f"Partition picture: {out_dir / PICTURE_NAME}")
    print("Finish generating dataset.")
    return config


def _write_all(out_dir: Path, writer, clients: Iterable[tuple[np.ndarray, ...]], num_clients: int,
               num_classes: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every client through ``writer``: (the writer's config keys, label counts and sizes).

    The npz layout's statistic needs every client's counts, held as they come. A packed population
    holds those of the clients the picture draws, and for the rest only running figures (classes
    per client, each class's count) beside the writer's offsets: nothing else grows with the
    population. Its label skew is then computed from the written labels, read back in blocks of
    clients, unless clients x classes passes FULL_COUNTS_LIMIT (StackOverflow's 10,004 words):
    it is then that of the pictured clients. Multi-label clients (``y`` of shape ``[rows, T]``, -1
    padding) count each label a sample holds."""
    print(f"\nSaving to {out_dir} ({writer.layout} layout)")
    _prepare_out_dir(out_dir)
    packed = writer.layout != "npz"
    counted = min(num_clients, PICTURE_CLIENTS) if packed else num_clients
    labels = np.zeros((counted, num_classes), dtype=np.int64)
    overall = np.zeros(num_classes, dtype=np.int64)
    held_min, held_sum, held_max = num_classes, 0, 0
    sizes = {split: [] for split in ("train", "test")}
    written, multilabel = 0, False
    try:
        for client, (train_x, train_y, test_x, test_y) in enumerate(clients):
            mine = np.zeros(num_classes, dtype=np.int64)
            for split, x, y in (("train", train_x, train_y), ("test", test_x, test_y)):
                writer.add(client, split, x, y)
                multilabel = multilabel or np.ndim(y) == 2
                mine += label_bincount(y, num_classes)
                if not packed:
                    sizes[split].append(len(y))
            if client < counted:
                labels[client] = mine
            overall += mine
            held = int(np.count_nonzero(mine))
            held_min, held_sum, held_max = min(held_min, held), held_sum + held, max(held_max, held)
            written += 1
        if written != num_clients:
            raise DatasetError(f"{written} clients written, {num_clients} expected")
        keys = writer.finish()
    except BaseException:
        writer.discard()
        raise
    if not packed:
        return keys, {"labels": labels, "train_sizes": np.asarray(sizes["train"], dtype=np.int64),
                      "test_sizes": np.asarray(sizes["test"], dtype=np.int64), "totals": None,
                      "multilabel": multilabel}
    skew = None
    if num_clients * num_classes <= FULL_COUNTS_LIMIT:
        skew = label_skew(writer.label_counts(num_classes, max(1, SKEW_ENTRIES // num_classes)), overall)[0]
    totals = Population(writer.sizes(), (held_min, held_sum / max(num_clients, 1), held_max), overall, skew)
    return keys, {"labels": labels, "train_rows": keys["train_rows"], "test_rows": keys["test_rows"], "totals": totals,
                  "multilabel": multilabel}


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def guarded(run: Callable[[], int]) -> int:
    """Run ``run()``; report our errors as one ``error:`` line and exit status 2."""
    try:
        return run()
    except DatasetError as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def natural_parts(data: RawDataset, keep: int | None) -> tuple[list[np.ndarray], list[int]]:
    """One client per natural group (the ``keep`` largest, ties by group id), largest first."""
    if data.groups is None:
        raise DatasetError(f"this dataset has no natural clients; choose a partition "
                           f"({', '.join(PARTITIONS)})")
    sizes = np.bincount(data.groups)
    order = [int(g) for g in np.argsort(-sizes, kind="stable") if sizes[g] > 0]
    if keep is not None:
        if keep > len(order):
            raise DatasetError(f"--num-clients {keep} exceeds the {len(order)} natural clients "
                               f"of this dataset")
        order = order[:keep]
    sort = np.argsort(data.groups, kind="stable")
    bounds = np.searchsorted(data.groups[sort], np.arange(len(sizes) + 1))
    return [sort[bounds[g]:bounds[g + 1]] for g in order], order


def generate(args: argparse.Namespace, name: str, load: Loader, script_dir: Path,
             num_classes: int | None = 10, extra_options: dict[str, Any] | None = None) -> int:
    """Generate ``name`` as ``args`` asks; returns the exit status.

    ``extra_options`` are dataset-specific options (EMNIST's split, a text
    dataset's vocabulary size...), stored in config.json and compared on reruns.
    """
    options = {**partition_options(args, name, num_classes), **(extra_options or {})}
    out_dir = output_folder(args.out_dir, Path(script_dir) / name)
    if not args.force and is_generated(out_dir, options):
        print(f"Dataset already generated in {out_dir} with these options; "
              f"skipped (pass --force to regenerate).")
        return 0
    data = load(args.raw_dir, out_dir / "rawdata")
    if num_classes is not None and data.num_classes != num_classes:
        raise DatasetError(f"{name}: the raw files hold {data.num_classes} classes, "
                           f"expected {num_classes}")
    if args.class_per_client > data.num_classes:
        raise DatasetError(f"--class-per-client must be between 1 and {data.num_classes}, "
                           f"got {args.class_per_client}")
    feature_skew.check(args.feature_skew, options["skew_strength"], data.x.shape[1:],
                       data.is_image)
    rng = np.random.default_rng(args.seed)
    domains = None
    if "natural_clients" in options:
        parts, groups = natural_parts(data, options["natural_clients"])
        if data.group_domains is not None:
            domains = [data.group_domains[g] for g in groups]
        names = [data.group_names[g] for g in groups] if data.group_names else None
        if names is not None:
            data.extra_config = {**(data.extra_config or {}), "client_names": names}
        write_federated(out_dir, data, parts, options, rng, client_domains=domains)
        return 0
    pool, shared_test = np.arange(len(data.y)), None
    if options["test_split"] == "global":
        if data.num_train is not None:
            pool, shared_test = pool[:data.num_train], pool[data.num_train:]
        else:
            # No official test set: hold out (1 - train_ratio) of the samples at random.
            shuffled = rng.permutation(pool)
            cut = int(np.floor(args.train_ratio * len(pool) + 1e-9))
            pool, shared_test = np.sort(shuffled[:cut]), np.sort(shuffled[cut:])
    local = make_partition(
        data.y[pool], num_clients=args.num_clients, num_classes=data.num_classes, rng=rng,
        non_iid=options["non_iid"], balance=options["balance"], partition=options["partition"],
        alpha=args.alpha, class_per_client=args.class_per_client,
        shards_per_client=args.shards_per_client, batch_size=args.batch_size,
        train_ratio=args.train_ratio, dir_fallback=args.dir_fallback, label_sets=args.label_sets)
    parts = [pool[p] for p in local]
    write_federated(out_dir, data, parts, options, rng, shared_test=shared_test)
    return 0


Binder = Callable[[argparse.Namespace], tuple[Loader, int | None, dict[str, Any]]]
"""From the parsed flags: the loader, the class count and the dataset-specific options."""


def main(argv: Sequence[str] | None, name: str, load: Loader | None, script_dir: Path, *,
         default_num_clients: int | None = 20, num_classes: int | None = 10,
         raw_dir_help: str | None = None, natural: bool = False,
         add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
         bind: Binder | None = None) -> int:
    """Entry point of a dataset's ``generate_<name>.py``.

    Datasets with their own flags pass ``add_arguments`` (adds them to the
    parser) and ``bind`` (turns the parsed flags into loader, class count and
    options); the others pass ``load`` and ``num_classes``.
    """
    parser = build_parser(name, default_num_clients=default_num_clients,
                          raw_dir_help=raw_dir_help, natural=natural)
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)

    def run() -> int:
        if bind is None:
            return generate(args, name, load, script_dir, num_classes)
        loader, classes, extra = bind(args)
        return generate(args, name, loader, script_dir, classes, extra)
    return guarded(run)


def synthetic_folder_name(alpha: float, beta: float, iid: bool) -> str:
    """``Synthetic`` for Synthetic(1,1), ``Synthetic_iid``, else ``Synthetic_<alpha>_<beta>``."""
    if iid:
        return "Synthetic_iid"
    if alpha == 1 and beta == 1:
        return "Synthetic"
    return f"Synthetic_{alpha:g}_{beta:g}"


def build_synthetic_parser() -> argparse.ArgumentParser:
    """Parser of ``generate_Synthetic.py``."""
    parser = argparse.ArgumentParser(
        prog="generate_Synthetic.py",
        description="FedProx's Synthetic(alpha, beta) federated data (no download needed).")
    _add_shared_arguments(parser, default_num_clients=30)
    parser.add_argument("--synthetic-alpha", type=float, default=1.0,
                        help="spread of the local models, u_k ~ N(0, alpha) (default 1)")
    parser.add_argument("--synthetic-beta", type=float, default=1.0,
                        help="spread of the local features, B_k ~ N(0, beta) (default 1)")
    parser.add_argument("--dim", type=int, default=60, help="feature dimension (default 60)")
    parser.add_argument("--num-classes", type=int, default=10, help="classes (default 10)")
    parser.add_argument("--iid", action="store_true",
                        help="FedProx's IID variant: one model and one feature distribution")
    parser.add_argument("--size-log-mean", type=float, default=SIZE_LOG_MEAN,
                        help=f"client sizes int(lognormal(m, s)) + min as in FedProx: m "
                             f"(default {SIZE_LOG_MEAN:g})")
    parser.add_argument("--size-log-std", type=float, default=SIZE_LOG_STD,
                        help=f"s of the client sizes (default {SIZE_LOG_STD:g})")
    parser.add_argument("--size-min", type=int, default=SIZE_MIN,
                        help=f"min of the client sizes (default {SIZE_MIN})")
    return parser


def generate_synthetic_dataset(args: argparse.Namespace, script_dir: Path) -> int:
    """Generate Synthetic(alpha, beta) as ``args`` asks; returns the exit status."""
    _check_shared(args)
    if args.synthetic_alpha < 0 or args.synthetic_beta < 0:
        raise DatasetError("--synthetic-alpha and --synthetic-beta must be non-negative")
    if args.dim < 1 or args.num_classes < 2:
        raise DatasetError("--dim must be at least 1 and --num-classes at least 2")
    if args.size_min < 1 or not (args.size_log_std >= 0 and np.isfinite(args.size_log_std)
                                 and np.isfinite(args.size_log_mean) and args.size_log_mean <= 20):
        raise DatasetError("--size-min must be at least 1, --size-log-std a finite number >= 0 "
                           "and --size-log-mean a number <= 20")
    name = synthetic_folder_name(args.synthetic_alpha, args.synthetic_beta, args.iid)
    options = {
        "dataset": name, "num_clients": args.num_clients, "num_classes": args.num_classes,
        "non_iid": not args.iid, "balance": False, "partition": "synthetic", "alpha": None,
        "batch_size": args.batch_size, "train_ratio": args.train_ratio, "seed": args.seed,
        "class_per_client": None, "samples_per_client": args.samples_per_client,
        "shards_per_client": None, **layout_option(args.layout, args.num_clients),
        "synthetic_alpha": args.synthetic_alpha, "synthetic_beta": args.synthetic_beta,
        "dim": args.dim, "iid": args.iid, "size_log_mean": args.size_log_mean,
        "size_log_std": args.size_log_std, "size_min": args.size_min,
    }
    out_dir = output_folder(args.out_dir, Path(script_dir) / name)
    if not args.force and is_generated(out_dir, options):
        print(f"Dataset already generated in {out_dir} with these options; "
              f"skipped (pass --force to regenerate).")
        return 0
    rng = np.random.default_rng(args.seed)
    sizes = synthetic_sizes(args.num_clients, rng, log_mean=args.size_log_mean,
                            log_std=args.size_log_std, minimum=args.size_min)
    # The split's sizes follow from the client sizes, so they are checked before anything is written.
    train_sizes = np.floor(args.train_ratio * sizes + 1e-9).astype(np.int64)
    capped = train_sizes if args.samples_per_client is None else np.minimum(train_sizes, args.samples_per_client)
    check_split_sizes(sizes, capped, sizes - train_sizes, options)

    def clients():  # drawn, split and written one at a time
        draws = synthetic_clients(sizes, args.synthetic_alpha, args.synthetic_beta, rng,
                                  dim=args.dim, num_classes=args.num_classes, iid=args.iid)
        for x, y in draws:
            train, test = train_test_split(np.arange(len(y)), args.train_ratio, rng)
            train = cap_samples(train, args.samples_per_client, rng)
            yield x[train], y[train], x[test], y[test]

    write_clients(out_dir, options, clients(), num_clients=args.num_clients,
                  num_classes=args.num_classes, class_names=[str(k) for k in range(args.num_classes)],
                  input_shape=[args.dim])
    return 0


def main_synthetic(argv: Sequence[str] | None, script_dir: Path) -> int:
    """Entry point of ``generate_Synthetic.py``."""
    args = build_synthetic_parser().parse_args(argv)
    return guarded(lambda: generate_synthetic_dataset(args, script_dir))
