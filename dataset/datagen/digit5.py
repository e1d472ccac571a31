"""Digit5 (feature shift): MNIST, MNIST-M, SVHN, SynthDigits and USPS, one client per domain.

The files are KD3A's DigitFive folder (the source PFLlib names; Google Drive,
so ``--raw-dir`` only). File names and keys as KD3A's ``datasets/DigitFive.py``
and PFLlib's ``dataset/generate_Digit5.py`` read them::

    mnist_data.mat          train_32 / test_32 (N,32,32) grey, label_train / label_test (one-hot)
    mnistm_with_label.mat   train / test (N,28,28,3), label_train / label_test (one-hot)
    svhn_train_32x32.mat, svhn_test_32x32.mat   X (32,32,3,N), y 1..10 (10 means digit 0)
    synth_train_32x32.mat, synth_test_32x32.mat X (32,32,3,N), y (10 means digit 0)
    usps_28x28.mat          dataset: {{train images, train labels}, {test images, test labels}},
                            images (N,1,28,28) in [0, 1], labels (10 means digit 0)

Dassl's copy of the folder stores SynthDigits as ``syn_number.mat`` instead
(``train_data`` / ``test_data`` (N,32,32,3), ``train_label`` / ``test_label``
0..9); it is read when KD3A's two ``synth_*`` files are absent. Likewise SVHN's
own ``train_32x32.mat`` / ``test_32x32.mat`` (the same files under the names
torchvision's ``svhn.py`` downloads) are read when KD3A's ``svhn_*`` copies are absent.

MAT files are read with ``scipy.io.loadmat``, which decodes data and never runs
code. Every domain becomes 3x32x32 8-bit RGB (grey images repeated over the
channels, 28x28 images resized bilinearly with Pillow), as KD3A and PFLlib feed
their Digit5 CNN. Labels given one-hot become class indices. A domain's
official train and test images are merged and re-split per client by
``--train-ratio``, as for every dataset here; ``--domains`` selects domains.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from .errors import ReadError
from .sources import RawDataset

DIGIT5_DOMAINS = ("mnist", "mnistm", "svhn", "syn", "usps")
DIGIT5_FILES = {
    "mnist": ["mnist_data.mat"], "mnistm": ["mnistm_with_label.mat"],
    "svhn": ["svhn_train_32x32.mat", "svhn_test_32x32.mat"],
    "syn": ["synth_train_32x32.mat", "synth_test_32x32.mat"], "usps": ["usps_28x28.mat"],
}
SYN_DASSL_FILE = "syn_number.mat"  # the same SynthDigits in one file, as Dassl ships them
# SVHN's own names (ufldl.stanford.edu, torchvision's SVHN class) for the files KD3A renamed
SVHN_OFFICIAL_FILES = ["train_32x32.mat", "test_32x32.mat"]
DIGIT5_RAW_HELP = ("KD3A's DigitFive folder: " + ", ".join(f for fs in DIGIT5_FILES.values()
                                                           for f in fs)
                   + f" ({SYN_DASSL_FILE} instead of the synth_* files, and SVHN's own "
                   "train_32x32.mat / test_32x32.mat, are read too; "
                   "Google Drive: no direct download)")
SIZE = 32


def _loadmat(path: Path) -> dict:
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    if not path.is_file():
        raise ReadError(f"{path}: file not found ({DIGIT5_RAW_HELP})")
    try:
        return loadmat(path)
    except (MatReadError, ValueError, TypeError, OSError, NotImplementedError) as exc:
        raise ReadError(f"{path}: not a readable MAT file ({exc})") from None


def _get(mat: dict, path: Path, *keys: str) -> np.ndarray:
    for key in keys:
        if key in mat:
            return np.asarray(mat[key])
    raise ReadError(f"{path}: no {' or '.join(keys)} array inside")


def _labels(raw: np.ndarray, n: int, path: Path) -> np.ndarray:
    raw = np.asarray(raw)
    y = raw.argmax(axis=1) if raw.ndim == 2 and raw.shape[1] == 10 and raw.shape[0] == n \
        else raw.reshape(-1)
    y = y.astype(np.int64)
    if len(y) != n:
        raise ReadError(f"{path}: {n} images but {len(y)} labels")
    return y


def to_rgb32(images: np.ndarray, layout: str, scale: float = 1.0) -> np.ndarray:
    """Images in ``layout`` ('NHW', 'NHWC', 'HWCN', 'NCHW') as (N,3,32,32) uint8."""
    from PIL import Image

    x = np.asarray(images, dtype=np.float64) * scale
    x = {"NHW": lambda a: a[..., None], "NHWC": lambda a: a,
         "HWCN": lambda a: a.transpose(3, 0, 1, 2), "NCHW": lambda a: a.transpose(0, 2, 3, 1)}[layout](x)
    x = np.clip(np.rint(x), 0, 255).astype(np.uint8)
    if x.shape[-1] == 1:
        x = np.repeat(x, 3, axis=-1)
    if x.shape[1:3] != (SIZE, SIZE):
        x = np.stack([np.asarray(Image.fromarray(img).resize((SIZE, SIZE), Image.BILINEAR))
                      for img in x]) if len(x) else np.zeros((0, SIZE, SIZE, 3), np.uint8)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _two_splits(path: Path, image_keys: Callable[[str], tuple[str, ...]], label_key: str,
                layout: str) -> tuple[np.ndarray, np.ndarray]:
    """Train then test images and labels of a MAT file holding both splits."""
    mat = _loadmat(path)
    xs, ys = [], []
    for split in ("train", "test"):
        x = _get(mat, path, *image_keys(split))
        if layout == "NHW" and x.ndim == 4:
            x = x.reshape(x.shape[:3])
        xs.append(to_rgb32(x, layout))
        ys.append(_labels(_get(mat, path, label_key.format(split=split)), len(x), path))
    return np.concatenate(xs), np.concatenate(ys)


def _mnist(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    return _two_splits(folder / "mnist_data.mat", lambda s: (f"{s}_32", f"{s}_28"),
                       "label_{split}", "NHW")


def _mnistm(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    return _two_splits(folder / "mnistm_with_label.mat", lambda s: (s,), "label_{split}", "NHWC")


def _svhn_layout(folder: Path, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """SVHN's MAT layout (one file per split): X (32,32,3,N), y with 10 meaning digit 0."""
    xs, ys = [], []
    for name in names:
        path = folder / name
        mat = _loadmat(path)
        x = _get(mat, path, "X")
        y = _labels(_get(mat, path, "y"), x.shape[-1], path)
        y[y == 10] = 0  # SVHN (and KD3A's SynthDigits) write digit 0 as class 10
        xs.append(to_rgb32(x, "HWCN"))
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def _svhn(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    kd3a = DIGIT5_FILES["svhn"]
    if not all((folder / name).is_file() for name in kd3a) and \
            all((folder / name).is_file() for name in SVHN_OFFICIAL_FILES):
        return _svhn_layout(folder, SVHN_OFFICIAL_FILES)
    return _svhn_layout(folder, kd3a)


def _syn(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    kd3a = DIGIT5_FILES["syn"]
    if not all((folder / name).is_file() for name in kd3a) and (folder / SYN_DASSL_FILE).is_file():
        return _two_splits(folder / SYN_DASSL_FILE, lambda s: (f"{s}_data",), "{split}_label",
                           "NHWC")
    return _svhn_layout(folder, kd3a)


def _usps(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    path = folder / "usps_28x28.mat"
    cells = _get(_loadmat(path), path, "dataset")
    try:
        parts = [(np.asarray(cells[i][0]), np.asarray(cells[i][1])) for i in range(2)]
    except (IndexError, TypeError):
        raise ReadError(f"{path}: 'dataset' is not {{train, test}} x {{images, labels}}") from None
    xs, ys = [], []
    for x, y in parts:
        x = x.reshape(len(x), 1, 28, 28) if x.ndim != 4 else x
        # Pixels in [0, 1] (KD3A multiplies by 255); already 8-bit values are kept.
        xs.append(to_rgb32(x, "NCHW", scale=255.0 if x.max() <= 1.0 else 1.0))
        labels = _labels(y, len(x), path)
        labels[labels == 10] = 0  # as KD3A: a 10 would mean digit 0
        ys.append(labels)
    return np.concatenate(xs), np.concatenate(ys)


READERS: dict[str, Callable[[Path], tuple[np.ndarray, np.ndarray]]] = {
    "mnist": _mnist, "mnistm": _mnistm, "svhn": _svhn, "syn": _syn, "usps": _usps,
}


def read_digit5(folder: Path, domains: tuple[str, ...] = DIGIT5_DOMAINS) -> RawDataset:
    folder = Path(folder)
    if not folder.is_dir():
        raise ReadError(f"{folder}: no such folder")
    if (folder / "DigitFive").is_dir():
        folder = folder / "DigitFive"
    xs, ys, groups = [], [], []
    for g, domain in enumerate(domains):
        x, y = READERS[domain](folder)
        if len(y) and (y.min() < 0 or y.max() > 9):
            raise ReadError(f"{folder}: {domain} labels outside 0..9")
        xs.append(x)
        ys.append(y)
        groups.append(np.full(len(y), g, dtype=np.int64))
    return RawDataset(np.concatenate(xs), np.concatenate(ys), 10, [str(d) for d in range(10)],
                      groups=np.concatenate(groups), group_names=list(domains),
                      group_domains=list(domains))


def digit5_loader(domains: tuple[str, ...]):
    def load(raw_dir: Path | None, download_dir: Path) -> RawDataset:
        if raw_dir is None:
            raise ReadError("Digit5 has no direct download (KD3A's Google Drive folder); put "
                            + ", ".join(f for d in domains for f in DIGIT5_FILES[d])
                            + " in a folder and pass --raw-dir FOLDER")
        return read_digit5(raw_dir, domains)
    return load
