"""StackOverflow (TensorFlow Federated): one client per user, next-word or tag prediction.

Source: ``tff.simulation.datasets.stackoverflow.load_data`` (google-parfait/tensorflow-federated,
``tensorflow_federated/python/simulation/datasets/stackoverflow.py``). Current TFF downloads
``stackoverflow.sqlite.lzma`` from https://storage.googleapis.com/tff-datasets-public/ (no
checksum published; TFF's ``download.get_compressed_file`` decompresses it to
``stackoverflow.sqlite``); older TFF read ``stackoverflow.tar.bz2`` of h5 files, whose extracted
``stackoverflow_train.h5`` and ``stackoverflow_test.h5`` (the copies FedML distributes) ``--raw-dir``
reads too: TFF's ``HDF5ClientData`` schema, a group ``examples`` with one group per user (its id)
holding one dataset per feature, an entry per sentence (``hdf5_client_data.py``). The database has TFF's ``SqlClientData`` schema: a table ``examples``
(``split_name`` TEXT: ``train``, ``heldout`` or ``test``; ``client_id`` TEXT;
``serialized_example_proto`` BLOB, a serialized ``tf.train.Example``) and a table
``client_metadata`` (``client_id``, ``split_name``, ``num_examples``), with the indexes
``idx_examples_client_id`` (``client_id``) and ``idx_examples_client_id_split`` (``split_name,
client_id``) (the schema as google/fedjax's ``fedjax/core/sqlite_federated_data.py`` states it
for TFF's files). Each example's features are
``tokens`` (the sentence, words separated by single spaces), ``title``, ``tags`` (``|``-separated),
``creation_date``, ``type``, ``score``. TFF's splits: ``train`` (342,477 users, 135,818,730
sentences posted before 2018), ``heldout`` (users with id % 10 == 0), ``test`` (the train users'
sentences posted from 2018 on; 204,088 users).

The vocabulary file is ``stackoverflow.word_count`` inside ``stackoverflow.word_count.tar.bz2``
(same place, SHA-256 ``1dc00256…``, TFF's ``load_word_counts``): one ``word count`` line per
word, most frequent first.

Next-word prediction as TFF's baseline defines it
(``tensorflow_federated/python/simulation/baselines/stackoverflow/word_prediction_preprocessing.py``;
the task of Reddi et al., "Adaptive Federated Optimization", ICLR 2021):

* vocabulary: the first ``--vocab-size`` words of the word-count file (TFF's default 10,000);
  word ``i`` (0-based) is id ``i + 1``; id 0 is padding, ``V + 1`` out-of-vocabulary (one
  bucket), ``V + 2`` beginning of sentence, ``V + 3`` end of sentence: ``V + 4`` ids (10,004);
* a sentence is ``tokens.split(' ')`` cut to its first ``--max-len`` words (TFF's
  ``DEFAULT_SEQUENCE_LENGTH`` 20), looked up, an end-of-sentence id appended when it held fewer
  than ``--max-len`` words, a beginning-of-sentence id put in front; TFF pads it to
  ``max_len + 1`` and trains on inputs ``s[:-1]`` against targets ``s[1:]``, padding masked.

Here labels are one class per sample, so each of those targets is one sample: the input is the
sentence up to the target's position (``s[:t+1]``, right-padded with 0 to ``max_len``), the label
the target id ``s[t+1]``. A causal model reading the output at the last non-padding token
(``-m LSTM``) computes exactly what TFF's sequence model computes at position ``t``, and the
per-sample cross-entropy is TFF's per-token loss without padding. A sentence of ``n`` words gives
``min(n, max_len) + 1`` samples (``max_len`` when cut). ``num_classes`` is ``V + 4``
(padding and beginning-of-sentence are never labels).

Tag prediction (``--task tag``) as TFF's baseline defines it
(``tensorflow_federated/python/simulation/baselines/stackoverflow/tag_prediction_preprocessing.py``,
``build_to_ids_fn``; its defaults in ``tag_prediction_tasks.py`` and ``constants.py``: 10,000 words,
500 tags; the model there is a logistic regression from the bag of words to one sigmoid a tag):

* the tag vocabulary is the first ``--tag-vocab-size`` tags (TFF's default 500) of
  ``stackoverflow.tag_count`` inside ``stackoverflow.tag_count.tar.bz2`` (same place, SHA-256
  ``6fe281ce…``, TFF's ``load_tag_counts``): a JSON object tag -> count, which TFF sorts by
  decreasing count (a stable sort: ties keep the file's order), as is done here;
* the words of an example are ``tokens + ' ' + title`` split on whitespace, looked up in the first
  ``--vocab-size`` words of the word counts with one out-of-vocabulary bucket; TFF's input is the
  bag of those words (a vector over the vocabulary);
* its tags are ``tags`` split on ``|``, looked up in the tag vocabulary with one OOV bucket whose
  entry TFF drops: the label is a vector with a 1 per in-vocabulary tag.

Here one example is one sample, stored as the ids (not the bag) so that the files stay small:
``x`` holds the example's word ids in order, word ``i`` of the word counts as ``i + 1``, an
out-of-vocabulary word as ``V + 1``, right-padded with 0 to ``--max-len`` (default 128: an
example is one sentence and its question's title, where TFF's word task keeps 20 words of a
sentence; 128 leaves room for a sentence several times that long and its title while every row
stays 1 KiB, and the samples it cuts are counted, so a run says how many bags it changed;
``--max-len`` sets another cap); ``y`` holds the ids (positions in the sorted tag counts) of the
example's in-vocabulary tags, deduplicated, in their order, right-padded with -1 to 5 (Stack
Overflow allows at most 5 tags a question; more in one example is refused as a damaged file).
An example without in-vocabulary tags is kept (all -1), as TFF keeps it. Where this departs from
TFF: the words past ``--max-len`` are cut (the count of such samples is printed and stored as
``words_cut_samples``); a tag repeated within one example counts once (TFF's sum of one-hots
would give it 2). The bag itself is the reader's: TFF's current ``build_to_ids_fn`` divides the
in-vocabulary word counts by their sum, ignoring out-of-vocabulary words (``divide_no_nan``; an
example of OOV words only is all zeros), where its older version averaged one-hots over ``V + 1``
entries and dropped the OOV entry, so OOV words counted in the denominator; ``x`` keeps the OOV
ids so that either can be computed (``-m BoWLR``'s ``--bow_denominator``, ``system/flcore/trainmodel/text.py``).

Clients are the users of TFF's ``train`` split (``--num-clients N`` keeps the N with most
sentences, ties in TFF's sorted id order); ``--max-sentences N`` keeps each user's first N
sentences in the database's order (TFF's ``max_elements``, which TFF takes after a shuffle;
google-research/federated's ``optimization/stackoverflow/federated_stackoverflow.py``, the
Adaptive Federated Optimization code, takes 1,000).
``--test-split client`` splits each user's sentences with ``--train-ratio``;
``--test-split global`` tests each user on its own sentences of TFF's ``test`` split (the
``heldout`` users are not used).

Memory: the users' names and sentence counts, one user's sentences and samples at a time (read
with one query per user, as TFF's ``SqlClientData`` does), and the vocabulary.
"""

