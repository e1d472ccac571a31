"""Sent140 (LEAF): Sentiment140's tweets, one client per Twitter user, binary sentiment.

Source: LEAF (Caldas et al. 2018; TalwalkarLab/leaf ``data/sent140/``). LEAF's ``get_data.sh``
downloads ``trainingandtestdata.zip`` from http://cs.stanford.edu/people/alecmgo/ (no checksum
published: checked by format) and reads ``training.1600000.processed.noemoticon.csv``: 1.6M rows
``polarity,id,date,query,user,text``, ISO-8859-1 (latin-1), every field quoted. LEAF's
``data_to_json.py`` groups the rows by user (sorted by name) with label ``1`` for polarity
``4``, else ``0``; here polarity must be 0 or 4 (the training file holds no other) and any
other row is refused. LEAF also appends the 498 hand-labelled tweets of
``testdata.manual.2009.06.14.csv`` (other users, with a neutral class 2 that LEAF labels 0);
they are not read here.

Users: LEAF's ``remove_users.py`` keeps a user with **more than** ``-k`` tweets
(``num_samples > min_samples``; its default 10, which ``--min-samples`` takes); then
``--num-clients N`` keeps the N users with most tweets (ties by name), the natural partition's
rule. Each user's tweets are split with ``--train-ratio`` (LEAF's ``-t sample``, which splits
every user's samples; LEAF's ``--tf`` is 0.9, the platform's default 0.75).

Text: the platform's tokenisation (``text.py``: Hugging Face ``tokenizers``, ``--tokenizer
word|bpe``, ``--vocab-size``), trained on the kept users' training tweets only; ``--max-len``
tokens per tweet (default 25, LEAF's ``max_words`` in ``models/sent140/stacked_lstm.py``; LEAF
looks words up in GloVe's vocabulary instead).

Memory: the CSV is ordered by polarity, not by user, so it is read three times (counting, the
tokenizer's training text, the kept tweets) and holds one user id and label per row, the user
names, and the kept users' tweets as text until they are written, user by user.
"""

from __future__ import annotations

import csv
from array import array
import io
import zipfile
import zlib
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from . import download, text
from .errors import DatasetError, ReadError
from .streamed import StreamedSource, keep_largest, split_units

MIRRORS = ("http://cs.stanford.edu/people/alecmgo/",)
ARCHIVE = "trainingandtestdata.zip"
TRAINING_CSV = "training.1600000.processed.noemoticon.csv"
FILES = (download.RemoteFile(ARCHIVE, None),)
CLASSES = ["negative", "positive"]
#: LEAF's remove_users.py default (it keeps users with more tweets than this)
DEFAULT_MIN_SAMPLES = 10
#: LEAF's max_words of the sent140 model
DEFAULT_MAX_LEN = 25
POLARITIES = {"0": 0, "4": 1}
RAW_HELP = f"folder holding {ARCHIVE} or {TRAINING_CSV} (Sentiment140's files); skips the download"


def _open_csv(path: Path):
    """A binary stream of the training CSV: the file itself, or its member of the zip."""
    if path.suffix == ".csv":
        return open(path, "rb")
    try:
        archive = zipfile.ZipFile(path)
        name = next((n for n in archive.namelist() if Path(n).name == TRAINING_CSV), None)
        if name is None:
            raise ReadError(f"{path}: no {TRAINING_CSV} inside")
        return archive.open(name)
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise ReadError(f"{path}: corrupt or truncated zip ({exc})") from None


def rows(path: Path) -> Iterator[tuple[int, str, int, str]]:
    """(row number, user, label, text) of every row of the training CSV."""
    try:
        with _open_csv(path) as raw:
            reader = csv.reader(io.TextIOWrapper(raw, encoding="latin-1", newline=""))
            for number, row in enumerate(reader, 1):
                if len(row) != 6 or row[0] not in POLARITIES:
                    raise ReadError(f"{path}: row {number} is not 'polarity,id,date,query,user,text' "
                                    f"with polarity 0 or 4")
                yield number, row[4], POLARITIES[row[0]], row[5]
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error, csv.Error) as exc:
        raise ReadError(f"{path}: corrupt or truncated file ({exc})") from None


