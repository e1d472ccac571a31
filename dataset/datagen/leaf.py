"""LEAF's JSON folders: FEMNIST (one client per writer) and Shakespeare (one per speaking role).

LEAF (Caldas et al. 2018, https://github.com/TalwalkarLab/leaf) turns NIST SD19
and Project Gutenberg's Shakespeare into JSON files::

    <folder>/train/*.json, <folder>/test/*.json   (or all_data/*.json, or *.json)
    {"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}

JSON is read with the standard library: no pickle (PFLlib's FEMNIST reads
LEAF's pickled ``images_by_writer.pkl``; the JSON folder is the safe input).
A user's samples from all files (LEAF's train and test) are merged, then split
again by ``--train-ratio`` like every other dataset here.

* FEMNIST: ``x`` is 784 values in [0, 1] (a 28x28 image), ``y`` one of 62 classes
  (digits, upper case, lower case). Stored as 8-bit pixels ``round(255 x)`` and
  normalised like the other images. The default keeps the 100 writers with most
  samples (PFLlib's default); ``--num-clients`` changes it.
* Shakespeare: ``x`` is an 80-character string, ``y`` the next character, both
  looked up in LEAF's 80-letter alphabet (:data:`SHAKESPEARE_LETTERS`, LEAF's
  ``ALL_LETTERS`` in ``models/utils/language_utils.py``). The label is the
  letter's index (0..79, 80 classes as in LEAF and PFLlib). Input ids are the
  index **plus one**: the text models here treat id 0 as padding, and LEAF's
  index 0 is the newline, which would otherwise be ignored as padding (so
  ``vocab_size`` is 81; PFLlib feeds LEAF's indices 0..79 with ``-vs 80``).
  LEAF maps a character outside the alphabet to -1; we map it to the space and
  count such characters in config.json (``unknown_characters``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np

from .errors import ReadError
from .sources import RawDataset

FEMNIST_CLASSES = ([str(d) for d in range(10)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
                   + [chr(c) for c in range(ord("a"), ord("z") + 1)])
SHAKESPEARE_LETTERS = ("\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]"
                       "abcdefghijklmnopqrstuvwxyz}")
#: Shakespeare input id = letter index + SHAKESPEARE_ID_OFFSET; id 0 is padding (no letter).
SHAKESPEARE_ID_OFFSET = 1
LEAF_RAW_HELP = ("LEAF's JSON folder for {name} (train/ and test/ or all_data/ with *.json, "
                 "made by LEAF's preprocess.sh); there is no direct download")


def _json_files(folder: Path) -> list[Path]:
    folder = Path(folder)
    if not folder.is_dir():
        raise ReadError(f"{folder}: no such folder")
    for sub in (["train", "test"], ["all_data"], ["data/train", "data/test"], ["."]):
        files = sorted(f for s in sub for f in (folder / s).glob("*.json")) \
            if all((folder / s).is_dir() for s in sub) else []
        if files:
            return files
    raise ReadError(f"{folder}: no LEAF *.json files (expected train/ and test/ or all_data/)")


def iter_users(folder: Path) -> Iterator[tuple[str, list, list, str]]:
    """``(user, x, y, file)`` for every user block of every JSON file, in file order."""
    for path in _json_files(folder):
        try:
            blob = json.loads(path.read_text())
            users, data = blob["users"], blob["user_data"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ReadError(f"{path}: not a LEAF JSON file ({type(exc).__name__}: {exc})") from None
        for user in users:
            try:
                record = data[user]
                x, y = record["x"], record["y"]
            except (KeyError, TypeError):
                raise ReadError(f"{path}: user {user!r} has no x/y data") from None
            if len(x) != len(y):
                raise ReadError(f"{path}: user {user!r} has {len(x)} inputs and {len(y)} labels")
            yield str(user), x, y, str(path)


def _grouped(records: list[tuple[str, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray,
                                                                             np.ndarray, list[str]]:
    names = sorted({user for user, _, _ in records})
    index = {u: i for i, u in enumerate(names)}
    x = np.concatenate([r[1] for r in records])
    y = np.concatenate([r[2] for r in records])
    groups = np.concatenate([np.full(len(r[2]), index[r[0]], dtype=np.int64) for r in records])
    return x, y, groups, names


def read_femnist(folder: Path) -> RawDataset:
    records = []
    for user, x, y, path in iter_users(folder):
        try:
            pixels = np.asarray(x, dtype=np.float32).reshape(len(y), 1, 28, 28)
            labels = np.asarray(y, dtype=np.int64)
        except ValueError:
            raise ReadError(f"{path}: user {user!r}: inputs are not 784 pixel values") from None
        if len(labels) and (labels.min() < 0 or labels.max() > 61 or pixels.min() < 0
                            or pixels.max() > 1):
            raise ReadError(f"{path}: user {user!r}: labels outside 0..61 or pixels outside [0, 1]")
        records.append((user, np.rint(pixels * 255).astype(np.uint8), labels))
    if not records:
        raise ReadError(f"{folder}: the LEAF files hold no users")
    x, y, groups, names = _grouped(records)
    return RawDataset(x, y, 62, list(FEMNIST_CLASSES), groups=groups, group_names=names)


def load_femnist(raw_dir: Path | None, download_dir: Path) -> RawDataset:
    if raw_dir is None:
        raise ReadError("FEMNIST has no direct download: build LEAF's JSON files (LEAF's "
                        "data/femnist/preprocess.sh) and pass --raw-dir data/femnist/data")
    return read_femnist(raw_dir)


def encode_characters(text: str, unknown: list[int]) -> list[int]:
    """Indices into :data:`SHAKESPEARE_LETTERS`; unknown characters become the space."""
    out = []
    for ch in text:
        i = SHAKESPEARE_LETTERS.find(ch)
        if i < 0:
            unknown[0] += 1
            i = SHAKESPEARE_LETTERS.index(" ")
        out.append(i)
    return out


def read_shakespeare(folder: Path) -> RawDataset:
    records, unknown, length = [], [0], None
    for user, x, y, path in iter_users(folder):
        if not all(isinstance(s, str) for s in x) or not all(isinstance(c, str) and len(c) == 1
                                                              for c in y):
            raise ReadError(f"{path}: user {user!r}: Shakespeare inputs must be strings and "
                            f"labels single characters")
        lengths = {len(s) for s in x}
        if length is None and lengths:
            length = min(lengths)
        if lengths and lengths != {length}:
            raise ReadError(f"{path}: user {user!r}: input strings of different lengths "
                            f"(LEAF's are all {length} characters)")
        xs = np.array([encode_characters(s, unknown) for s in x], dtype=np.int64).reshape(len(x), -1)
        xs += SHAKESPEARE_ID_OFFSET
        ys = np.array([encode_characters(c, unknown)[0] for c in y], dtype=np.int64)
        records.append((user, xs, ys))
    if not records:
        raise ReadError(f"{folder}: the LEAF files hold no users")
    x, y, groups, names = _grouped(records)
    return RawDataset(x, y, len(SHAKESPEARE_LETTERS), [repr(c)[1:-1] for c in SHAKESPEARE_LETTERS],
                      pixel_max=None, groups=groups, group_names=names,
                      extra_config={"vocab_size": len(SHAKESPEARE_LETTERS) + SHAKESPEARE_ID_OFFSET,
                                    "max_len": int(x.shape[1]), "pad_id": 0,
                                    "input_id_offset": SHAKESPEARE_ID_OFFSET,
                                    "id_mapping": "input id = 1 + index in class_names (0 = padding); "
                                                  "label = index in class_names",
                                    "unknown_characters": unknown[0]})


def load_shakespeare(raw_dir: Path | None, download_dir: Path) -> RawDataset:
    if raw_dir is None:
        raise ReadError("Shakespeare has no direct download: build LEAF's JSON files (LEAF's "
                        "data/shakespeare/preprocess.sh) and pass --raw-dir data/shakespeare/data")
    return read_shakespeare(raw_dir)
