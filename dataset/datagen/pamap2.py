"""PAMAP2 physical activity monitoring: one client per subject (PFLlib's real-world set).

Input: UCI's ``PAMAP2_Dataset.zip`` (no published checksum; checked by format),
a folder holding it, or the extracted ``PAMAP2_Dataset/`` folder, with
``Protocol/subject10N.dat`` (and ``Optional/`` with ``--optional``). Each
``.dat`` row is 54 space-separated values at 100 Hz: timestamp, activity id,
heart rate, then 17 columns for each of the hand, chest and ankle IMUs
(temperature, 3D acceleration +-16g, 3D acceleration +-6g, 3D gyroscope,
3D magnetometer, 4 orientation values).

Windows: the 27 channels of 16g acceleration, gyroscope and magnetometer of
the three IMUs (the PAMAP2 readme calls the 6g accelerometer saturated and
the orientation invalid), ``--window`` steps (default 256, 2.56 s) every
``--step`` steps (default 128), stored as ``(27, 1, window)`` float32 like HAR.
A window is kept when all its rows carry the same one of the 12 protocol
activities and no channel is missing (NaN, dropped IMU packets); activity 0
(transient) and the optional activities are not classes.
"""

from __future__ import annotations

import io
import re
import zipfile
import zlib
from pathlib import Path

import numpy as np

from . import download
from .errors import DatasetError, ReadError
from .sources import RawDataset

PAMAP2_MIRRORS = ("https://archive.ics.uci.edu/ml/machine-learning-databases/00231/",)
PAMAP2_FILES = (download.RemoteFile("PAMAP2_Dataset.zip", None),)
ACTIVITIES = {1: "lying", 2: "sitting", 3: "standing", 4: "walking", 5: "running", 6: "cycling",
              7: "Nordic walking", 12: "ascending stairs", 13: "descending stairs",
              16: "vacuum cleaning", 17: "ironing", 24: "rope jumping"}
COLUMNS = 54
# Per IMU block of 17 starting at 3, 20, 37: skip temperature (0), take acc16 (1-3),
# skip acc6 (4-6), take gyro (7-9) and magnetometer (10-12), skip orientation (13-16).
CHANNELS = [start + off for start in (3, 20, 37) for off in (1, 2, 3, 7, 8, 9, 10, 11, 12)]
PAMAP2_RAW_HELP = ("PAMAP2_Dataset.zip, a folder holding it, or the extracted PAMAP2_Dataset "
                   "folder (Protocol/subject101.dat ...); skips the download")
SUBJECT_FILE = re.compile(r"(Protocol|Optional)/subject(\d+)\.dat$")


def windows(table: np.ndarray, window: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows ``(n, 27, 1, window)`` and activity labels (0..11) of one recording."""
    codes = sorted(ACTIVITIES)
    activity = table[:, 1]
    signals = table[:, CHANNELS].astype(np.float32)
    xs, ys = [], []
    for start in range(0, len(table) - window + 1, step):
        rows = slice(start, start + window)
        act = activity[rows]
        if act[0] not in ACTIVITIES or np.any(act != act[0]):
            continue
        block = signals[rows]
        if np.isnan(block).any():
            continue
        xs.append(block.T[:, None, :])
        ys.append(codes.index(int(act[0])))
    if not xs:
        return np.zeros((0, len(CHANNELS), 1, window), np.float32), np.zeros(0, np.int64)
    return np.stack(xs), np.array(ys, dtype=np.int64)


def parse_dat(data: bytes, name: str) -> np.ndarray:
    try:
        table = np.loadtxt(io.BytesIO(data), dtype=np.float64, ndmin=2)
    except ValueError as exc:
        raise ReadError(f"{name}: not a PAMAP2 table ({exc})") from None
    if table.shape[1] != COLUMNS:
        raise ReadError(f"{name}: {table.shape[1]} columns per row, PAMAP2 has {COLUMNS}")
    return table


def _recordings(path: Path, optional: bool):
    """``(subject, bytes, name)`` of every wanted subject file, sorted by file name."""
    kinds = ("Protocol", "Optional") if optional else ("Protocol",)
    if path.is_dir():
        roots = [path, path / "PAMAP2_Dataset"]
        files = sorted({f for r in roots for k in kinds for f in (r / k).glob("subject*.dat")})
        if files:
            for f in files:
                yield int(SUBJECT_FILE.search(f.as_posix()).group(2)), f.read_bytes(), str(f)
            return
        if (path / PAMAP2_FILES[0].name).is_file():
            path = path / PAMAP2_FILES[0].name
        else:
            raise ReadError(f"{path}: no PAMAP2 files (expected {PAMAP2_RAW_HELP.split('; ')[0]})")
    try:
        with zipfile.ZipFile(path) as zf:
            names = sorted(n for n in zf.namelist()
                           if (m := SUBJECT_FILE.search(n)) and m.group(1) in kinds)
            if not names:
                raise ReadError(f"{path}: no Protocol/subject*.dat inside (not PAMAP2_Dataset.zip)")
            for n in names:
                yield int(SUBJECT_FILE.search(n).group(2)), zf.read(n), f"{path}:{n}"
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise ReadError(f"{path}: corrupt or truncated zip ({exc})") from None


def read_pamap2(path: Path, window: int = 256, step: int = 128,
                optional: bool = False) -> RawDataset:
    path = Path(path)
    if not path.exists():
        raise ReadError(f"{path}: no such file or folder")
    xs, ys, groups, subjects = [], [], [], []
    for subject, data, name in _recordings(path, optional):
        x, y = windows(parse_dat(data, name), window, step)
        if subject not in subjects:
            subjects.append(subject)
        xs.append(x)
        ys.append(y)
        groups.append(np.full(len(y), subjects.index(subject), dtype=np.int64))
    if not any(len(y) for y in ys):
        raise ReadError(f"{path}: no complete {window}-step window of one protocol activity")
    return RawDataset(np.concatenate(xs), np.concatenate(ys), len(ACTIVITIES),
                      [ACTIVITIES[k] for k in sorted(ACTIVITIES)], pixel_max=None,
                      groups=np.concatenate(groups),
                      group_names=[f"subject {s}" for s in subjects])


def pamap2_loader(window: int, step: int, optional: bool):
    if window < 2 or step < 1:
        raise DatasetError(f"--window must be at least 2 and --step at least 1, got {window}, {step}")

    def load(raw_dir: Path | None, download_dir: Path) -> RawDataset:
        if raw_dir is not None:
            return read_pamap2(raw_dir, window, step, optional)
        (archive,) = download.download_all(PAMAP2_FILES, download_dir,
                                           download.mirrors_from_env(PAMAP2_MIRRORS),
                                           dataset="PAMAP2")
        return read_pamap2(archive, window, step, optional)
    return load
