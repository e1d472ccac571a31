"""Reader for PFLlib's own npz files, which hold a pickled ``{'x', 'y'}`` dict.

Loading them needs ``allow_pickle=True``, and unpickling can execute code stored
in the file. Only ``convert_pfllib.py --trust-pickle`` calls this; everything
else reads the pickle-free ``npz-xy-v1`` format.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import numpy as np

from .errors import ReadError


def load_pfllib_npz(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(x, y)`` from a PFLlib ``<client>.npz``. Unpickles: trusted files only."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except FileNotFoundError:
        raise ReadError(f"{path}: file not found") from None
    except OSError as exc:
        raise ReadError(f"{path}: cannot read ({exc.strerror or exc})") from None
    # np.load with allow_pickle=True would also unpickle a bare pickle file; accept only
    # npz (zip) archives, the one thing PFLlib writes.
    if magic != b"PK\x03\x04":
        raise ReadError(f"{path}: not a PFLlib npz file (no zip archive)")
    try:
        with np.load(path, allow_pickle=True) as archive:
            data = archive["data"].tolist()
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile,
            pickle.UnpicklingError) as exc:
        raise ReadError(f"{path}: not a PFLlib npz file ({exc})") from None
    if not isinstance(data, dict) or "x" not in data or "y" not in data:
        raise ReadError(f"{path}: expected a pickled dict with 'x' and 'y'")
    return np.asarray(data["x"]), np.asarray(data["y"])
