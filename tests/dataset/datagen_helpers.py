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
    archive.parent.mkdir(parents=True, exist_ok=True)
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


HAR_SIGNALS = [f"{kind}_{axis}" for kind in ("body_acc", "body_gyro", "total_acc") for axis in "xyz"]


def make_har_zip(archive: Path, n_train: int = 24, n_test: int = 12, seed: int = 0,
                 wrap: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """UCI HAR's zip layout ('UCI HAR Dataset/<split>/Inertial Signals/*.txt', y_*, subject_*).

    Returns windows [N, 9, 1, 128], labels 0..5 and subjects 1..30 (train then test).
    Training windows come from subjects 1-4, test windows from 5-6, as UCI splits by subject.
    """
    import io
    import zipfile
    rng = np.random.default_rng(seed)
    xs, ys, subjects = [], [], []
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for split, n, people in (("train", n_train, [1, 2, 3, 4]), ("test", n_test, [5, 6])):
            # Multiples of 1/1024 print exactly in decimal, so parsing gives these floats back.
            x = (rng.integers(-4096, 4096, (n, 9, 128)) / 1024).astype(np.float32)
            y = np.arange(n) % 6 + 1
            s = np.array(people)[np.arange(n) % len(people)]
            root = f"UCI HAR Dataset/{split}"
            for i, name in enumerate(HAR_SIGNALS):
                text = "\n".join("  " + " ".join(f"{v:.10e}" for v in row) for row in x[:, i])
                zf.writestr(f"{root}/Inertial Signals/{name}_{split}.txt", text + "\n")
            zf.writestr(f"{root}/y_{split}.txt", "\n".join(map(str, y)) + "\n")
            zf.writestr(f"{root}/subject_{split}.txt", "\n".join(map(str, s)) + "\n")
            xs.append(x[:, :, None, :])
            ys.append(y - 1)
            subjects.append(s)
        zf.writestr("UCI HAR Dataset/activity_labels.txt", "1 WALKING\n")
    archive.parent.mkdir(parents=True, exist_ok=True)
    if wrap:
        with zipfile.ZipFile(archive, "w") as outer:
            outer.writestr("UCI HAR Dataset.zip", buffer.getvalue())
    else:
        archive.write_bytes(buffer.getvalue())
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(subjects)


def write_leaf_json(folder: Path, users: dict[str, tuple[list, list]], parts: int = 2) -> None:
    """LEAF's layout: train/ and test/ JSON files; each user's samples split between them."""
    for sub in ("train", "test"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    names = sorted(users)
    for sub, pick in (("train", slice(None, None, 2)), ("test", slice(1, None, 2))):
        for chunk in range(parts):
            mine = names[chunk::parts]
            blob = {"users": mine, "num_samples": [len(users[u][1][pick]) for u in mine],
                    "user_data": {u: {"x": users[u][0][pick], "y": users[u][1][pick]}
                                  for u in mine}}
            (folder / sub / f"all_data_{chunk}_niid_0_keep_0_{sub}_9.json").write_text(json.dumps(blob))


def make_femnist_users(num_users: int = 5, seed: int = 0) -> dict[str, tuple[list, list]]:
    """Writers with 4..(3 + num_users) images each; pixels in [0, 1] on a 1/255 grid."""
    rng = np.random.default_rng(seed)
    users = {}
    for u in range(num_users):
        n = 4 + u
        x = (rng.integers(0, 256, (n, 784)) / 255.0).round(6).tolist()
        y = rng.integers(0, 62, n).tolist()
        users[f"f{u:04d}_{u}"] = (x, y)
    return users


def make_ag_news_csv(folder: Path, n_train: int = 40, n_test: int = 12,
                     num_classes: int = 4) -> tuple[list[str], np.ndarray]:
    """train.csv and test.csv rows '"class","title","description"' (classes from 1)."""
    import csv
    folder.mkdir(parents=True, exist_ok=True)
    words = {0: "election minister war", 1: "match goal team", 2: "stocks profit market",
             3: "software chip internet", 4: "car engine road"}
    texts, labels = [], []
    for name, n in (("train.csv", n_train), ("test.csv", n_test)):
        with open(folder / name, "w", newline="") as fh:
            writer = csv.writer(fh, quoting=csv.QUOTE_ALL)
            for i in range(n):
                k = i % num_classes
                title, body = f"Headline {i}", f"The {words[k]} story, number {i}."
                writer.writerow([k + 1, title, body])
                texts.append(f"{title} {body}")
                labels.append(k)
    return texts, np.array(labels)


def make_digit5(folder: Path, n: int = 6, seed: int = 0,
                syn_layout: str = "kd3a") -> dict[str, np.ndarray]:
    """KD3A's DigitFive MAT files with ``n`` train and ``n`` test images per domain.

    ``syn_layout`` "kd3a" writes SynthDigits as KD3A / PFLlib read it
    (``synth_{train,test}_32x32.mat``, SVHN's layout, digit 0 as 10), "dassl" as
    Dassl's ``syn_number.mat``. USPS labels write digit 0 as 10, as KD3A expects.
    Returns each domain's labels (train then test) as the generator should read them.
    """
    from scipy.io import savemat
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    labels = {}

    def digits():
        return rng.integers(0, 10, n)

    def onehot(y):
        return np.eye(10, dtype=np.uint8)[y]
    a, b = digits(), digits()
    savemat(folder / "mnist_data.mat", {
        "train_32": rng.integers(0, 256, (n, 32, 32), dtype=np.uint8), "label_train": onehot(a),
        "test_32": rng.integers(0, 256, (n, 32, 32), dtype=np.uint8), "label_test": onehot(b)})
    labels["mnist"] = np.concatenate([a, b])
    a, b = digits(), digits()
    savemat(folder / "mnistm_with_label.mat", {
        "train": rng.integers(0, 256, (n, 28, 28, 3), dtype=np.uint8), "label_train": onehot(a),
        "test": rng.integers(0, 256, (n, 28, 28, 3), dtype=np.uint8), "label_test": onehot(b)})
    labels["mnistm"] = np.concatenate([a, b])
    svhn = []
    for name in ("svhn_train_32x32.mat", "svhn_test_32x32.mat"):
        y = digits()
        savemat(folder / name, {"X": rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8),
                                "y": np.where(y == 0, 10, y)[:, None].astype(np.uint8)})
        svhn.append(y)
    labels["svhn"] = np.concatenate(svhn)
    a, b = digits(), digits()
    if syn_layout == "kd3a":
        for name, y in (("synth_train_32x32.mat", a), ("synth_test_32x32.mat", b)):
            savemat(folder / name, {"X": rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8),
                                    "y": np.where(y == 0, 10, y)[:, None].astype(np.uint8)})
    else:
        savemat(folder / "syn_number.mat", {
            "train_data": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
            "train_label": a[:, None],
            "test_data": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
            "test_label": b[:, None]})
    labels["syn"] = np.concatenate([a, b])
    a, b = digits(), digits()
    cells = np.empty((2, 2), dtype=object)
    cells[0, 0] = rng.random((n, 1, 28, 28)).astype(np.float32)
    cells[0, 1] = np.where(a == 0, 10, a)[:, None]
    cells[1, 0] = rng.random((n, 1, 28, 28)).astype(np.float32)
    cells[1, 1] = np.where(b == 0, 10, b)[:, None]
    savemat(folder / "usps_28x28.mat", {"dataset": cells})
    labels["usps"] = np.concatenate([a, b])
    return labels


