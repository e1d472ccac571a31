"""Image datasets stored as files in folders or archives (kvasir, TinyImagenet, Country211,
Flowers102, GTSRB, COVIDx, Omniglot).

Archives are read member by member: zip members on demand, tarballs as a
stream (``r|*``), so a multi-gigabyte archive is never read whole into memory
and nothing is extracted (member paths are never used as file names). Every
image is decoded with Pillow, converted to RGB (or greyscale) and resized to
``--image-size`` (bilinear); the result is 8-bit ``(C, S, S)`` arrays, normalised
like the other images when written. Samples are sorted by path, so the order
of an archive does not change the dataset.
"""

from __future__ import annotations

import io
import tarfile
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

import numpy as np

from .errors import DatasetError, ReadError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".gif", ".tif", ".tiff")
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tgz", ".tar.gz", ".tar.bz2", ".tar.xz")


def is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def is_archive(path: Path) -> bool:
    return path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES)


def iter_files(path: Path, wanted: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """``(posix path, bytes)`` of every regular file ``wanted`` accepts, in a folder or archive.

    Paths are relative to the folder (or the archive root), with ``/`` separators.
    """
    path = Path(path)
    if path.is_dir():
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            rel = file.relative_to(path).as_posix()
            if wanted(rel):
                yield rel, file.read_bytes()
        return
    if not path.is_file():
        raise ReadError(f"{path}: no such file or folder")
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    if not info.is_dir() and wanted(info.filename):
                        yield info.filename, zf.read(info)
            return
        with tarfile.open(path, "r|*") as tar:  # streamed: one member at a time
            for member in tar:
                if member.isfile() and wanted(member.name):
                    yield member.name, tar.extractfile(member).read()
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise ReadError(f"{path}: corrupt or truncated archive ({exc})") from None


def decode_image(data: bytes, name: str, size: int, grey: bool = False) -> np.ndarray:
    """Decode, convert and resize one image to ``(C, size, size)`` uint8."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            img = img.convert("L" if grey else "RGB")
            if img.size != (size, size):
                img = img.resize((size, size), Image.BILINEAR)
            pixels = np.asarray(img, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ReadError(f"{name}: not a readable image ({exc})") from None
    return pixels[None] if grey else pixels.transpose(2, 0, 1)


@dataclass
class Collected:
    """Decoded samples: their sort keys, images, class names and optional group names."""

    keys: list[tuple] = field(default_factory=list)
    images: list[np.ndarray] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)

    def add(self, key: tuple, image: np.ndarray, label: str, group: str = "") -> None:
        self.keys.append(key)
        self.images.append(image)
        self.labels.append(label)
        self.groups.append(group)

    def arrays(self, classes: list[str], origin: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Images and labels sorted by key; also the permutation applied."""
        if not self.images:
            raise ReadError(f"{origin}: no images found")
        order = sorted(range(len(self.keys)), key=self.keys.__getitem__)
        index = {c: i for i, c in enumerate(classes)}
        unknown = sorted(set(self.labels) - set(index))
        if unknown:
            raise ReadError(f"{origin}: unexpected classes {unknown[:5]}")
        x = np.stack([self.images[i] for i in order])
        y = np.array([index[self.labels[i]] for i in order], dtype=np.int64)
        return x, y, order


def parts_of(name: str) -> tuple[str, ...]:
    return PurePosixPath(name).parts


def add_image_size_argument(parser, default: int) -> None:
    """The ``--image-size`` flag of the datasets whose images are resized."""
    parser.add_argument("--image-size", type=int, default=default,
                        help=f"images are resized to SIZE x SIZE (default {default})")


def check_image_size(size: int) -> int:
    if not 4 <= size <= 512:
        raise DatasetError(f"--image-size must be between 4 and 512, got {size}")
    return size
