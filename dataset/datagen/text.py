"""News classification text (AG News, Sogou News): CSV readers and tokenisation.

torchtext, which PFLlib uses, is no longer maintained; the text is tokenised
with Hugging Face ``tokenizers`` instead (pinned in requirements.txt):

* ``--tokenizer word`` (default): lower-cased, accents stripped, split on
  whitespace and punctuation, a word-level vocabulary of the ``--vocab-size``
  most frequent tokens of the **training split only** (no test-set leakage).
* ``--tokenizer bpe``: a byte-pair-encoding vocabulary of ``--vocab-size``
  tokens, trained on the same text.

Token ids are stored as int64 arrays ``[N, max_len]``: truncated after
``--max-len`` tokens (PFLlib: 200) and padded with 0 (``<pad>``); 1 is
``<unk>``. The trained tokenizer is saved as ``tokenizer.json`` next to
config.json (plain JSON), with ``vocab_size``, ``max_len``, ``pad_id`` in config.json.

CSV rows are ``"class","title","text"`` with classes numbered from 1; title and
text are joined with a space (torchtext does the same).
"""

from __future__ import annotations

import csv
import io
import tarfile
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np

from . import download
from .errors import DatasetError, ReadError
from .sources import Loader, RawDataset

PAD, UNK = "<pad>", "<unk>"
TOKENIZERS = ("word", "bpe")
AG_NEWS_CLASSES = ["World", "Sports", "Business", "Sci/Tech"]
SOGOU_NEWS_CLASSES = ["sports", "finance", "entertainment", "automobile", "technology"]
AG_NEWS_MIRRORS = ("https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/",)
AG_NEWS_FILES = (download.RemoteFile("train.csv", "b1a00f826fdfbd249f79597b59e1dc12"),
                 download.RemoteFile("test.csv", "d52ea96a97a2d943681189a97654912d"))
CSV_RAW_HELP = ("folder holding train.csv and test.csv, or {archive} (a tarball holding "
                "them); skips the download")


def parse_csv(data: bytes, name: str, num_classes: int) -> tuple[list[str], np.ndarray]:
    """``(texts, labels)`` of a news CSV; labels 1..K become 0..K-1."""
    texts, labels = [], []
    try:
        reader = csv.reader(io.StringIO(data.decode("utf-8")))
        for line, row in enumerate(reader, 1):
            if not row:
                continue
            if len(row) < 2 or not row[0].strip().isdigit():
                raise ReadError(f"{name}: line {line} is not 'class,title,text'")
            label = int(row[0]) - 1
            if not 0 <= label < num_classes:
                raise ReadError(f"{name}: line {line}: class {row[0]} outside 1..{num_classes}")
            labels.append(label)
            texts.append(" ".join(field.replace("\\n", " ") for field in row[1:]))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ReadError(f"{name}: not a UTF-8 CSV file ({exc})") from None
    if not labels:
        raise ReadError(f"{name}: no rows")
    return texts, np.array(labels, dtype=np.int64)


def read_csv_pair(path: Path, archive_name: str) -> tuple[tuple[bytes, str], tuple[bytes, str]]:
    """Raw bytes of train.csv and test.csv from a folder, a tarball, or a folder holding one."""
    path = Path(path)
    if path.is_dir():
        for folder in [path, *sorted(p for p in path.iterdir() if p.is_dir())]:
            if (folder / "train.csv").is_file() and (folder / "test.csv").is_file():
                return tuple((f.read_bytes(), str(f)) for f in
                             (folder / "train.csv", folder / "test.csv"))  # type: ignore[return-value]
        if (path / archive_name).is_file():
            path = path / archive_name
        else:
            raise ReadError(f"{path}: no train.csv and test.csv (expected "
                            f"{CSV_RAW_HELP.format(archive=archive_name).split('; ')[0]})")
    if not path.is_file():
        raise ReadError(f"{path}: no such file or folder")
    try:
        with tarfile.open(path, "r:*") as tar:
            members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
            out = []
            for name in ("train.csv", "test.csv"):
                if name not in members:
                    raise ReadError(f"{path}: no {name} inside")
                out.append((tar.extractfile(members[name]).read(), f"{path}:{name}"))
            return out[0], out[1]
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise ReadError(f"{path}: corrupt or truncated archive ({exc})") from None


def train_tokenizer(texts: Sequence[str], kind: str, vocab_size: int):
    """A ``tokenizers.Tokenizer`` trained on ``texts`` (the training split)."""
    try:
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    except ImportError:
        raise DatasetError("text datasets need Hugging Face tokenizers: pip install "
                           "-r requirements.txt (tokenizers==0.23.3)") from None
    if kind == "word":
        tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
        trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=[PAD, UNK])
    else:
        tokenizer = Tokenizer(models.BPE(unk_token=UNK))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, UNK],
                                      show_progress=False)
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFD(), normalizers.Lowercase(), normalizers.StripAccents()])
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


