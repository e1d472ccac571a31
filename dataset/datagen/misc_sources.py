"""StanfordCars (label skew) and AmazonReview (feature shift), both ``--raw-dir`` only.

* StanfordCars: the original Stanford URLs are gone and torchvision now points
  users to a Kaggle copy, so the files are read from ``--raw-dir``:
  ``cars_train/``, ``cars_test/`` (JPEG), ``devkit/cars_train_annos.mat``,
  ``cars_test_annos_withlabels.mat`` (struct arrays with ``fname`` and ``class``
  1..196) and ``devkit/cars_meta.mat`` (``class_names``). Files may sit in
  ``stanford_cars/`` below the folder. PFLlib uses the ``train`` split;
  ``--splits train test`` adds the test images.
* AmazonReview: the ``amazon.npz`` that KD3A (and MDAN before it) ship, plain
  arrays read with ``allow_pickle=False``: a sparse bag-of-words matrix
  (``xx_data``, ``xx_row``, ``xx_col``, ``xx_shape``, stored transposed),
  labels ``yy`` in {-1, 1} and domain boundaries ``offset`` for books, dvd,
  electronics and kitchen. As KD3A, the first 5,000 features are kept (dense
  float32) and labels become {0, 1}; one client per domain.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from .errors import ReadError
from .image_folders import decode_image
from .sources import RawDataset

CARS_SPLITS = {"train": ("cars_train", "devkit/cars_train_annos.mat"),
               "test": ("cars_test", "cars_test_annos_withlabels.mat")}
CARS_RAW_HELP = ("the StanfordCars folder (Kaggle copy): cars_train/, cars_test/, "
                 "devkit/cars_train_annos.mat, devkit/cars_meta.mat, cars_test_annos_withlabels.mat")
AMAZON_DOMAINS = ["books", "dvd", "electronics", "kitchen"]
AMAZON_DIM = 5000
AMAZON_RAW_HELP = "the folder holding KD3A's amazon.npz (Google Drive; no direct link)"


def _loadmat_cells(path: Path) -> dict:
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError
    if not path.is_file():
        raise ReadError(f"{path}: file not found ({CARS_RAW_HELP})")
    try:
        return loadmat(path, simplify_cells=True)
    except (MatReadError, ValueError, TypeError, OSError, NotImplementedError) as exc:
        raise ReadError(f"{path}: not a readable MAT file ({exc})") from None


def read_stanford_cars(raw_dir: Path, splits: tuple[str, ...], size: int) -> RawDataset:
    raw_dir = Path(raw_dir)
    root = raw_dir / "stanford_cars" if (raw_dir / "stanford_cars").is_dir() else raw_dir
    meta = _loadmat_cells(root / "devkit" / "cars_meta.mat").get("class_names")
    if meta is None or len(meta) != 196:
        raise ReadError(f"{root / 'devkit' / 'cars_meta.mat'}: no list of 196 class_names")
    xs, ys, num_train = [], [], None
    for split in splits:
        images, annos = CARS_SPLITS[split]
        records = _loadmat_cells(root / annos).get("annotations")
        if records is None:
            raise ReadError(f"{root / annos}: no annotations struct array")
        if isinstance(records, dict):  # simplify_cells squeezes a one-record array
            records = [records]
        for record in sorted(records, key=lambda r: str(r["fname"])):
            label = int(record["class"]) - 1
            if not 0 <= label < 196:
                raise ReadError(f"{root / annos}: class {label + 1} outside 1..196")
            path = root / images / str(record["fname"])
            try:
                data = path.read_bytes()
            except OSError:
                raise ReadError(f"{path}: image listed in {annos} not found") from None
            xs.append(decode_image(data, str(path), size))
            ys.append(label)
        if num_train is None:
            num_train = len(ys)
    if not xs:
        raise ReadError(f"{root}: no annotated images")
    return RawDataset(np.stack(xs), np.array(ys, dtype=np.int64), 196, [str(n) for n in meta],
                      num_train=num_train if len(splits) > 1 else None,
                      extra_config={"splits": list(splits)})


def read_amazon_review(raw_dir: Path) -> RawDataset:
    from scipy.sparse import coo_matrix

    raw_dir = Path(raw_dir)
    path = raw_dir if raw_dir.is_file() else raw_dir / "amazon.npz"
    if not path.is_file() and (raw_dir / "AmazonReview" / "amazon.npz").is_file():
        path = raw_dir / "AmazonReview" / "amazon.npz"
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in ("xx_data", "xx_row", "xx_col", "xx_shape", "yy", "offset")}
    except FileNotFoundError:
        raise ReadError(f"{path}: file not found ({AMAZON_RAW_HELP})") from None
    except KeyError as exc:
        raise ReadError(f"{path}: no {exc} array (not KD3A's amazon.npz)") from None
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise ReadError(f"{path}: not a plain-array npz file ({exc})") from None
    shape = tuple(int(v) for v in arrays["xx_shape"].reshape(-1))[::-1]
    # Stored transposed (features x documents), as KD3A reads it.
    matrix = coo_matrix((arrays["xx_data"], (arrays["xx_col"], arrays["xx_row"])),
                        shape=shape).tocsr()
    x = matrix[:, :AMAZON_DIM].toarray().astype(np.float32)
    y = ((arrays["yy"].reshape(-1) + 1) // 2).astype(np.int64)
    offset = arrays["offset"].reshape(-1).astype(np.int64)
    if len(y) != len(x) or set(np.unique(y)) - {0, 1} or len(offset) < 5 or offset[4] != len(y):
        raise ReadError(f"{path}: labels, documents and the 4 domain offsets do not agree")
    groups = np.zeros(len(y), dtype=np.int64)
    for d in range(4):
        groups[offset[d]:offset[d + 1]] = d
    return RawDataset(x, y, 2, ["negative", "positive"], pixel_max=None, groups=groups,
                      group_names=list(AMAZON_DOMAINS), group_domains=list(AMAZON_DOMAINS))


def cars_loader(splits: tuple[str, ...], size: int):
    def load(raw_dir: Path | None, download_dir: Path) -> RawDataset:
        if raw_dir is None:
            raise ReadError(f"StanfordCars has no working official download; get {CARS_RAW_HELP} "
                            f"and pass --raw-dir FOLDER")
        return read_stanford_cars(raw_dir, splits, size)
    return load


def load_amazon_review(raw_dir: Path | None, download_dir: Path) -> RawDataset:
    if raw_dir is None:
        raise ReadError(f"AmazonReview has no direct download; put {AMAZON_RAW_HELP[4:]} in a "
                        f"folder and pass --raw-dir FOLDER")
    return read_amazon_review(raw_dir)
