"""WILDS datasets (Koh et al. 2021) as the ``wilds`` package lays them out on disk.

Both are large (Camelyon17 10 GB, iWildCam 11 GB) and served by CodaLab bundles
without a plain file URL, so they are read from ``--raw-dir``: the folder that
``wilds.get_dataset(name, download=True)`` creates, or one extracted by hand.

Columns and paths as WILDS's ``wilds/datasets/{camelyon17,iwildcam}_dataset.py`` read them:

* Camelyon17 (``camelyon17_v1.0/``): ``metadata.csv`` with columns ``patient``,
  ``node``, ``x_coord``, ``y_coord``, ``tumor``, ``center`` (0-4), and the 96x96
  patches ``patches/patient_<patient>_node_<node>/patch_patient_<patient>_node_
  <node>_x_<x>_y_<y>.png``. Label: tumor (binary); natural client: the hospital
  (``center``, 5 clients).
* iWildCam (``iwildcam_v2.0/``): ``metadata.csv`` with columns ``y`` (species
  index, 182 classes), ``location_remapped`` and ``filename``, images in
  ``train/``. Natural client: the camera trap location (323).

Images are resized to ``--image-size`` (Camelyon17 default 32, iWildCam 64: the
full 96x96 Camelyon17 patches take 12.6 GB as 8-bit arrays).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from .errors import ReadError
from .image_folders import add_image_size_argument, check_image_size, decode_image
from .sources import RawDataset


def _metadata(folder: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    path = folder / "metadata.csv"
    if not path.is_file():
        raise ReadError(f"{path}: file not found (pass the folder wilds.get_dataset made)")
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise ReadError(f"{path}: no column(s) {', '.join(missing)}")
        return list(reader)


def _find(raw_dir: Path, folder_name: str) -> Path:
    raw_dir = Path(raw_dir)
    for folder in (raw_dir, raw_dir / folder_name):
        if (folder / "metadata.csv").is_file():
            return folder
    raise ReadError(f"{raw_dir}: no {folder_name}/metadata.csv (the folder "
                    f"wilds.get_dataset(download=True) creates)")


def _read_image(path: Path, size: int) -> np.ndarray:
    try:
        data = path.read_bytes()
    except OSError:
        raise ReadError(f"{path}: image listed in metadata.csv not found") from None
    return decode_image(data, str(path), size)


def read_camelyon17(raw_dir: Path, size: int = 32) -> RawDataset:
    folder = _find(raw_dir, "camelyon17_v1.0")
    rows = _metadata(folder, ("patient", "node", "x_coord", "y_coord", "tumor", "center"))
    xs, ys, groups = [], [], []
    for row in rows:
        # WILDS reads patient as a string (dtype str keeps its leading zeros, e.g. "004").
        patient, node = row["patient"], row["node"]
        name = (f"patches/patient_{patient}_node_{node}/patch_patient_{patient}_node_{node}"
                f"_x_{row['x_coord']}_y_{row['y_coord']}.png")
        xs.append(_read_image(folder / name, size))
        ys.append(int(row["tumor"]))
        groups.append(int(row["center"]))
    if not rows:
        raise ReadError(f"{folder}/metadata.csv: no rows")
    y, g = np.array(ys, dtype=np.int64), np.array(groups, dtype=np.int64)
    if y.min() < 0 or y.max() > 1 or g.min() < 0:
        raise ReadError(f"{folder}/metadata.csv: tumor must be 0/1 and center non-negative")
    return RawDataset(np.stack(xs), y, 2, ["normal", "tumor"], groups=g,
                      group_names=[f"hospital {c}" for c in range(int(g.max()) + 1)])


def read_iwildcam(raw_dir: Path, size: int = 64) -> RawDataset:
    folder = _find(raw_dir, "iwildcam_v2.0")
    rows = _metadata(folder, ("y", "location_remapped", "filename"))
    if not rows:
        raise ReadError(f"{folder}/metadata.csv: no rows")
    xs = [_read_image(folder / "train" / row["filename"], size) for row in rows]
    y = np.array([int(row["y"]) for row in rows], dtype=np.int64)
    g = np.array([int(row["location_remapped"]) for row in rows], dtype=np.int64)
    if y.min() < 0 or g.min() < 0:
        raise ReadError(f"{folder}/metadata.csv: negative class or location")
    num_classes = int(y.max()) + 1  # as WILDS: classes 0..max(y)
    return RawDataset(np.stack(xs), y, num_classes, [str(k) for k in range(num_classes)],
                      groups=g, group_names=[f"location {c}" for c in range(int(g.max()) + 1)])


def wilds_loader(name: str, size: int):
    readers = {"Camelyon17": read_camelyon17, "iWildCam": read_iwildcam}

    def load(raw_dir: Path | None, download_dir: Path) -> RawDataset:
        if raw_dir is None:
            raise ReadError(f"{name} has no plain download link (WILDS serves CodaLab bundles): "
                            f"run pip install wilds; wilds.get_dataset('{name.lower()}', "
                            f"download=True) and pass --raw-dir with the folder it made")
        return readers[name](raw_dir, size)
    return load


DEFAULT_SIZE = {"Camelyon17": 32, "iWildCam": 64}


def main(name: str, script_dir: Path) -> int:
    """Entry point of ``generate_Camelyon17.py`` and ``generate_iWildCam.py``."""
    from .dataset_utils import main as generator_main

    def bind(args):
        return wilds_loader(name, check_image_size(args.image_size)), None, {
            "image_size": args.image_size}
    return generator_main(None, name, None, script_dir, natural=True, default_num_clients=None,
                          raw_dir_help="the WILDS folder (metadata.csv and images)",
                          add_arguments=lambda parser: add_image_size_argument(
                              parser, DEFAULT_SIZE[name]),
                          bind=bind)
