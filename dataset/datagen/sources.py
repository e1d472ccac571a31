"""Where each dataset's raw samples come from: ``--raw-dir`` or the official mirrors.

A loader returns a :class:`RawDataset` with the training and test sets already
concatenated (PFLlib merges them before partitioning). Images stay ``uint8`` here
and are normalised client by client when written, which keeps memory low.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from . import download, readers
from .errors import ReadError

IDX_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

MNIST_CLASSES = [str(d) for d in range(10)]
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                         "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


@dataclass
class RawDataset:
    """All samples of a dataset, training set first, then test set.

    ``pixel_max`` is the full-scale pixel value for images (255, or 16 for the
    8x8 digits); ``None`` means ``x`` already holds float features.
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    class_names: list[str]
    pixel_max: float | None = 255.0
    num_train: int | None = None
    """Samples ``[0, num_train)`` are the official training set (None: no official split)."""
    groups: np.ndarray | None = None
    """Natural client of each sample (writer, subject, domain...), or None."""
    group_names: list[str] | None = None
    """Name of each natural client (index = group id)."""
    group_domains: list[str] | None = None
    """Domain of each natural client for feature-shift datasets (Digit5, DomainNet)."""
    extra_config: dict | None = None
    """Dataset-specific facts stored in config.json (vocabulary size, split, ...)."""
    extra_files: dict | None = None
    """Text files written next to config.json (name -> content), e.g. a tokenizer's JSON."""

    @property
    def is_image(self) -> bool:
        return self.pixel_max is not None and self.x.ndim == 4

    def features(self, idx: np.ndarray) -> np.ndarray:
        """Samples ``idx``: images as float32 normalised like PFLlib to [-1, 1], token ids
        (integer arrays without ``pixel_max``) unchanged, other features as float32."""
        x = self.x[idx]
        if self.pixel_max is None:
            if np.issubdtype(x.dtype, np.integer):
                return x.astype(np.int64, copy=False)
            return x.astype(np.float32, copy=False)
        # ToTensor (divide by full scale) then Normalize(mean=0.5, std=0.5).
        return (x.astype(np.float32) / np.float32(self.pixel_max) - np.float32(0.5)) / np.float32(0.5)


Loader = Callable[[Path | None, Path], RawDataset]


def idx_loader(name: str, files: Sequence[download.RemoteFile], mirrors: Sequence[str],
               class_names: list[str]) -> Loader:
    """Loader of an MNIST-layout dataset: four IDX files from ``--raw-dir`` or the mirrors."""
    def load(raw_dir: Path | None, download_dir: Path) -> RawDataset:
        if raw_dir is None:
            download.download_all(files, download_dir, download.mirrors_from_env(mirrors),
                                  dataset=name)
            folder = download_dir
        else:
            folder = Path(raw_dir)
            if not folder.is_dir():
                raise ReadError(f"--raw-dir {folder}: no such folder")
        # --raw-dir files are checked by format, not checksum: rebuilt or repacked
        # copies (Debian's, the shared MNIST) differ from the published digests.
        paths = [readers.find_idx_file(folder, stem) for stem in IDX_STEMS]
        x_train, y_train = readers.read_idx_pair(paths[0], paths[1], len(class_names))
        x_test, y_test = readers.read_idx_pair(paths[2], paths[3], len(class_names))
        x = np.concatenate([x_train, x_test])[:, None, :, :]
        return RawDataset(x, np.concatenate([y_train, y_test]), len(class_names), class_names,
                          num_train=len(y_train))
    return load


load_mnist = idx_loader("MNIST", download.MNIST_FILES, download.MNIST_MIRRORS, MNIST_CLASSES)
load_fashion_mnist = idx_loader("FashionMNIST", download.FASHION_MNIST_FILES,
                                download.FASHION_MNIST_MIRRORS, FASHION_MNIST_CLASSES)


def load_cifar10(raw_dir: Path | None, download_dir: Path) -> RawDataset:
    """CIFAR-10 from ``--raw-dir`` (binary or verified python version) or the Toronto tarball."""
    if raw_dir is None:
        (archive,) = download.download_all(download.CIFAR10_FILES, download_dir,
                                           download.mirrors_from_env(download.CIFAR10_MIRRORS),
                                           dataset="Cifar10")
        x, y = readers.read_cifar10_tar(archive)
    else:
        x, y = readers.read_cifar10(raw_dir)
    # Both readers return the five training batches (50,000 images) before the test batch.
    return RawDataset(x, y, 10, list(readers.CIFAR10_CLASSES), num_train=len(y) * 5 // 6)


def load_digits(raw_dir: Path | None, download_dir: Path) -> RawDataset:
    """scikit-learn's bundled 8x8 digits (1,797 samples, pixel values 0..16); no download."""
    from sklearn.datasets import load_digits as sk_load_digits

    if raw_dir is not None:
        raise ReadError("Digits ships with scikit-learn; --raw-dir is not used")
    bunch = sk_load_digits()
    x = bunch.images.astype(np.uint8)[:, None, :, :]
    return RawDataset(x, bunch.target.astype(np.int64), 10, MNIST_CLASSES, pixel_max=16.0)