from __future__ import annotations

import json
import lzma
import os
import sqlite3
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import download
from .errors import DatasetError, ReadError
from .streamed import StreamedSource, keep_largest

MIRRORS = ("https://storage.googleapis.com/tff-datasets-public/",)
DATABASE = "stackoverflow.sqlite"
WORD_COUNT = "stackoverflow.word_count"
FILES = (download.RemoteFile(DATABASE + ".lzma", None),
         download.RemoteFile(WORD_COUNT + ".tar.bz2", None,
                             sha256="1dc00256d6e527c54b9756d968118378ae14e6692c0b3b6cad470cdd3f0c519c"))
TAG_COUNT = "stackoverflow.tag_count"
#: TFF's load_tag_counts (datasets/stackoverflow.py)
TAG_FILE = download.RemoteFile(TAG_COUNT + ".tar.bz2", None,
                               sha256="6fe281cec490d9384a290d560072438e7e2b377bbb823876ce7bd6f82696772d")
#: TFF's defaults (baselines/stackoverflow/constants.py)
DEFAULT_VOCAB_SIZE = 10000
DEFAULT_SEQUENCE_LENGTH = 20
DEFAULT_TAG_VOCAB_SIZE = 500
#: words kept per example of the tag task (module docstring)
DEFAULT_TAG_MAX_LEN = 128
#: tags a Stack Overflow question holds at most: the width of the tag task's labels
MAX_TAGS = 5
LABEL_PAD = -1
TASKS = ("word", "tag")
TRAIN, TEST = "train", "test"
RAW_HELP = (f"folder holding {DATABASE} (or {DATABASE}.lzma, or older TFF's stackoverflow_train.h5 "
            f"and stackoverflow_test.h5) and {WORD_COUNT} (or {WORD_COUNT}.tar.bz2), and for --task tag "
            f"{TAG_COUNT} (or {TAG_COUNT}.tar.bz2), TFF's files; skips the download")


