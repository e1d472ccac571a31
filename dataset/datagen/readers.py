"""Readers for raw dataset files, written without torchvision.

* IDX (MNIST, Fashion-MNIST), gzip-compressed or plain: the magic number, the
  number of dimensions and the payload size are checked.
* CIFAR-10 binary version (``cifar-10-batches-bin``): fixed 3073-byte records
  (label byte + 3x32x32 pixels), read without unpickling.
* CIFAR-10 python version (``cifar-10-batches-py``): pickles, opened only after
  every file's MD5 matches the published value; unpickling then goes through an
  allow-list that admits nothing but numpy array reconstruction.

Any file that is missing, truncated or malformed raises :class:`ReadError` with a
one-line message naming the file.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import tarfile
import zlib
from pathlib import Path
from typing import Mapping

import numpy as np

from .errors import ChecksumError, ReadError

GZIP_MAGIC = b"\x1f\x8b"

# IDX type codes (third magic byte) and their big-endian numpy dtypes.
IDX_DTYPES = {
    0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8"),
}

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer",
                   "dog", "frog", "horse", "ship", "truck"]
CIFAR10_TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
CIFAR10_TEST_FILE = "test_batch"

# Published MD5 digests of the python-version files (CIFAR page / torchvision).
CIFAR10_PY_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}


def _read_bytes(path: Path) -> bytes:
    """Whole file, gunzipped when it starts with the gzip magic."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ReadError(f"{path}: file not found") from None
    except OSError as exc:
        raise ReadError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return _maybe_gunzip(raw, str(path))


def _maybe_gunzip(raw: bytes, name: str) -> bytes:
    """``raw`` gunzipped when it starts with the gzip magic, else unchanged."""
    if raw[:2] != GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as exc:
        raise ReadError(f"{name}: corrupt or truncated gzip data ({exc})") from None


def parse_idx(data: bytes, *, name: str = "IDX data", ndim: int | None = None) -> np.ndarray:
    """Decode an IDX byte string into an array, checking magic, rank and size."""
    if len(data) < 4:
        raise ReadError(f"{name}: too short for an IDX header ({len(data)} bytes)")
    zero, code, rank = data[:2], data[2], data[3]
    if zero != b"\x00\x00" or code not in IDX_DTYPES:
        raise ReadError(f"{name}: not an IDX file (magic {data[:4].hex()})")
    if ndim is not None and rank != ndim:
        raise ReadError(f"{name}: expected {ndim} dimensions, the header says {rank}")
    header = 4 + 4 * rank
    if len(data) < header:
        raise ReadError(f"{name}: truncated IDX header")
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=rank, offset=4))
    dtype = IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) - header != expected:
        raise ReadError(f"{name}: header {shape} needs {expected} data bytes, "
                        f"file has {len(data) - header} (truncated or corrupt)")
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def read_idx(path: str | Path, ndim: int | None = None) -> np.ndarray:
    """Read an IDX file (gzip or plain)."""
    return parse_idx(_read_bytes(Path(path)), name=str(path), ndim=ndim)


def read_idx_pair(images: str | Path, labels: str | Path,
                  num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Read matching IDX image (N,H,W uint8) and label (N) files; labels become int64."""
    x = read_idx(images, ndim=3)
    y = read_idx(labels, ndim=1)
    if x.dtype != np.uint8 or y.dtype != np.uint8:
        raise ReadError(f"{images}: expected unsigned-byte IDX files, got {x.dtype}/{y.dtype}")
    if len(x) != len(y):
        raise ReadError(f"{images} has {len(x)} images but {labels} has {len(y)} labels")
    if len(y) and y.max() >= num_classes:
        raise ReadError(f"{labels}: label {int(y.max())} outside 0..{num_classes - 1}")
    return x, y.astype(np.int64)


def find_idx_file(folder: Path, stem: str) -> Path:
    """Locate ``stem`` in ``folder`` as ``.gz`` or plain, also in the dotted spelling.

    ``train-images-idx3-ubyte`` is also found as ``train-images.idx3-ubyte``, the name
    some unpackers give the decompressed file.
    """
    dotted = stem.replace("-idx", ".idx")
    for name in (f"{stem}.gz", stem, f"{dotted}.gz", dotted):
        if (folder / name).is_file():
            return folder / name
    raise ReadError(f"{folder}: no {stem}.gz or {stem} found")


def split_cifar_records(data: bytes, name: str, label_bytes: int,
                        what: str) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-size CIFAR binary records: (label bytes [N, label_bytes] int64, images (N,3,32,32))."""
    size = label_bytes + 3 * 32 * 32
    if not data or len(data) % size:
        raise ReadError(f"{name}: {len(data)} bytes is not a whole number of "
                        f"{size}-byte {what} records (truncated or corrupt)")
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, size)
    return records[:, :label_bytes].astype(np.int64), records[:, label_bytes:].reshape(-1, 3, 32, 32).copy()


