"""CIFAR-100 and EMNIST: readers of their raw files and loaders (``--raw-dir`` or download).

* CIFAR-100, python version (``cifar-100-python.tar.gz`` from the authors' site,
  the file torchvision and PFLlib use): the archive's MD5 is checked after the
  download, and each pickle (``train``, ``test``, ``meta``) is unpickled only
  after its MD5 matches the published one, through the array-only unpickler
  (no class or function of the file can be loaded). The binary version
  (``cifar-100-binary``: 2 label bytes, coarse then fine, + 3,072 pixels per
  record) is read without any unpickling. Labels are the 100 fine classes, as
  in torchvision and PFLlib.
* EMNIST (``gzip.zip`` from NIST, published MD5 as in torchvision): IDX files
  ``emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte.gz``, read from
  the zip member by member (nothing extracted) or from a folder. Images are
  kept as the files store them (transposed), exactly as torchvision's EMNIST
  class gives them to PFLlib. The ``letters`` split's labels 1..26 become
  0..25 (torchvision keeps an empty class 0).
"""

from __future__ import annotations

import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Mapping

import numpy as np

from . import download, readers
from .errors import ChecksumError, ReadError
from .sources import RawDataset

CIFAR100_MIRRORS = ("https://www.cs.toronto.edu/~kriz/",)
CIFAR100_FILES = (download.RemoteFile("cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85"),)
CIFAR100_PY_MD5 = {
    "train": "16019d7e3df5f24257cddd939b257f8d",
    "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
    "meta": "7973b15100ade9c7d40fb424638fde48",
}
CIFAR100_RAW_HELP = ("cifar-100-python/ (train, test, meta), cifar-100-binary/ (train.bin, "
                     "test.bin, fine_label_names.txt), a folder holding one, or "
                     "cifar-100-python.tar.gz; skips the download")


def _unpickle_dict(data: bytes, name: str, expected_md5: str | None) -> dict:
    if expected_md5 is not None and readers.md5_bytes(data) != expected_md5:
        raise ChecksumError(f"{name}: MD5 {readers.md5_bytes(data)} differs from the published "
                            f"{expected_md5}; refusing to unpickle it (re-download the file)")
    return readers.unpickle_arrays_dict(data, name)


def parse_cifar100_pickle(data: bytes, name: str,
                          expected_md5: str | None) -> tuple[np.ndarray, np.ndarray]:
    """One python-version split (``train`` or ``test``) as (N,3,32,32) uint8 and fine labels."""
    return readers.cifar_batch_arrays(_unpickle_dict(data, name, expected_md5), name,
                                      "fine_labels", 100)


def parse_cifar100_meta(data: bytes, name: str, expected_md5: str | None) -> list[str]:
    meta = _unpickle_dict(data, name, expected_md5)
    names = meta.get("fine_label_names")
    if not isinstance(names, list) or len(names) != 100:
        raise ReadError(f"{name}: no list of 100 fine_label_names")
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def parse_cifar100_records(data: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Binary-version records: coarse label, fine label, 3,072 pixels."""
    label_bytes, images = readers.split_cifar_records(data, name, 2, "CIFAR-100")
    if label_bytes[:, 1].max() > 99 or label_bytes[:, 0].max() > 19:
        raise ReadError(f"{name}: label bytes outside 0..99 / 0..19 (not CIFAR-100)")
    return images, label_bytes[:, 1]


def _dataset(train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
             names: list[str]) -> RawDataset:
    return RawDataset(np.concatenate([train[0], test[0]]), np.concatenate([train[1], test[1]]),
                      100, names, num_train=len(train[1]))


def read_cifar100_tar(archive: Path, checksums: Mapping[str, str | None] | None = None) -> RawDataset:
    """CIFAR-100 from ``cifar-100-python.tar.gz`` (or the binary tarball), read in memory."""
    table = dict(CIFAR100_PY_MD5 if checksums is None else checksums)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}

            def member(n: str) -> bytes:
                if n not in members:
                    raise ReadError(f"{archive}: no {n} inside (not a CIFAR-100 archive)")
                return tar.extractfile(members[n]).read()
            if "train.bin" in members:
                names = member("fine_label_names.txt").decode().split()
                return _dataset(parse_cifar100_records(member("train.bin"), f"{archive}:train.bin"),
                                parse_cifar100_records(member("test.bin"), f"{archive}:test.bin"),
                                names)
            return _dataset(
                parse_cifar100_pickle(member("train"), f"{archive}:train", table["train"]),
                parse_cifar100_pickle(member("test"), f"{archive}:test", table["test"]),
                parse_cifar100_meta(member("meta"), f"{archive}:meta", table["meta"]))
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise ReadError(f"{archive}: corrupt or truncated archive ({exc})") from None


def read_cifar100(path: Path, checksums: Mapping[str, str | None] | None = None) -> RawDataset:
    """CIFAR-100 from any accepted ``--raw-dir`` form (see :data:`CIFAR100_RAW_HELP`)."""
    path = Path(path)
    if path.is_file():
        return read_cifar100_tar(path, checksums)
    if not path.is_dir():
        raise ReadError(f"{path}: no such file or folder")
    table = dict(CIFAR100_PY_MD5 if checksums is None else checksums)
    for folder in (path, path / "cifar-100-binary", path / "cifar-100-python"):
        if (folder / "train.bin").is_file():
            names_file = folder / "fine_label_names.txt"
            names = names_file.read_text().split() if names_file.is_file() else \
                [str(k) for k in range(100)]
            return _dataset(*(parse_cifar100_records(readers._read_bytes(folder / f"{s}.bin"),
                                                     str(folder / f"{s}.bin"))
                              for s in ("train", "test")), names)
        if (folder / "train").is_file() and (folder / "meta").is_file():
            def read(n: str) -> bytes:
                return readers._read_bytes(folder / n)
            return _dataset(parse_cifar100_pickle(read("train"), str(folder / "train"), table["train"]),
                            parse_cifar100_pickle(read("test"), str(folder / "test"), table["test"]),
                            parse_cifar100_meta(read("meta"), str(folder / "meta"), table["meta"]))
    if (path / CIFAR100_FILES[0].name).is_file():
        return read_cifar100_tar(path / CIFAR100_FILES[0].name, checksums)
    raise ReadError(f"{path}: no CIFAR-100 files (expected {CIFAR100_RAW_HELP.split('; ')[0]})")


def load_cifar100(raw_dir: Path | None, download_dir: Path) -> RawDataset:
    """CIFAR-100 from ``--raw-dir`` or the authors' python tarball (MD5-checked)."""
    if raw_dir is not None:
        return read_cifar100(raw_dir)
    (archive,) = download.download_all(CIFAR100_FILES, download_dir,
                                       download.mirrors_from_env(CIFAR100_MIRRORS),
                                       dataset="Cifar100")
    return read_cifar100_tar(archive)


# EMNIST ------------------------------------------------------------------------------------

# NIST's current address first, then the one torchvision's EMNIST class used before (same file).
EMNIST_MIRRORS = ("https://biometrics.nist.gov/cs_links/EMNIST/",
                  "https://www.itl.nist.gov/iaui/vip/cs_links/EMNIST/")
EMNIST_FILES = (download.RemoteFile("gzip.zip", "58c8d27c78d21e728a6bc7b3cc06412e"),)
_LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
_BYCLASS = [str(d) for d in range(10)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)] + _LETTERS
# balanced/bymerge merge the 15 lowercase letters that look like their capitals.
_MERGED = [str(d) for d in range(10)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)] + \
    list("abdefghnqrt")
