"""Small raw files in the real formats, a local HTTP server, and result readers for the dataset tests."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import json
import pickle
import socket
import struct
import threading
from pathlib import Path

import numpy as np

IDX_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def idx_bytes(array: np.ndarray) -> bytes:
    """Encode an unsigned-byte array as IDX (magic 0x0000 08 <ndim>, big-endian dims)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def make_idx_dataset(folder: Path, n_train: int = 60, n_test: int = 20, *, gz: bool = True,
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Write the four MNIST-layout files; returns all images and labels (train then test)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    images = rng.integers(0, 256, (n_train + n_test, 28, 28), dtype=np.uint8)
    labels = np.arange(n_train + n_test, dtype=np.uint8) % 10
    parts = {IDX_STEMS[0]: images[:n_train], IDX_STEMS[1]: labels[:n_train],
             IDX_STEMS[2]: images[n_train:], IDX_STEMS[3]: labels[n_train:]}
    for stem, array in parts.items():
        data = idx_bytes(array)
        if gz:
            (folder / f"{stem}.gz").write_bytes(gzip.compress(data, mtime=0))
        else:
            (folder / stem).write_bytes(data)
    return images, labels.astype(np.int64)


def md5(path: Path) -> str:
    """Hex MD5 of a file."""
    return hashlib.md5(path.read_bytes()).hexdigest()


CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def make_cifar_bin(folder: Path, per_file: int = 20, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Write cifar-10-batches-bin style files of 3073-byte records."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for i, name in enumerate(CIFAR_FILES):
        x = rng.integers(0, 256, (per_file, 3, 32, 32), dtype=np.uint8)
        y = (np.arange(per_file) + i) % 10
        records = np.concatenate([y.astype(np.uint8)[:, None], x.reshape(per_file, -1)], axis=1)
        (folder / f"{name}.bin").write_bytes(records.tobytes())
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys).astype(np.int64)


def make_cifar_py(folder: Path, per_file: int = 10, seed: int = 0) -> dict[str, str]:
    """Write cifar-10-batches-py style pickles (bytes keys, as the originals); returns their MD5s."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    table = {}
    for name in CIFAR_FILES:
        batch = {b"batch_label": name.encode(), b"labels": rng.integers(0, 10, per_file).tolist(),
                 b"data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8),
                 b"filenames": [f"{i}.png".encode() for i in range(per_file)]}
        path = folder / name
        # Protocol 3 stores bytes directly, like the Python 2 originals (protocol 2 under
        # Python 3 would route bytes through _codecs.encode).
        path.write_bytes(pickle.dumps(batch, protocol=3))
        table[name] = md5(path)
    return table


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self.server.requests.append(self.path)
        super().do_GET()


class LocalServer:
    """A threaded ``http.server`` on 127.0.0.1 serving ``root``; records request paths."""

    def __init__(self, root: Path) -> None:
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.requests = []
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)

    @property
    def requests(self) -> list[str]:
        return self.httpd.requests

    def __enter__(self) -> "LocalServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port_url() -> str:
    """A URL on 127.0.0.1 whose port nothing listens on (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


def load_client(out: Path, part: str, client: int) -> tuple[np.ndarray, np.ndarray]:
    """Read one written client file without pickle support."""
    with np.load(out / part / f"{client}.npz", allow_pickle=False) as f:
        assert sorted(f.files) == ["x", "y"]
        return f["x"], f["y"]


def read_config(out: Path) -> dict:
    """config.json of a written dataset."""
    return json.loads((out / "config.json").read_text())


def all_labels(out: Path) -> np.ndarray:
    """Every label of every client, train and test."""
    config = read_config(out)
    return np.concatenate([load_client(out, part, c)[1] for c in range(config["num_clients"])
                           for part in ("train", "test")])


def tar_folder(folder: Path, archive: Path, arcname: str) -> Path:
    """Pack ``folder`` as ``arcname/`` into a gzip tarball."""
    import tarfile
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=arcname)
    return archive


def make_cifar100_py(folder: Path, n_train: int = 30, n_test: int = 10,
                     seed: int = 0) -> tuple[dict[str, str], np.ndarray, np.ndarray]:
    """cifar-100-python style pickles (bytes keys); returns MD5s, images and fine labels."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    xs, ys, table = [], [], {}
    for name, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        y = (np.arange(n) * 7 + len(ys)) % 100
        batch = {b"filenames": [b"a.png"] * n, b"batch_label": name.encode(),
                 b"fine_labels": y.tolist(), b"coarse_labels": (y // 5).tolist(), b"data": x}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=3))
        xs.append(x.reshape(n, 3, 32, 32))
        ys.append(y)
    meta = {b"fine_label_names": [f"class{k}".encode() for k in range(100)],
            b"coarse_label_names": [f"super{k}".encode() for k in range(20)]}
    (folder / "meta").write_bytes(pickle.dumps(meta, protocol=3))
    for name in ("train", "test", "meta"):
        table[name] = md5(folder / name)
    return table, np.concatenate(xs), np.concatenate(ys).astype(np.int64)


def make_cifar100_bin(folder: Path, n_train: int = 30, n_test: int = 10,
                      seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """cifar-100-binary style files: coarse byte, fine byte, 3,072 pixels per record."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for name, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
        y = (np.arange(n) * 3 + n) % 100
        records = np.concatenate([(y // 5).astype(np.uint8)[:, None], y.astype(np.uint8)[:, None],
                                  x.reshape(n, -1)], axis=1)
        (folder / f"{name}.bin").write_bytes(records.tobytes())
        xs.append(x)
        ys.append(y)
    (folder / "fine_label_names.txt").write_text("\n".join(f"c{k}" for k in range(100)) + "\n")
    return np.concatenate(xs), np.concatenate(ys).astype(np.int64)


def make_emnist_zip(archive: Path, split: str = "digits", n_train: int = 40, n_test: int = 20,
                    num_classes: int = 10, label_offset: int = 0,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """NIST's gzip.zip layout: gzip/emnist-<split>-...-ubyte.gz members."""
    import zipfile
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n_train + n_test, 28, 28), dtype=np.uint8)
    labels = (np.arange(n_train + n_test) % num_classes + label_offset).astype(np.uint8)
    archive.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive, "w") as zf:
        for part, sl in (("train", slice(0, n_train)), ("test", slice(n_train, None))):
            zf.writestr(f"gzip/emnist-{split}-{part}-images-idx3-ubyte.gz",
                        gzip.compress(idx_bytes(images[sl]), mtime=0))
            zf.writestr(f"gzip/emnist-{split}-{part}-labels-idx1-ubyte.gz",
                        gzip.compress(idx_bytes(labels[sl]), mtime=0))
    return images, labels.astype(np.int64) - label_offset
