"""StackOverflow (TensorFlow Federated): one client per user, next-word prediction.

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
(padding and beginning-of-sentence are never labels). TFF's tag-prediction task (bag of words
-> the top 500 tags, multi-label) is not generated: a sample here has one integer label.

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
#: TFF's defaults (baselines/stackoverflow/constants.py)
DEFAULT_VOCAB_SIZE = 10000
DEFAULT_SEQUENCE_LENGTH = 20
TRAIN, TEST = "train", "test"
RAW_HELP = (f"folder holding {DATABASE} (or {DATABASE}.lzma, or older TFF's stackoverflow_train.h5 "
            f"and stackoverflow_test.h5) and {WORD_COUNT} (or {WORD_COUNT}.tar.bz2), TFF's files; "
            f"skips the download")


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
    try:
        tokens = parse_example(blob)["tokens"]
        return tokens[0].decode("utf-8")
    except (ValueError, KeyError, IndexError, UnicodeDecodeError, AttributeError) as exc:
        raise ReadError(f"{where}: an example is not a tf.train.Example with a 'tokens' text "
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


def read_word_counts(path: Path, size: int) -> list[str]:
    """The first ``size`` words of ``stackoverflow.word_count`` (or of its ``.tar.bz2``)."""
    try:
        if path.name.endswith(".tar.bz2"):
            with tarfile.open(path, "r:bz2") as tar:
                member = next((m for m in tar if m.isfile() and Path(m.name).name == WORD_COUNT), None)
                if member is None:
                    raise ReadError(f"{path}: no {WORD_COUNT} inside")
                text = tar.extractfile(member).read().decode("utf-8")
        else:
            text = path.read_text(encoding="utf-8")
    except (tarfile.TarError, EOFError, OSError, UnicodeDecodeError, ValueError) as exc:
        raise ReadError(f"{path}: corrupt or truncated word-count file ({type(exc).__name__}: {exc})") from None
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

    def sentences(self, user: str, split: str, limit: int | None) -> list[str]:
        rows = self._query("SELECT serialized_example_proto FROM examples WHERE client_id = ? AND "
                           "split_name = ? ORDER BY rowid" + ("" if limit is None else " LIMIT ?"),
                           (user, split) if limit is None else (user, split, limit))
        return [sentence_of(bytes(blob), f"{self.path}: user {user!r}") for (blob,) in rows]


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

    def _tokens(self, split: str, user: str):
        try:
            return self._examples(split)[user]["tokens"]
        except (KeyError, OSError) as exc:
            raise ReadError(f"{self.folder / self.FILES[split]}: user {user!r} has no readable 'tokens' "
                            f"({exc})") from None

    def counts(self, split: str) -> dict[str, int]:
        return {str(user): len(self._tokens(split, user)) for user in self._examples(split)}

    def sentences(self, user: str, split: str, limit: int | None) -> list[str]:
        if user not in self._examples(split):
            return []
        tokens = self._tokens(split, user)
        try:
            values = tokens[()] if limit is None else tokens[:limit]
            return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]
        except (OSError, UnicodeDecodeError) as exc:
            raise ReadError(f"{self.folder / self.FILES[split]}: user {user!r}: unreadable tokens ({exc})") from None


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


def open_stackoverflow(raw_dir: Path | None, download_dir: Path, options: dict[str, Any]) -> StreamedSource:
    database_path, words_path = locate(raw_dir, download_dir)
    vocabulary = Vocabulary(read_word_counts(words_path, options["requested_vocab_size"]), options["max_len"])
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


def add_arguments(parser) -> None:
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE,
                        help=f"most frequent words of the word-count file kept (default "
                             f"{DEFAULT_VOCAB_SIZE}, TFF's); ids add padding, OOV, BOS, EOS")
    parser.add_argument("--max-len", type=int, default=DEFAULT_SEQUENCE_LENGTH,
                        help=f"words kept per sentence (default {DEFAULT_SEQUENCE_LENGTH}, TFF's)")
    parser.add_argument("--max-sentences", type=int, default=None, metavar="N",
                        help="keep each user's first N training sentences (default: all)")


def extra_options(args) -> dict[str, Any]:
    if args.vocab_size < 1 or args.max_len < 1:
        raise DatasetError(f"--vocab-size and --max-len must be at least 1, got {args.vocab_size} "
                           f"and {args.max_len}")
    if args.max_sentences is not None and args.max_sentences < 1:
        raise DatasetError(f"--max-sentences must be at least 1, got {args.max_sentences}")
    return {"requested_vocab_size": args.vocab_size, "max_len": args.max_len,
            "max_sentences": args.max_sentences}