EMNIST_SPLITS = {
    "digits": [str(d) for d in range(10)], "mnist": [str(d) for d in range(10)],
    "letters": _LETTERS, "balanced": _MERGED, "bymerge": _MERGED, "byclass": _BYCLASS,
}
EMNIST_RAW_HELP = ("gzip.zip from NIST, or a folder holding it or the files "
                   "emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte(.gz); skips the download")


def _emnist_stems(split: str) -> list[str]:
    return [f"emnist-{split}-{part}-{kind}-ubyte" for part in ("train", "test")
            for kind in ("images-idx3", "labels-idx1")]


def _emnist_arrays(blobs: list[tuple[bytes, str]], split: str) -> RawDataset:
    decoded = [readers.parse_idx(readers._maybe_gunzip(data, name), name=name, ndim=3 - 2 * (i % 2))
               for i, (data, name) in enumerate(blobs)]
    x_train, y_train, x_test, y_test = decoded
    classes = EMNIST_SPLITS[split]
    y = np.concatenate([y_train, y_test]).astype(np.int64)
    if split == "letters":
        y -= 1  # the files number letters 1..26
    if len(x_train) != len(y_train) or len(x_test) != len(y_test):
        raise ReadError(f"EMNIST {split}: image and label counts differ")
    if len(y) and (y.min() < 0 or y.max() >= len(classes)):
        raise ReadError(f"EMNIST {split}: labels outside 0..{len(classes) - 1}")
    x = np.concatenate([x_train, x_test])[:, None, :, :].astype(np.uint8)
    return RawDataset(x, y, len(classes), list(classes), num_train=len(y_train))


def read_emnist_zip(archive: Path, split: str) -> RawDataset:
    """The four IDX files of ``split`` straight from NIST's ``gzip.zip``."""
    try:
        with zipfile.ZipFile(archive) as zf:
            by_name = {Path(n).name: n for n in zf.namelist()}
            blobs = []
            for stem in _emnist_stems(split):
                name = by_name.get(f"{stem}.gz") or by_name.get(stem)
                if name is None:
                    raise ReadError(f"{archive}: no {stem}.gz inside (not EMNIST's gzip.zip)")
                blobs.append((zf.read(name), f"{archive}:{name}"))
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise ReadError(f"{archive}: corrupt or truncated zip ({exc})") from None
    return _emnist_arrays(blobs, split)


def read_emnist(path: Path, split: str) -> RawDataset:
    """EMNIST ``split`` from ``gzip.zip``, a folder holding it, or a folder of IDX files."""
    path = Path(path)
    if path.is_file():
        return read_emnist_zip(path, split)
    if not path.is_dir():
        raise ReadError(f"{path}: no such file or folder")
    for folder in (path, path / "gzip"):
        if all((folder / f"{s}.gz").is_file() or (folder / s).is_file()
               for s in _emnist_stems(split)):
            files = [readers.find_idx_file(folder, s) for s in _emnist_stems(split)]
            return _emnist_arrays([(f.read_bytes(), str(f)) for f in files], split)
    if (path / "gzip.zip").is_file():
        return read_emnist_zip(path / "gzip.zip", split)
    raise ReadError(f"{path}: no EMNIST {split} files (expected {EMNIST_RAW_HELP.split('; ')[0]})")


def emnist_loader(split: str):
    """Loader of EMNIST ``split`` from ``--raw-dir`` or NIST's ``gzip.zip`` (MD5-checked)."""
    def load(raw_dir: Path | None, download_dir: Path) -> RawDataset:
        if raw_dir is not None:
            return read_emnist(raw_dir, split)
        (archive,) = download.download_all(EMNIST_FILES, download_dir,
                                           download.mirrors_from_env(EMNIST_MIRRORS),
                                           dataset="EMNIST")
        return read_emnist_zip(archive, split)
    return load
