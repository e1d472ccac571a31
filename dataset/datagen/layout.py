"""How a generator stores its clients: PFLlib's per-client npz files, or the packed layout.

``npz`` (format ``npz-xy-v1``, PFLlib's shape): ``train/<i>.npz`` and ``test/<i>.npz``, one
compressed archive of the arrays ``x`` and ``y`` per client and split.

``packed`` (format ``packed-npy-v1``), for large populations: per split three plain ``.npy``
files (numpy's own format: a header giving dtype and shape, then the raw array, no pickle), so
a reader maps them into memory (``np.load(f, mmap_mode="r")``) and touches only the rows of
the clients it uses::

    <out>/train/x.npy        [rows, *input_shape]  float32 (int64 for token ids)
    <out>/train/y.npy        [rows]                int64 ([rows, max_labels] for multi-label data)
    <out>/train/offsets.npy  [num_clients + 1]     int64: client c owns rows offsets[c]:offsets[c+1]
    <out>/test/...           the same

Clients are written one after another (:class:`PackedWriter` appends a client's rows to the
files as they come, holding nothing but the current client), so a generator's memory does not
grow with the population. config.json then holds no per-client lists (the offsets are the
sample counts); ``train_rows``/``test_rows`` and ``content_digest`` (BLAKE2 of every array
written, what a resumed run compares) describe the files.

``--layout auto`` (the default) writes ``packed`` above :data:`PACKED_ABOVE` clients.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from pathlib import Path
from typing import Any, Iterator

import numpy as np

NPZ_FORMAT = "npz-xy-v1"
PACKED_FORMAT = "packed-npy-v1"
#: ``--layout auto`` writes the packed layout for more clients than this (PFLlib's measured
#: ceiling is about 500 clients; 1,000 is the largest population run in npz files here)
PACKED_ABOVE = 1000
LAYOUTS = ("auto", "npz", "packed")
FORMATS = {"npz": NPZ_FORMAT, "packed": PACKED_FORMAT}
#: the packed files of each split (``out_dir.py`` accepts them in ``train/`` and ``test/``)
PACKED_FILES = ("x.npy", "y.npy", "offsets.npy")
SPLITS = ("train", "test")
#: bytes of the npy header the packed writer leaves before the rows (rewritten at the end with
#: the row count, so it must fit any count: 64-byte aligned as numpy writes it)
_HEADER_BYTES = 256


def resolve_layout(requested: str, num_clients: int) -> str:
    """``npz`` or ``packed``: ``requested``, or for ``auto`` by the client count."""
    if requested != "auto":
        return requested
    return "packed" if num_clients > PACKED_ABOVE else "npz"


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """An npy format 1.0 header of exactly :data:`_HEADER_BYTES` bytes (numpy pads with spaces)."""
    text = repr({"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
                 "shape": tuple(int(s) for s in shape)})
    body = text.encode("latin1")
    room = _HEADER_BYTES - 10 - 1  # magic (6) + version (2) + length (2); the closing newline
    if len(body) > room:
        raise ValueError(f"npy header of shape {shape} does not fit {_HEADER_BYTES} bytes")
    body = body + b" " * (room - len(body)) + b"\n"
    return b"\x93NUMPY\x01\x00" + (len(body)).to_bytes(2, "little") + body


class _Appender:
    """One ``.npy`` file written row block by row block under a temporary name."""

    def __init__(self, path: Path, dtype: np.dtype, row_shape: tuple[int, ...], digest) -> None:
        self.path, self.dtype, self.row_shape, self.digest = path, np.dtype(dtype), row_shape, digest
        self.tmp = path.with_name(path.name + ".tmp")
        self.handle = open(self.tmp, "wb")
        self.handle.write(npy_header(self.dtype, (0, *row_shape)))
        self.rows = 0

    def add(self, values: np.ndarray) -> None:
        block = np.ascontiguousarray(values, dtype=self.dtype)
        if tuple(block.shape[1:]) != self.row_shape:
            raise ValueError(f"{self.path.name}: rows of shape {list(block.shape[1:])} after "
                             f"{list(self.row_shape)}")
        data = block.view(np.uint8).reshape(-1) if block.size else b""
        self.handle.write(data)
        self.digest.update(data)
        self.rows += len(block)

    def finish(self) -> None:
        self.handle.seek(0)
        self.handle.write(npy_header(self.dtype, (self.rows, *self.row_shape)))
        self.handle.close()
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        self.handle.close()
        self.tmp.unlink(missing_ok=True)


class PackedWriter:
    """Writes clients in order into the packed files of ``out_dir`` (see the module docstring).

    The inputs' dtype (float32, or int64 for integer inputs) and row shape come from the first
    client; :meth:`finish` returns the config.json keys describing the files."""

    layout = "packed"

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.digest = hashlib.blake2b(digest_size=16)
        self.files: dict[str, tuple[_Appender, _Appender]] = {}
        self.offsets = {split: array("q", [0]) for split in SPLITS}

    def _files(self, split: str, x: np.ndarray, y: np.ndarray) -> tuple[_Appender, _Appender]:
        if split not in self.files:
            folder = self.out_dir / split
            folder.mkdir(parents=True, exist_ok=True)
            dtype = np.int64 if np.issubdtype(x.dtype, np.integer) else np.float32
            self.files[split] = (_Appender(folder / "x.npy", dtype, tuple(x.shape[1:]), self.digest),
                                 _Appender(folder / "y.npy", np.int64, tuple(y.shape[1:]), self.digest))
        return self.files[split]

    def add(self, client: int, split: str, x: np.ndarray, y: np.ndarray) -> None:
        """Append client ``client``'s rows of ``split`` (clients come in order, each split once)."""
        if client != len(self.offsets[split]) - 1:
            raise ValueError(f"client {client} written out of order")
        xs, ys = self._files(split, x, y)
        xs.add(x)
        ys.add(y)
        self.offsets[split].append(self.offsets[split][-1] + len(y))

    def finish(self) -> dict[str, Any]:
        """Close the files (header, then rename), write the offsets; the config.json keys."""
        keys: dict[str, Any] = {}
        for split in SPLITS:
            xs, ys = self.files[split]
            xs.finish()
            ys.finish()
            offsets = np.frombuffer(self.offsets[split], dtype=np.int64)
            self.digest.update(offsets.tobytes())
            tmp = self.out_dir / split / "offsets.npy.tmp"
            with open(tmp, "wb") as handle:
                np.save(handle, offsets)
            os.replace(tmp, self.out_dir / split / "offsets.npy")
            keys[f"{split}_rows"] = int(offsets[-1])
        keys["content_digest"] = self.digest.hexdigest()
        return keys

    def discard(self) -> None:
        for files in self.files.values():
            for appender in files:
                appender.discard()

    def sizes(self) -> np.ndarray:
        """Samples per client written so far, both splits together."""
        train, test = (np.diff(np.frombuffer(self.offsets[split], dtype=np.int64)) for split in SPLITS)
        return train + test

    def label_counts(self, num_classes: int, block: int) -> Iterator[np.ndarray]:
        """After :meth:`finish`: the ``[clients, classes]`` label counts of both splits, ``block``
        clients at a time, read back from the written ``y.npy`` files with plain reads (no mapping,
        so the pages read are not the process's resident memory). A multi-label row (``[rows, T]``)
        counts each label it holds; its -1 padding is no label."""
        offsets = {split: np.frombuffer(self.offsets[split], dtype=np.int64) for split in SPLITS}
        shapes = {split: self.files[split][1].row_shape for split in SPLITS}
        clients = len(offsets["train"]) - 1
        handles = {split: open(self.out_dir / split / "y.npy", "rb") for split in SPLITS}
        try:
            for start in range(0, clients, block):
                stop = min(clients, start + block)
                counts = np.zeros((stop - start) * num_classes, dtype=np.int64)
                for split, handle in handles.items():
                    first, last = int(offsets[split][start]), int(offsets[split][stop])
                    width = int(np.prod(shapes[split]))
                    handle.seek(_HEADER_BYTES + 8 * first * width)
                    labels = np.fromfile(handle, dtype=np.int64, count=(last - first) * width)
                    owner = np.repeat(np.arange(stop - start), np.diff(offsets[split][start:stop + 1]) * width)
                    if shapes[split]:
                        owner, labels = owner[labels >= 0], labels[labels >= 0]
                    counts += np.bincount(owner * num_classes + labels, minlength=len(counts))
                yield counts.reshape(stop - start, num_classes)
        finally:
            for handle in handles.values():
                handle.close()


def save_npz(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """One client file, written under a temporary name and renamed."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.savez_compressed(fh, x=x, y=y)
    os.replace(tmp, path)


class NpzWriter:
    """Writes each client's split as ``<split>/<client>.npz`` (PFLlib's layout)."""

    layout = "npz"

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)

    def add(self, client: int, split: str, x: np.ndarray, y: np.ndarray) -> None:
        save_npz(self.out_dir / split / f"{client}.npz", x, y)

    def finish(self) -> dict[str, Any]:
        return {}

    def discard(self) -> None:
        pass


WRITERS = {"npz": NpzWriter, "packed": PackedWriter}


def open_packed(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Split -> (x, y, offsets) of a packed folder, mapped read-only (for the converter; the
    simulator's reader, ``system/fldata/loading.py``, checks every header against config.json)."""
    out = {}
    for split in SPLITS:
        x, y, offsets = (np.load(folder / split / name, mmap_mode="r", allow_pickle=False)
                         for name in PACKED_FILES)
        out[split] = (x, y, offsets)
    return out