# ------------------------------------------------------------------ tf.train.Example, decoded by hand
def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of a protobuf message: varints as ints, length-delimited
    fields as bytes (fixed 32/64-bit fields as their raw bytes)."""
    out, pos = [], 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ValueError("truncated field")
            value, pos = data[pos:pos + length], pos + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = data[pos:pos + size], pos + size
        else:
            raise ValueError(f"wire type {wire}")
        out.append((number, wire, value))
    return out


def parse_example(blob: bytes) -> dict[str, list]:
    """A serialized ``tf.train.Example`` as {feature: values}: bytes for a ``bytes_list``,
    ints for an ``int64_list`` (``Example.features`` = 1, ``Features.feature`` = 1, a map entry's
    key = 1 and value = 2, ``Feature.bytes_list`` = 1 / ``float_list`` = 2 / ``int64_list`` = 3,
    each list's ``value`` = 1; tensorflow/core/example/{example,feature}.proto)."""
    features: dict[str, list] = {}
    for number, _, message in _fields(blob):
        if number != 1:
            continue
        for entry_number, _, entry in _fields(message):
            if entry_number != 1:
                continue
            parts = {n: v for n, _, v in _fields(entry)}
            key = parts.get(1, b"").decode("utf-8")
            values: list = []
            for kind, _, body in _fields(parts.get(2, b"")):
                for _, wire, value in _fields(body):
                    if kind == 1:
                        values.append(value)
                    elif kind == 3 and wire == 2:  # packed int64s
                        pos = 0
                        while pos < len(value):
                            number_value, pos = _varint(value, pos)
                            values.append(number_value - (1 << 64) if number_value >> 63 else number_value)
                    elif kind == 3:
                        values.append(value - (1 << 64) if value >> 63 else value)
            features[key] = values
    return features


def sentence_of(blob: bytes, where: str) -> str:
    """The ``tokens`` feature of one serialized example."""
    return texts_of(blob, where, ("tokens",))[0]


#: the features the tag task reads of an example
TAG_FEATURES = ("tokens", "title", "tags")


def texts_of(blob: bytes, where: str, names: Sequence[str] = TAG_FEATURES) -> tuple[str, ...]:
    """The text features ``names`` of one serialized example."""
    try:
        features = parse_example(blob)
        return tuple(features[name][0].decode("utf-8") for name in names)
    except (ValueError, KeyError, IndexError, UnicodeDecodeError, AttributeError) as exc:
        named = f"a {names[0]!r} text" if len(names) == 1 else \
            ", ".join(repr(n) for n in names[:-1]) + f" and {names[-1]!r} texts"
        raise ReadError(f"{where}: an example is not a tf.train.Example with {named} "
                        f"({type(exc).__name__}: {exc})") from None


# ------------------------------------------------------------------ next-word samples
class Vocabulary:
    """TFF's id mapping (module docstring) for the first ``size`` words of the word counts."""

    def __init__(self, words: Sequence[str], max_len: int) -> None:
        self.words, self.max_len = list(words), max_len
        self.index = {w: i + 1 for i, w in enumerate(self.words)}
        size = len(self.words)
        self.oov, self.bos, self.eos = size + 1, size + 2, size + 3
        self.num_ids = size + 4

    def sequence(self, sentence: str) -> np.ndarray:
        """``[bos] + ids (+ [eos])`` of one sentence, as TFF's ``to_ids``."""
        words = sentence.split(" ")[:self.max_len]
        ids = [self.index.get(w, self.oov) for w in words]
        if len(ids) < self.max_len:
            ids.append(self.eos)
        return np.array([self.bos, *ids], dtype=np.int64)

    def samples(self, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """One sample per target of every sentence: (prefixes [n, max_len], next ids [n])."""
        xs, ys = [], []
        columns = np.arange(self.max_len)
        for sentence in sentences:
            seq = self.sequence(sentence)
            steps = len(seq) - 1
            prefix = np.zeros(self.max_len, dtype=np.int64)
            prefix[:steps] = seq[:steps]
            xs.append(np.where(columns[None, :] <= np.arange(steps)[:, None], prefix[None, :], 0))
            ys.append(seq[1:])
        if not xs:
            return np.zeros((0, self.max_len), dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(xs), np.concatenate(ys)

    def class_names(self) -> list[str]:
        return ["<pad>", *self.words, "<oov>", "<bos>", "<eos>"]


class TagVocabulary:
    """The tag task's ids (module docstring) for the first words of the word counts and the first
    tags of the tag counts; :meth:`example` makes one sample, :meth:`samples` stacks them."""

    def __init__(self, words: Sequence[str], tags: Sequence[str], max_len: int) -> None:
        self.words, self.tags, self.max_len = list(words), list(tags), max_len
        self.index = {w: i + 1 for i, w in enumerate(self.words)}
        self.tag_index = {t: i for i, t in enumerate(self.tags)}
        self.oov = len(self.words) + 1
        self.num_ids = len(self.words) + 2

    def example(self, tokens: str, title: str, tags: str, where: str) -> tuple[np.ndarray, np.ndarray, bool]:
        """(word ids [max_len], tag ids [MAX_TAGS], whether words were cut) of one example."""
        words = (tokens + " " + title).split()
        ids = np.zeros(self.max_len, dtype=np.int64)
        kept = [self.index.get(w, self.oov) for w in words[:self.max_len]]
        ids[:len(kept)] = kept
        found = list(dict.fromkeys(self.tag_index[t] for t in tags.split("|") if t in self.tag_index))
        if len(found) > MAX_TAGS:
            raise ReadError(f"{where}: an example has {len(found)} tags of the tag vocabulary ({tags!r}), "
                            f"more than the {MAX_TAGS} Stack Overflow allows; the database is damaged or "
                            f"not TFF's, download it again")
        labels = np.full(MAX_TAGS, LABEL_PAD, dtype=np.int64)
        labels[:len(found)] = found
        return ids, labels, len(words) > self.max_len

    def samples(self, examples: Sequence[tuple[np.ndarray, np.ndarray, bool]]) -> tuple[np.ndarray, ...]:
        """(x [n, max_len], y [n, MAX_TAGS], cut [n]) of examples made by :meth:`example`."""
        if not examples:
            return (np.zeros((0, self.max_len), dtype=np.int64),
                    np.zeros((0, MAX_TAGS), dtype=np.int64), np.zeros(0, dtype=bool))
        return (np.stack([e[0] for e in examples]), np.stack([e[1] for e in examples]),
                np.array([e[2] for e in examples], dtype=bool))


def _member_text(path: Path, member_name: str, what: str) -> str:
    """The text of ``path``, or of its member ``member_name`` for a ``.tar.bz2``."""
    try:
        if path.name.endswith(".tar.bz2"):
            with tarfile.open(path, "r:bz2") as tar:
                member = next((m for m in tar if m.isfile() and Path(m.name).name == member_name), None)
                if member is None:
                    raise ReadError(f"{path}: no {member_name} inside")
                return tar.extractfile(member).read().decode("utf-8")
        return path.read_text(encoding="utf-8")
    except (tarfile.TarError, EOFError, OSError, UnicodeDecodeError, ValueError) as exc:
        raise ReadError(f"{path}: corrupt or truncated {what} file ({type(exc).__name__}: {exc})") from None


def read_tag_counts(path: Path, size: int) -> list[str]:
    """The ``size`` most frequent tags of ``stackoverflow.tag_count`` (or of its ``.tar.bz2``): a
    JSON object tag -> count, sorted by decreasing count, ties in the file's order (TFF's
    ``load_tag_counts``)."""
    text = _member_text(path, TAG_COUNT, "tag-count")
    try:
        counts = json.loads(text)
    except ValueError as exc:
        raise ReadError(f"{path}: corrupt or truncated tag-count file, not JSON ({exc})") from None
    if not isinstance(counts, dict) or not all(isinstance(c, int) and not isinstance(c, bool)
                                               for c in counts.values()):
        raise ReadError(f"{path}: not a tag-count file (a JSON object of tag -> count)")
    if len(counts) < size:
        raise ReadError(f"{path}: {len(counts)} tags, fewer than --tag-vocab-size {size}")
    return [tag for tag, _ in sorted(counts.items(), key=lambda item: item[1], reverse=True)][:size]


def read_word_counts(path: Path, size: int) -> list[str]:
    """The first ``size`` words of ``stackoverflow.word_count`` (or of its ``.tar.bz2``)."""
    text = _member_text(path, WORD_COUNT, "word-count")
    words = []
    for line_number, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            raise ReadError(f"{path}: line {line_number} is not 'word count'")
        words.append(parts[0])
        if len(words) == size:
            return words
    raise ReadError(f"{path}: {len(words)} words, fewer than --vocab-size {size}")


# ------------------------------------------------------------------ the database
def decompress_lzma(source: Path, dest: Path) -> Path:
    """``source`` (``.lzma`` or ``.xz``) decompressed to ``dest`` under a temporary name."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with lzma.open(source) as src, os.fdopen(fd, "wb") as out:
            for block in iter(lambda: src.read(1 << 20), b""):
                out.write(block)
        os.replace(tmp, dest)
    except (lzma.LZMAError, EOFError) as exc:
        raise ReadError(f"{source}: corrupt or truncated LZMA file ({exc})") from None
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def check_sqlite_file(path: Path) -> None:
    """SQLite's header says how long the file is (page size x page count): a shorter or longer
    file is a truncated or damaged copy (https://www.sqlite.org/fileformat2.html, 1.3)."""
    try:
        with open(path, "rb") as fh:
            header = fh.read(100)
        size = path.stat().st_size
    except OSError as exc:
        raise ReadError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        raise ReadError(f"{path}: not an SQLite database")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    valid = header[24:28] == header[92:96] and pages > 0  # the count is valid for this change
    if valid and size != page_size * pages:
        raise ReadError(f"{path}: {size} bytes where its header says {page_size * pages} "
                        f"(a truncated or damaged copy); download it again")


class Database:
    """TFF's ``SqlClientData`` file, opened read-only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        check_sqlite_file(path)
        try:
            self.connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            tables = {r[0] for r in self.connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            columns = {r[1] for r in self.connection.execute("PRAGMA table_info(examples)")}
            meta = {r[1] for r in self.connection.execute("PRAGMA table_info(client_metadata)")}
        except sqlite3.Error as exc:
            raise ReadError(f"{path}: not a readable SQLite database ({exc})") from None
        needed = {"split_name", "client_id", "serialized_example_proto"}
        if not {"examples", "client_metadata"} <= tables or not needed <= columns \
                or not {"client_id", "split_name"} <= meta:
            raise ReadError(f"{path}: not TFF's SqlClientData schema (tables examples with "
                            f"{', '.join(sorted(needed))} and client_metadata)")
        self.has_counts = "num_examples" in meta
        keys = [tuple(r[2] for r in sorted(self._query(f"PRAGMA index_info({_quoted(index[1])})")))
                for index in self._query("PRAGMA index_list(examples)")]
        if not any(key[:1] == ("client_id",) or key[:2] == ("split_name", "client_id") for key in keys):
            print(f"warning: {path} has no index on examples.client_id (TFF's has "
                  f"idx_examples_client_id): each user's query reads the whole table", file=sys.stderr)

    def _query(self, sql: str, parameters: tuple = ()) -> list[tuple]:
        try:
            return self.connection.execute(sql, parameters).fetchall()
        except sqlite3.Error as exc:
            raise ReadError(f"{self.path}: corrupt database ({exc}); download it again") from None

    def counts(self, split: str) -> dict[str, int]:
        """Sentences per user of ``split`` (``client_metadata.num_examples``, else counted)."""
        if self.has_counts:
            rows = self._query("SELECT client_id, SUM(num_examples) FROM client_metadata "
                               "WHERE split_name = ? GROUP BY client_id", (split,))
        else:
            rows = self._query("SELECT client_id, COUNT(*) FROM examples WHERE split_name = ? "
                               "GROUP BY client_id", (split,))
        return {str(user): int(n) for user, n in rows}

    def _blobs(self, user: str, split: str, limit: int | None) -> list[bytes]:
        rows = self._query("SELECT serialized_example_proto FROM examples WHERE client_id = ? AND "
                           "split_name = ? ORDER BY rowid" + ("" if limit is None else " LIMIT ?"),
                           (user, split) if limit is None else (user, split, limit))
        return [bytes(blob) for (blob,) in rows]

    def sentences(self, user: str, split: str, limit: int | None) -> list[str]:
        return [sentence_of(blob, f"{self.path}: user {user!r}") for blob in self._blobs(user, split, limit)]

    def examples(self, user: str, split: str, limit: int | None) -> list[tuple[str, ...]]:
        """(tokens, title, tags) of each of the user's examples."""
        return [texts_of(blob, f"{self.path}: user {user!r}") for blob in self._blobs(user, split, limit)]


class H5Splits:
    """Older TFF's h5 files (``stackoverflow_<split>.h5``), with :class:`Database`'s reads."""

    FILES = {TRAIN: "stackoverflow_train.h5", TEST: "stackoverflow_test.h5"}

    def __init__(self, folder: Path) -> None:
        self.folder, self.files = folder, {}

    def _examples(self, split: str):
        if split not in self.files:
            import h5py

            path = self.folder / self.FILES[split]
            try:
                self.files[split] = h5py.File(path, "r")["examples"]
            except (OSError, KeyError) as exc:
                raise ReadError(f"{path}: not TFF's HDF5ClientData file (a group 'examples' of users) "
                                f"or a truncated copy ({exc})") from None
        return self.files[split]

    def _tokens(self, split: str, user: str, feature: str = "tokens"):
        try:
            return self._examples(split)[user][feature]
        except (KeyError, OSError) as exc:
            raise ReadError(f"{self.folder / self.FILES[split]}: user {user!r} has no readable {feature!r} "
                            f"({exc})") from None

    def counts(self, split: str) -> dict[str, int]:
        return {str(user): len(self._tokens(split, user)) for user in self._examples(split)}

    def sentences(self, user: str, split: str, limit: int | None) -> list[str]:
        if user not in self._examples(split):
            return []
        return self._texts(user, split, limit, "tokens")

    def _texts(self, user: str, split: str, limit: int | None, feature: str) -> list[str]:
        values = self._tokens(split, user, feature)
        try:
            values = values[()] if limit is None else values[:limit]
            return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]
        except (OSError, UnicodeDecodeError) as exc:
            raise ReadError(f"{self.folder / self.FILES[split]}: user {user!r}: unreadable {feature} ({exc})") from None

    def examples(self, user: str, split: str, limit: int | None) -> list[tuple[str, ...]]:
        """(tokens, title, tags) of each of the user's examples."""
        if user not in self._examples(split):
            return []
        columns = [self._texts(user, split, limit, feature) for feature in TAG_FEATURES]
        if len({len(c) for c in columns}) != 1:
            raise ReadError(f"{self.folder / self.FILES[split]}: user {user!r}: "
                            f"{', '.join(f'{len(c)} {n}' for c, n in zip(columns, TAG_FEATURES))}; download it again")
        return list(zip(*columns))


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _raw_file(folder: Path, name: str, packed: str) -> Path:
    for candidate in (folder / name, folder / packed):
        if candidate.is_file():
            return candidate
    raise ReadError(f"--raw-dir {folder}: neither {name} nor {packed} (expected {RAW_HELP.split('; ')[0]})")


def locate(raw_dir: Path | None, download_dir: Path) -> tuple[Path, Path]:
    """(the SQLite database or the folder of h5 files, the word-count file), downloaded when
    ``raw_dir`` is None; a compressed database is decompressed into ``download_dir``."""
    if raw_dir is None:
        database, words = download.download_all(FILES, download_dir, download.mirrors_from_env(MIRRORS),
                                                dataset="StackOverflow")
    else:
        folder = Path(raw_dir)
        if not folder.is_dir():
            raise ReadError(f"--raw-dir {folder}: no such folder")
        words = _raw_file(folder, WORD_COUNT, WORD_COUNT + ".tar.bz2")
        if (folder / H5Splits.FILES[TRAIN]).is_file():
            return folder, words
        database = _raw_file(folder, DATABASE, DATABASE + ".lzma")
    if database.suffix == ".lzma":
        target = download_dir / DATABASE
        if not target.is_file():
            download_dir.mkdir(parents=True, exist_ok=True)
            decompress_lzma(database, target)
        database = target
    return database, words


def locate_tag_counts(raw_dir: Path | None, download_dir: Path) -> Path:
    """The tag-count file (``--raw-dir``'s, or downloaded and checked against TFF's SHA-256)."""
    if raw_dir is None:
        return download.download_all([TAG_FILE], download_dir, download.mirrors_from_env(MIRRORS),
                                     dataset="StackOverflow")[0]
    return _raw_file(Path(raw_dir), TAG_COUNT, TAG_FILE.name)


def open_stackoverflow(raw_dir: Path | None, download_dir: Path, options: dict[str, Any]) -> StreamedSource:
    database_path, words_path = locate(raw_dir, download_dir)
    words = read_word_counts(words_path, options["requested_vocab_size"])
    tag_task = options.get("label_type") == "multilabel"
    if tag_task:
        tags = read_tag_counts(locate_tag_counts(raw_dir, download_dir), options["tag_vocab_size"])
    db = H5Splits(database_path) if database_path.is_dir() else Database(database_path)
    counts = db.counts(TRAIN)
    names = sorted(counts)  # TFF's SqlClientData sorts its client ids
    if not names:
        raise ReadError(f"{database_path}: no users in the {TRAIN} split")
    limit = options["max_sentences"]
    sizes = np.array([counts[n] if limit is None else min(counts[n], limit) for n in names], dtype=np.int64)
    order = keep_largest(names, sizes, options["natural_clients"])
    kept = [names[i] for i in order]
    test_sizes = None
    if options["test_split"] == "global":
        test_counts = db.counts(TEST)
        test_sizes = np.array([test_counts.get(n, 0) for n in kept], dtype=np.int64)
    if tag_task:
        return _tag_source(db, kept, sizes[order], test_sizes, limit, TagVocabulary(words, tags, options["max_len"]))
    vocabulary = Vocabulary(words, options["max_len"])
    return StreamedSource(
        names=kept, sizes=sizes[order],
        units=lambda c: db.sentences(kept[c], TRAIN, limit),
        test_units=lambda c: db.sentences(kept[c], TEST, None),
        test_sizes=test_sizes, encode=vocabulary.samples, num_classes=vocabulary.num_ids,
        class_names=vocabulary.class_names(), input_shape=[options["max_len"]],
        extra_config={"vocab_size": vocabulary.num_ids, "max_len": options["max_len"], "pad_id": 0,
                      "oov_id": vocabulary.oov, "bos_id": vocabulary.bos, "eos_id": vocabulary.eos,
                      "task": "next-word prediction (TFF): input = the sentence up to a position, "
                              "label = the next id"})


def _tag_source(db, kept: list[str], sizes: np.ndarray, test_sizes: np.ndarray | None, limit: int | None,
                vocabulary: TagVocabulary) -> StreamedSource:
    """The tag task's users: one sample per example (module docstring)."""
    def examples(user: str, split: str, cap: int | None) -> list[tuple[np.ndarray, np.ndarray, bool]]:
        where = f"{getattr(db, 'path', getattr(db, 'folder', ''))}: user {user!r}"
        return [vocabulary.example(*texts, where) for texts in db.examples(user, split, cap)]

    length = vocabulary.max_len
    return StreamedSource(
        names=kept, sizes=sizes,
        units=lambda c: examples(kept[c], TRAIN, limit),
        test_units=lambda c: examples(kept[c], TEST, None),
        test_sizes=test_sizes, encode=vocabulary.samples, num_classes=len(vocabulary.tags),
        class_names=list(vocabulary.tags), input_shape=[length],
        extra_config={"label_type": "multilabel", "max_labels": MAX_TAGS, "label_pad": LABEL_PAD,
                      "vocab_size": vocabulary.num_ids, "pad_id": 0, "oov_id": vocabulary.oov,
                      "max_len": length,
                      "task": f"tag prediction (TFF): input = the word ids of tokens + ' ' + title (cut "
                              f"to {length}, 0-padded, OOV = oov_id), labels = the ids of its "
                              f"in-vocabulary tags (at most {MAX_TAGS}, -1-padded)"},
        flagged="words_cut_samples",
        flagged_note=f"had more than --max-len {length} words, cut to {length} (their bag of words misses the rest)")


def add_arguments(parser) -> None:
    parser.add_argument("--task", choices=TASKS, default="word",
                        help="word: TFF's next-word prediction, one class a sample; tag: TFF's tag "
                             "prediction, the words of an example -> its tags, multi-label (default word)")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE,
                        help=f"most frequent words of the word-count file kept (default "
                             f"{DEFAULT_VOCAB_SIZE}, TFF's); ids add padding, OOV (and for the word "
                             f"task BOS, EOS)")
    parser.add_argument("--tag-vocab-size", type=int, default=None,
                        help=f"--task tag: most frequent tags of the tag-count file kept, the classes "
                             f"(default {DEFAULT_TAG_VOCAB_SIZE}, TFF's)")
    parser.add_argument("--max-len", type=int, default=None,
                        help=f"words kept per sentence (default {DEFAULT_SEQUENCE_LENGTH}, TFF's) or, for "
                             f"--task tag, per example (default {DEFAULT_TAG_MAX_LEN})")
    parser.add_argument("--max-sentences", type=int, default=None, metavar="N",
                        help="keep each user's first N training sentences (default: all)")


def extra_options(args) -> dict[str, Any]:
    tag_task = args.task == "tag"
    max_len = args.max_len if args.max_len is not None else \
        DEFAULT_TAG_MAX_LEN if tag_task else DEFAULT_SEQUENCE_LENGTH
    if args.vocab_size < 1 or max_len < 1:
        raise DatasetError(f"--vocab-size and --max-len must be at least 1, got {args.vocab_size} "
                           f"and {max_len}")
    if args.max_sentences is not None and args.max_sentences < 1:
        raise DatasetError(f"--max-sentences must be at least 1, got {args.max_sentences}")
    options = {"requested_vocab_size": args.vocab_size, "max_len": max_len,
               "max_sentences": args.max_sentences}
    if not tag_task:
        if args.tag_vocab_size is not None:
            raise DatasetError("--tag-vocab-size applies to --task tag")
        return options
    tag_vocab_size = DEFAULT_TAG_VOCAB_SIZE if args.tag_vocab_size is None else args.tag_vocab_size
    if tag_vocab_size < 1:
        raise DatasetError(f"--tag-vocab-size must be at least 1, got {tag_vocab_size}")
    if args.few_shot is not None:
        raise DatasetError("--few-shot keeps N samples per label, which a sample of several tags does not "
                           "have; leave it out for --task tag (--samples-per-client caps the samples)")
    return {"label_type": "multilabel", **options, "tag_vocab_size": tag_vocab_size}
