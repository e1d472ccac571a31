"""UCI Human Activity Recognition (HAR): one client per subject (30), PFLlib's real-world set.

Input: ``UCI HAR Dataset.zip`` from UCI (no published checksum; checked by
format), the newer UCI download that wraps it in another zip, a folder holding
either, or the extracted ``UCI HAR Dataset/`` folder. Members are read from the
archive in memory; nothing is extracted.

Each window is the 9 raw inertial signals (body_acc, body_gyro, total_acc;
x, y, z) of 128 time steps, stored as ``(9, 1, 128)`` float32, the layout of
PFLlib's HARCNN. Labels ``y_*.txt`` 1..6 become 0..5; ``subject_*.txt`` gives
each window's subject, the natural client.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

from . import download
from .errors import ReadError
from .sources import RawDataset

HAR_MIRRORS = ("https://archive.ics.uci.edu/ml/machine-learning-databases/00240/",)
HAR_FILES = (download.RemoteFile("UCI HAR Dataset.zip", None),)
HAR_ARCHIVES = ("UCI HAR Dataset.zip", "UCI%20HAR%20Dataset.zip",
                "human+activity+recognition+using+smartphones.zip")
HAR_CLASSES = ["WALKING", "WALKING_UPSTAIRS", "WALKING_DOWNSTAIRS", "SITTING", "STANDING",
               "LAYING"]
SIGNALS = [f"{kind}_{axis}" for kind in ("body_acc", "body_gyro", "total_acc")
           for axis in "xyz"]
WINDOW = 128
HAR_RAW_HELP = ("'UCI HAR Dataset.zip' (or UCI's wrapping zip), a folder holding it, or the "
                "extracted 'UCI HAR Dataset' folder; skips the download")


def _needed(split: str) -> list[str]:
    return ([f"{split}/Inertial Signals/{s}_{split}.txt" for s in SIGNALS]
            + [f"{split}/y_{split}.txt", f"{split}/subject_{split}.txt"])


def _numbers(text: bytes, name: str, dtype: type) -> np.ndarray:
    try:
        return np.array(text.split(), dtype=dtype)
    except ValueError as exc:
        raise ReadError(f"{name}: not a table of numbers ({exc})") from None


def _parse(read: Callable[[str], bytes], origin: str) -> RawDataset:
    xs, ys, groups = [], [], []
    for split in ("train", "test"):
        y = _numbers(read(f"{split}/y_{split}.txt"), f"{origin}:y_{split}.txt", np.int64)
        subject = _numbers(read(f"{split}/subject_{split}.txt"),
                           f"{origin}:subject_{split}.txt", np.int64)
        signals = []
        for s in SIGNALS:
            name = f"{split}/Inertial Signals/{s}_{split}.txt"
            values = _numbers(read(name), f"{origin}:{name}", np.float32)
            if values.size != len(y) * WINDOW:
                raise ReadError(f"{origin}:{name}: {values.size} values, expected "
                                f"{len(y)} windows x {WINDOW} (truncated or corrupt)")
            signals.append(values.reshape(len(y), WINDOW))
        if len(subject) != len(y):
            raise ReadError(f"{origin}: {len(y)} labels but {len(subject)} subjects in {split}")
        if len(y) and (y.min() < 1 or y.max() > 6 or subject.min() < 1 or subject.max() > 30):
            raise ReadError(f"{origin}: {split} labels outside 1..6 or subjects outside 1..30")
        xs.append(np.stack(signals, axis=1)[:, :, None, :])
        ys.append(y - 1)
        groups.append(subject - 1)
    return RawDataset(np.concatenate(xs), np.concatenate(ys), 6, list(HAR_CLASSES),
                      pixel_max=None, num_train=len(ys[0]), groups=np.concatenate(groups),
                      group_names=[f"subject {s}" for s in range(1, 31)])


def read_har_zip(archive: Path | io.BytesIO, origin: str | None = None) -> RawDataset:
    """HAR from UCI's zip (members found by their path below ``UCI HAR Dataset/``)."""
    origin = origin or str(archive)
    try:
        with zipfile.ZipFile(archive) as zf:
            names = zf.namelist()
            inner = [n for n in names if Path(n).name == "UCI HAR Dataset.zip"]
            if inner and not any(n.endswith("y_train.txt") for n in names):
                # UCI's newer download wraps the original zip in another one.
                return read_har_zip(io.BytesIO(zf.read(inner[0])), f"{origin}:{inner[0]}")

            def read(rel: str) -> bytes:
                hits = [n for n in names if n.endswith(rel) and "__MACOSX" not in n]
                if not hits:
                    raise ReadError(f"{origin}: no {rel} inside (not UCI HAR Dataset.zip)")
                return zf.read(hits[0])
            return _parse(read, origin)
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise ReadError(f"{origin}: corrupt or truncated zip ({exc})") from None


def read_har(path: Path) -> RawDataset:
    """HAR from any accepted ``--raw-dir`` form (see :data:`HAR_RAW_HELP`)."""
    path = Path(path)
    if path.is_file():
        return read_har_zip(path)
    if not path.is_dir():
        raise ReadError(f"{path}: no such file or folder")
    for folder in (path, path / "UCI HAR Dataset"):
        if (folder / "train" / "y_train.txt").is_file():
            def read(rel: str, folder: Path = folder) -> bytes:
                try:
                    return (folder / rel).read_bytes()
                except OSError:
                    raise ReadError(f"{folder / rel}: file not found") from None
            return _parse(read, str(folder))
    for name in HAR_ARCHIVES:
        if (path / name).is_file():
            return read_har_zip(path / name)
    raise ReadError(f"{path}: no HAR files (expected {HAR_RAW_HELP.split('; ')[0]})")


def load_har(raw_dir: Path | None, download_dir: Path) -> RawDataset:
    """HAR from ``--raw-dir`` or UCI (no published checksum: the zip is checked by format)."""
    if raw_dir is not None:
        return read_har(raw_dir)
    (archive,) = download.download_all(HAR_FILES, download_dir,
                                       download.mirrors_from_env(HAR_MIRRORS), dataset="HAR")
    return read_har_zip(archive)