#: texts encoded at a time (a tokenizer's encodings of a whole split would be held at once)
ENCODE_BATCH = 8192


def encode(tokenizer, texts: Sequence[str], max_len: int) -> np.ndarray:
    """Token ids ``[len(texts), max_len]``, truncated and padded with 0."""
    out = np.zeros((len(texts), max_len), dtype=np.int64)
    for start in range(0, len(texts), ENCODE_BATCH):
        batch = tokenizer.encode_batch(list(texts[start:start + ENCODE_BATCH]))
        for row, encoding in enumerate(batch, start):
            ids = encoding.ids[:max_len]
            out[row, :len(ids)] = ids
    return out


def tokenised(train: tuple[list[str], np.ndarray], test: tuple[list[str], np.ndarray],
              classes: list[str], kind: str, vocab_size: int, max_len: int) -> RawDataset:
    tokenizer = train_tokenizer(train[0], kind, vocab_size)
    x = encode(tokenizer, train[0] + test[0], max_len)
    return RawDataset(x, np.concatenate([train[1], test[1]]), len(classes), list(classes),
                      pixel_max=None, num_train=len(train[1]),
                      extra_config={"vocab_size": tokenizer.get_vocab_size(), "max_len": max_len,
                                    "pad_id": 0, "unk_id": 1, "tokenizer": kind},
                      extra_files={"tokenizer.json": tokenizer.to_str()})


def check_text_options(kind: str, vocab_size: int, max_len: int) -> None:
    if kind not in TOKENIZERS:
        raise DatasetError(f"unknown --tokenizer {kind!r}; choose {' or '.join(TOKENIZERS)}")
    if vocab_size < 3:
        raise DatasetError(f"--vocab-size must be at least 3, got {vocab_size}")
    if max_len < 1:
        raise DatasetError(f"--max-len must be at least 1, got {max_len}")


def news_loader(name: str, classes: list[str], archive_name: str,
                files: Sequence[download.RemoteFile] | None, mirrors: Sequence[str],
                kind: str, vocab_size: int, max_len: int) -> Loader:
    """Loader of a news CSV dataset; ``files`` None means ``--raw-dir`` only."""
    check_text_options(kind, vocab_size, max_len)

    def load(raw_dir: Path | None, download_dir: Path) -> RawDataset:
        if raw_dir is not None:
            (train_bytes, train_name), (test_bytes, test_name) = read_csv_pair(raw_dir, archive_name)
        elif files is None:
            raise ReadError(f"{name} has no direct download link (Google Drive); put "
                            f"{archive_name} or train.csv and test.csv in a folder and pass "
                            f"--raw-dir FOLDER")
        else:
            paths = download.download_all(files, download_dir, download.mirrors_from_env(mirrors),
                                          dataset=name)
            (train_bytes, train_name), (test_bytes, test_name) = \
                [(p.read_bytes(), str(p)) for p in paths]
        train = parse_csv(train_bytes, train_name, len(classes))
        test = parse_csv(test_bytes, test_name, len(classes))
        return tokenised(train, test, classes, kind, vocab_size, max_len)
    return load


def add_text_arguments(parser, default_max_len: int = 200, source: str = "PFLlib's") -> None:
    """``--tokenizer``, ``--vocab-size`` and ``--max-len``; ``source`` names whose default
    ``default_max_len`` is."""
    parser.add_argument("--tokenizer", choices=TOKENIZERS, default="word",
                        help="word-level or BPE vocabulary, trained on the training split "
                             "(default word)")
    parser.add_argument("--vocab-size", type=int, default=30000,
                        help="vocabulary size including <pad> and <unk> (default 30000)")
    parser.add_argument("--max-len", type=int, default=default_max_len,
                        help=f"tokens kept per text, padded with 0 (default {default_max_len}, "
                             f"{source})")


def news_binder(name: str, classes: list[str], archive_name: str,
                files: Sequence[download.RemoteFile] | None, mirrors: Sequence[str]):
    """The ``bind`` of ``dataset_utils.main`` for a news CSV dataset."""
    def bind(args):
        loader = news_loader(name, classes, archive_name, files, mirrors, args.tokenizer,
                             args.vocab_size, args.max_len)
        return loader, len(classes), {"tokenizer": args.tokenizer,
                                      "requested_vocab_size": args.vocab_size,
                                      "max_len": args.max_len}
    return bind