def locate(raw_dir: Path | None, download_dir: Path) -> Path:
    if raw_dir is None:
        (archive,) = download.download_all(FILES, download_dir, download.mirrors_from_env(MIRRORS),
                                           dataset="Sent140")
        return archive
    folder = Path(raw_dir)
    if not folder.is_dir():
        raise ReadError(f"--raw-dir {folder}: no such folder")
    for name in (ARCHIVE, TRAINING_CSV):
        if (folder / name).is_file():
            return folder / name
    raise ReadError(f"--raw-dir {folder}: neither {ARCHIVE} nor {TRAINING_CSV}")


def open_sent140(raw_dir: Path | None, download_dir: Path, options: dict[str, Any]) -> StreamedSource:
    path = locate(raw_dir, download_dir)
    # pass 1: each row's user and label
    index: dict[str, int] = {}
    users, labels = array("q"), array("b")
    for _, user, label, _ in rows(path):
        users.append(index.setdefault(user, len(index)))
        labels.append(label)
    if not labels:
        raise ReadError(f"{path}: no rows")
    row_user = np.frombuffer(users, dtype=np.int64)
    row_label = np.frombuffer(labels, dtype=np.int8)
    names = sorted(index)  # LEAF's order
    by_name = np.array([index[n] for n in names], dtype=np.int64)
    counts = np.bincount(row_user, minlength=len(names))[by_name]
    eligible = counts > options["min_samples"]
    if not eligible.any():
        raise DatasetError(f"no user has more than --min-samples {options['min_samples']} tweets")
    order = keep_largest(names, np.where(eligible, counts, 0), options["natural_clients"])
    kept = [names[i] for i in order]
    client_of = np.full(len(names), -1, dtype=np.int64)  # first-seen user id -> client
    client_of[by_name[order]] = np.arange(len(order))
    row_client = client_of[row_user]
    del row_user
    # each client's tweets in file order, split as the writer splits them
    row_order = np.argsort(row_client, kind="stable")
    starts = np.searchsorted(row_client[row_order], np.arange(len(kept) + 1))
    is_train = np.zeros(len(row_client), dtype=bool)
    for c in range(len(kept)):
        mine = row_order[starts[c]:starts[c + 1]]
        train, _, _ = split_units(len(mine), c, options)
        is_train[mine[train]] = True
    # pass 2: the tokenizer learns the kept users' training tweets
    tokenizer = text.train_tokenizer((t for number, _, _, t in rows(path) if is_train[number - 1]),
                                     options["tokenizer"], options["requested_vocab_size"])
    # pass 3: the kept users' tweets, grouped by client
    tweets: list[list[tuple[str, int]]] = [[] for _ in kept]
    for number, _, label, tweet in rows(path):
        c = row_client[number - 1]
        if c >= 0:
            tweets[c].append((tweet, label))
    max_len = options["max_len"]

    def encode(units):
        x = text.encode(tokenizer, [t for t, _ in units], max_len)
        return x, np.array([label for _, label in units], dtype=np.int64)

    def units(c: int):
        mine, tweets[c] = tweets[c], []  # handed over once: written, then let go
        return mine

    return StreamedSource(
        names=kept, sizes=counts[order], units=units, encode=encode, num_classes=len(CLASSES),
        class_names=list(CLASSES), input_shape=[max_len],
        extra_config={"vocab_size": tokenizer.get_vocab_size(), "max_len": max_len, "pad_id": 0,
                      "unk_id": 1, "tokenizer": options["tokenizer"],
                      "positive_share": float(row_label[row_client >= 0].mean())},
        extra_files={"tokenizer.json": tokenizer.to_str()})


def add_arguments(parser) -> None:
    parser.add_argument("--min-samples", type=int, default=DEFAULT_MIN_SAMPLES, metavar="K",
                        help=f"keep users with more than K tweets (LEAF's -k, default "
                             f"{DEFAULT_MIN_SAMPLES})")
    text.add_text_arguments(parser, default_max_len=DEFAULT_MAX_LEN, source="LEAF's")


def extra_options(args) -> dict[str, Any]:
    text.check_text_options(args.tokenizer, args.vocab_size, args.max_len)
    if args.min_samples < 0:
        raise DatasetError(f"--min-samples must be at least 0, got {args.min_samples}")
    return {"min_samples": args.min_samples, "tokenizer": args.tokenizer,
            "requested_vocab_size": args.vocab_size, "max_len": args.max_len}