def image_bytes(value: int, size: tuple[int, int] = (12, 10), fmt: str = "PNG",
                grey: bool = False) -> bytes:
    """A flat image of one colour (value, 255 - value, value // 2) in format ``fmt``."""
    import io as _io
    from PIL import Image
    mode, colour = ("L", value) if grey else ("RGB", (value, 255 - value, value // 2))
    buffer = _io.BytesIO()
    Image.new(mode, size, colour).save(buffer, format=fmt)
    return buffer.getvalue()


def write_zip(archive: Path, members: dict[str, bytes]) -> Path:
    import zipfile
    archive.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return archive


def write_tgz(archive: Path, members: dict[str, bytes]) -> Path:
    import io as _io
    import tarfile
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, _io.BytesIO(data))
    return archive


def write_tree(folder: Path, members: dict[str, bytes]) -> Path:
    for name, data in members.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def trains_one_round(folder, results, *flags: str) -> None:
    """One round of ``system/main.py`` with a tiny LSTM on the generated ``folder`` writes one result
    file with finite accuracies (a text dataset's end-to-end check)."""
    import h5py
    import numpy as np

    import main as fl_main

    code = fl_main.main(["-dev", "cpu", "--progress", "False", "-q", "-data", str(folder), "-m", "LSTM", "-fd", "8",
                         "-gr", "1", *flags, "--results_dir", str(results)])
    assert code == 0
    found = sorted(results.glob("*.h5"))
    assert len(found) == 1
    with h5py.File(found[0]) as f:
        assert np.isfinite(f["rs_test_acc"][()]).all()