def parse_cifar10_records(data: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Decode CIFAR-10 binary records into (N,3,32,32) uint8 images and int64 labels."""
    label_bytes, images = split_cifar_records(data, name, 1, "CIFAR-10")
    labels = label_bytes[:, 0]
    if labels.max() >= len(CIFAR10_CLASSES):
        raise ReadError(f"{name}: label byte {int(labels.max())} outside 0..9 (not CIFAR-10)")
    return images, labels


def read_cifar10_bin(folder: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read ``cifar-10-batches-bin``: data_batch_1..5.bin then test_batch.bin."""
    folder = Path(folder)
    parts = [parse_cifar10_records(_read_bytes(folder / f"{n}.bin"), str(folder / f"{n}.bin"))
             for n in CIFAR10_TRAIN_FILES + [CIFAR10_TEST_FILE]]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


class _ArrayOnlyUnpickler(pickle.Unpickler):
    """Unpickler that can rebuild numpy arrays and nothing else."""

    def find_class(self, module: str, name: str):  # noqa: ANN201 - pickle protocol
        allowed = {("numpy", "ndarray"), ("numpy", "dtype"),
                   ("numpy.core.multiarray", "_reconstruct"),
                   ("numpy._core.multiarray", "_reconstruct")}
        if (module, name) not in allowed:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        if name == "_reconstruct":
            from numpy._core.multiarray import _reconstruct
            return _reconstruct
        return getattr(np, name)


def unpickle_arrays_dict(data: bytes, name: str) -> dict:
    """A pickled dict of arrays, lists and strings, loaded with :class:`_ArrayOnlyUnpickler`.

    Keys come back as ``str`` (the CIFAR files were pickled by Python 2, so as bytes).
    """
    try:
        obj = _ArrayOnlyUnpickler(io.BytesIO(data), encoding="bytes").load()
    except Exception as exc:  # any unpickling failure means a bad file
        raise ReadError(f"{name}: cannot decode ({exc})") from None
    if not isinstance(obj, dict):
        raise ReadError(f"{name}: expected a dict, found {type(obj).__name__}")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}


def md5_bytes(data: bytes) -> str:
    """Hex MD5 digest of ``data``."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def parse_cifar10_pickle(data: bytes, name: str, expected_md5: str) -> tuple[np.ndarray, np.ndarray]:
    """Verify one python-version batch against its MD5, then decode it."""
    digest = md5_bytes(data)
    if digest != expected_md5:
        raise ChecksumError(f"{name}: MD5 {digest} differs from the published {expected_md5}; "
                            f"refusing to unpickle it (re-download the file)")
    return cifar_batch_arrays(unpickle_arrays_dict(data, name), name, "labels", 10)


def cifar_batch_arrays(batch: dict, name: str, label_key: str,
                       num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(N,3,32,32) uint8 images and int64 labels of an unpickled CIFAR-10/100 batch."""
    try:
        x = np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        y = np.asarray(batch[label_key], dtype=np.int64)
    except (KeyError, ValueError) as exc:
        raise ReadError(f"{name}: not a CIFAR-{num_classes} batch ({exc})") from None
    if len(x) != len(y) or (len(y) and (y.min() < 0 or y.max() >= num_classes)):
        raise ReadError(f"{name}: {len(x)} images, {len(y)} labels or labels outside "
                        f"0..{num_classes - 1}")
    return x, y


def read_cifar10_py(folder: str | Path,
                    checksums: Mapping[str, str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read ``cifar-10-batches-py`` after checking each file's MD5 (``checksums`` overrides)."""
    folder = Path(folder)
    table = dict(CIFAR10_PY_MD5 if checksums is None else checksums)
    parts = []
    for n in CIFAR10_TRAIN_FILES + [CIFAR10_TEST_FILE]:
        path = folder / n
        if not path.is_file():
            raise ReadError(f"{path}: file not found")
        parts.append(parse_cifar10_pickle(path.read_bytes(), str(path), table[n]))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def read_cifar10_tar(archive: str | Path,
                     checksums: Mapping[str, str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read CIFAR-10 straight from ``cifar-10-binary.tar.gz`` or ``cifar-10-python.tar.gz``.

    Members are read in memory by base name, so nothing is extracted to disk and
    paths inside the archive are never trusted.
    """
    archive = Path(archive)
    table = dict(CIFAR10_PY_MD5 if checksums is None else checksums)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
            binary = f"{CIFAR10_TRAIN_FILES[0]}.bin" in members
            parts = []
            for n in CIFAR10_TRAIN_FILES + [CIFAR10_TEST_FILE]:
                member = f"{n}.bin" if binary else n
                if member not in members:
                    raise ReadError(f"{archive}: no {member} inside (not a CIFAR-10 archive)")
                data = tar.extractfile(members[member]).read()
                label = f"{archive}:{member}"
                parts.append(parse_cifar10_records(data, label) if binary
                             else parse_cifar10_pickle(data, label, table[n]))
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise ReadError(f"{archive}: corrupt or truncated archive ({exc})") from None
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def read_cifar10(path: str | Path,
                 checksums: Mapping[str, str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read CIFAR-10 from any accepted ``--raw-dir`` form.

    ``path`` may be a ``cifar-10-batches-bin`` or ``cifar-10-batches-py`` folder, a
    folder holding one of them (binary preferred), a ``.tar.gz`` of either, or a
    folder holding such an archive.
    """
    path = Path(path)
    if path.is_file():
        return read_cifar10_tar(path, checksums)
    if not path.is_dir():
        raise ReadError(f"{path}: no such file or folder")
    candidates = [path, path / "cifar-10-batches-bin", path / "cifar-10-batches-py"]
    for folder in candidates:
        if (folder / "data_batch_1.bin").is_file():
            return read_cifar10_bin(folder)
        if (folder / "data_batch_1").is_file():
            return read_cifar10_py(folder, checksums)
    for name in ("cifar-10-binary.tar.gz", "cifar-10-python.tar.gz"):
        if (path / name).is_file():
            return read_cifar10_tar(path / name, checksums)
    raise ReadError(f"{path}: no CIFAR-10 files (expected cifar-10-batches-bin/, "
                    f"cifar-10-batches-py/ or cifar-10-binary.tar.gz)")
