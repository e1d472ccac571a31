"""Loaders of the image datasets kept as image files: kvasir, TinyImagenet, Country211,
Flowers102, GTSRB, COVIDx and Omniglot (readers in :mod:`image_folders`).

Each dataset declares its official splits; ``--splits`` picks those to use
(default: PFLlib's choice). With several splits the first one counts as the
training set for ``--test-split global``. Sources (official, as torchvision
and PFLlib use them) and published MD5s where they exist:

* kvasir: datasets.simula.no ``kvasir-dataset-v2.zip`` (no checksum published),
  8 class folders.
* TinyImagenet: cs231n ``tiny-imagenet-200.zip`` (no checksum published);
  ``train/<wnid>/images`` and ``val/images`` labelled by ``val/val_annotations.txt``
  (PFLlib reads ``train/`` and ``val/`` through ImageFolder, which puts every
  ``val/`` image in one class, PFLlib #231; we label ``val`` by the annotations
  and use ``train`` only by default).
* Country211: OpenAI's ``country211.tgz`` (torchvision's MD5), ``train``,
  ``valid``, ``test`` folders of country codes. PFLlib: ``train``.
* Flowers102: VGG's ``102flowers.tgz``, ``imagelabels.mat``, ``setid.mat``
  (torchvision's MD5s); splits ``train`` (trnid), ``val`` (valid), ``test`` (tstid).
  PFLlib: ``train``.
* GTSRB: ERDA's ``GTSRB-Training_fixed.zip`` (torchvision's MD5), class folders
  ``00000..00042``; ``test`` adds ``GTSRB_Final_Test_Images.zip`` labelled by
  ``GTSRB_Final_Test_GT.zip``. PFLlib: ``train``.
* COVIDx (CXR-2 and later): Kaggle only, ``--raw-dir`` with ``train.txt`` /
  ``test.txt`` (``patient filename class source`` lines, PFLlib's columns) and
  ``train/``, ``test/``; ``--splits train val test`` adds ``val.txt`` / ``val/``
  (CXR-3 on), which PFLlib reads too. Labels: ``positive`` 1, ``negative`` 0.
* Omniglot: Lake's GitHub ``images_background.zip`` and ``images_evaluation.zip``
  (torchvision's MD5s); a class is a character (1,623), the natural client an
  alphabet (50); ``--partition dir`` etc. give PFLlib's partitioned version.
"""

from __future__ import annotations

import argparse
import csv
import io
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from . import download
from .errors import ReadError
from .image_folders import (Collected, add_image_size_argument, check_image_size, decode_image,
                            is_image, iter_files, parts_of)
from .sources import Loader, RawDataset


@dataclass(frozen=True)
class ImageDatasetSpec:
    name: str
    files: tuple[download.RemoteFile, ...]
    mirrors: tuple[str, ...]
    splits: tuple[str, ...]
    default_splits: tuple[str, ...]
    image_size: int
    grey: bool = False
    natural: bool = False
    num_classes: int | None = None
    raw_help: str = ""


def _resolve(raw_dir: Path | None, download_dir: Path, spec: ImageDatasetSpec) -> list[Path]:
    """Where to read: the downloaded archives, or ``--raw-dir`` (archives in it, or the folder)."""
    if raw_dir is None:
        if not spec.files:
            raise ReadError(f"{spec.name} has no direct download; {spec.raw_help} and pass "
                            f"--raw-dir FOLDER")
        return download.download_all(spec.files, download_dir,
                                     download.mirrors_from_env(spec.mirrors), dataset=spec.name)
    raw_dir = Path(raw_dir)
    if raw_dir.is_file():
        return [raw_dir]
    if not raw_dir.is_dir():
        raise ReadError(f"--raw-dir {raw_dir}: no such file or folder")
    archives = [raw_dir / f.name for f in spec.files if (raw_dir / f.name).is_file()]
    return archives or [raw_dir]


def _decode(files, size: int, grey: bool, select: Callable[[str], tuple | None],
            collected: Collected) -> None:
    """Decode every image whose path ``select`` maps to ``(key, label, group)``."""
    for path in files:
        for name, data in iter_files(path, lambda n: is_image(n) and select(n) is not None):
            key, label, group = select(name)
            collected.add(key, decode_image(data, f"{path}:{name}", size, grey), label, group)


def _dataset(collected: Collected, classes: list[str], splits: tuple[str, ...], origin: str,
             *, group_names: list[str] | None = None, class_names: list[str] | None = None
             ) -> RawDataset:
    x, y, order = collected.arrays(classes, origin)
    split_of = [collected.keys[i][0] for i in order]
    num_train = sum(1 for s in split_of if s == 0) if len(splits) > 1 else None
    groups = None
    if group_names is not None:
        index = {g: i for i, g in enumerate(group_names)}
        groups = np.array([index[collected.groups[i]] for i in order], dtype=np.int64)
    return RawDataset(x, y, len(classes), class_names or list(classes), num_train=num_train,
                      groups=groups, group_names=group_names,
                      extra_config={"splits": list(splits)})


# kvasir ------------------------------------------------------------------------------------

KVASIR_CLASSES = ["dyed-lifted-polyps", "dyed-resection-margins", "esophagitis", "normal-cecum",
                  "normal-pylorus", "normal-z-line", "polyps", "ulcerative-colitis"]
KVASIR = ImageDatasetSpec(
    "kvasir", (download.RemoteFile("kvasir-dataset-v2.zip", None),),
    ("https://datasets.simula.no/downloads/kvasir/",), ("all",), ("all",), 64,
    num_classes=8, raw_help="kvasir-dataset-v2.zip or its extracted folder (8 class folders)")


def load_kvasir(raw_dir, download_dir, splits, size) -> RawDataset:
    files = _resolve(raw_dir, download_dir, KVASIR)
    collected = Collected()

    def select(name):
        p = parts_of(name)
        return ((0, name), p[-2], "") if len(p) >= 2 and p[-2] in KVASIR_CLASSES else None
    _decode(files, size, False, select, collected)
    return _dataset(collected, KVASIR_CLASSES, splits, str(files[0]))


# TinyImagenet ------------------------------------------------------------------------------

TINY = ImageDatasetSpec(
    "TinyImagenet", (download.RemoteFile("tiny-imagenet-200.zip", None),),
    ("http://cs231n.stanford.edu/",), ("train", "val"), ("train",), 64, num_classes=200,
    raw_help="tiny-imagenet-200.zip or its extracted folder")


def load_tiny(raw_dir, download_dir, splits, size) -> RawDataset:
    files = _resolve(raw_dir, download_dir, TINY)
    texts: dict[str, bytes] = {}
    for path in files:
        for name, data in iter_files(path, lambda n: n.endswith(("wnids.txt", "val_annotations.txt"))):
            texts[parts_of(name)[-1]] = data
    if "wnids.txt" not in texts or ("val" in splits and "val_annotations.txt" not in texts):
        raise ReadError(f"{files[0]}: no wnids.txt / val/val_annotations.txt (not TinyImagenet)")
    classes = sorted(texts["wnids.txt"].decode().split())
    val_label = {}
    if "val" in splits:
        for line in texts["val_annotations.txt"].decode().splitlines():
            fields = line.split("\t")
            if len(fields) >= 2:
                val_label[fields[0]] = fields[1]
    collected = Collected()

    def select(name):
        p = parts_of(name)
        if "train" in splits and len(p) >= 4 and p[-4] == "train" and p[-2] == "images":
            return (splits.index("train"), name), p[-3], ""
        if "val" in splits and len(p) >= 3 and p[-3] == "val" and p[-2] == "images":
            if p[-1] not in val_label:
                raise ReadError(f"{name}: not listed in val_annotations.txt")
            return (splits.index("val"), name), val_label[p[-1]], ""
        return None
    _decode(files, size, False, select, collected)
    return _dataset(collected, classes, splits, str(files[0]))


# Country211 --------------------------------------------------------------------------------

COUNTRY211 = ImageDatasetSpec(
    "Country211", (download.RemoteFile("country211.tgz", "84988d7644798601126c29e9877aab6a"),),
    ("https://openaipublic.azureedge.net/clip/data/",), ("train", "valid", "test"), ("train",),
    64, raw_help="country211.tgz or its extracted folder")


def load_country211(raw_dir, download_dir, splits, size) -> RawDataset:
    files = _resolve(raw_dir, download_dir, COUNTRY211)
    collected = Collected()

    def select(name):
        p = parts_of(name)
        if len(p) >= 3 and p[-3] in splits:
            return (splits.index(p[-3]), name), p[-2], ""
        return None
    _decode(files, size, False, select, collected)
    return _dataset(collected, sorted(set(collected.labels)), splits, str(files[0]))


# Flowers102 --------------------------------------------------------------------------------

FLOWERS_SPLIT_KEYS = {"train": "trnid", "val": "valid", "test": "tstid"}
FLOWERS = ImageDatasetSpec(
    "Flowers102", (download.RemoteFile("102flowers.tgz", "52808999861908f626f3c1f4e79d11fa"),
                   download.RemoteFile("imagelabels.mat", "e0620be6f572b9609742df49c70aed4d"),
                   download.RemoteFile("setid.mat", "a5357ecc9cb78c4bef273ce3793fc85c")),
    ("https://www.robots.ox.ac.uk/~vgg/data/flowers/102/",), ("train", "val", "test"),
    ("train",), 64, num_classes=102,
    raw_help="102flowers.tgz (or its jpg/ folder), imagelabels.mat and setid.mat")


def _mat(path: Path, key: str) -> np.ndarray:
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError
    if not path.is_file():
        raise ReadError(f"{path}: file not found ({FLOWERS.raw_help})")
    try:
        return np.asarray(loadmat(path)[key]).reshape(-1).astype(np.int64)
    except (MatReadError, KeyError, ValueError, TypeError, OSError) as exc:
        raise ReadError(f"{path}: no {key} array ({exc})") from None


def load_flowers(raw_dir, download_dir, splits, size) -> RawDataset:
    files = _resolve(raw_dir, download_dir, FLOWERS)
    folder = files[0].parent if files[0].is_file() else files[0]
    labels = _mat(folder / "imagelabels.mat", "labels")
    split_of = {}
    for s in splits:
        for image_id in _mat(folder / "setid.mat", FLOWERS_SPLIT_KEYS[s]):
            split_of[int(image_id)] = s
    if labels.min() < 1 or labels.max() > 102:
        raise ReadError(f"{folder / 'imagelabels.mat'}: labels outside 1..102")
    archives = [f for f in files if f.name.endswith((".tgz", ".tar.gz"))] or [folder]
    collected = Collected()
    classes = [str(k) for k in range(1, 103)]

    def select(name):
        stem = parts_of(name)[-1].split(".")[0]
        if not stem.startswith("image_"):
            return None
        image_id = int(stem[len("image_"):])
        if image_id not in split_of or image_id > len(labels):
            return None
        return (splits.index(split_of[image_id]), name), str(labels[image_id - 1]), ""
    _decode(archives, size, False, select, collected)
    return _dataset(collected, classes, splits, str(folder))


# GTSRB -------------------------------------------------------------------------------------

GTSRB_TRAIN = download.RemoteFile("GTSRB-Training_fixed.zip", "513f3c79a4c5141765e10e952eaa2478")
GTSRB_TEST = download.RemoteFile("GTSRB_Final_Test_Images.zip", "c7e4e6327067d32654124b0fe9e82185")
GTSRB_TEST_GT = download.RemoteFile("GTSRB_Final_Test_GT.zip", "fe31e9c9270bbcd7b84b7f21a9d9d9e5")
GTSRB = ImageDatasetSpec(
    "GTSRB", (GTSRB_TRAIN, GTSRB_TEST, GTSRB_TEST_GT),
    ("https://sid.erda.dk/public/archives/daaeac0d7ce1152aea9b61d9f1e19370/",),
    ("train", "test"), ("train",), 32, num_classes=43,
    raw_help="GTSRB-Training_fixed.zip (and for --splits test GTSRB_Final_Test_Images.zip, "
             "GTSRB_Final_Test_GT.zip) or the extracted GTSRB/ folder")


def load_gtsrb(raw_dir, download_dir, splits, size) -> RawDataset:
    spec = GTSRB if "test" in splits else replace(GTSRB, files=(GTSRB_TRAIN,))
    files = _resolve(raw_dir, download_dir, spec)
    test_label: dict[str, str] = {}
    if "test" in splits:
        for path in files:
            for _, data in iter_files(path, lambda n: n.endswith("GT-final_test.csv")):
                for row in csv.DictReader(io.StringIO(data.decode()), delimiter=";"):
                    test_label[row["Filename"]] = f"{int(row['ClassId']):05d}"
        if not test_label:
            raise ReadError(f"{files[0]}: no GT-final_test.csv for --splits test ({spec.raw_help})")
    classes = [f"{k:05d}" for k in range(43)]
    collected = Collected()

    def select(name):
        p = parts_of(name)
        if "train" in splits and len(p) >= 3 and p[-3] == "Training" and p[-2] in classes:
            return (splits.index("train"), name), p[-2], ""
        if "test" in splits and len(p) >= 2 and p[-2] == "Images" and p[-1] in test_label:
            return (splits.index("test"), name), test_label[p[-1]], ""
        return None
    _decode(files, size, False, select, collected)
    return _dataset(collected, classes, splits, str(files[0]))


# COVIDx ------------------------------------------------------------------------------------

# Releases from CXR-3 on add val.txt and val/ (PFLlib reads train, val and test); CXR-2 has
# train and test only, hence the default.
COVIDX = ImageDatasetSpec(
    "COVIDx", (), (), ("train", "val", "test"), ("train", "test"), 64, num_classes=2,
    raw_help="download COVIDx CXR from Kaggle (andyczhao/covidx-cxr2): a folder with "
             "train.txt, test.txt, train/ and test/ (and val.txt, val/ for --splits ... val)")


def load_covidx(raw_dir, download_dir, splits, size) -> RawDataset:
    (folder,) = _resolve(raw_dir, download_dir, COVIDX)
    classes = ["negative", "positive"]
    label_of: dict[tuple[str, str], str] = {}
    for s in splits:
        listing = folder / f"{s}.txt"
        if not listing.is_file():
            raise ReadError(f"{listing}: file not found ({COVIDX.raw_help})")
        for number, line in enumerate(listing.read_text().splitlines(), 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) < 3 or fields[2].lower() not in classes:
                raise ReadError(f"{listing}: line {number} is not 'patient file class source'")
            label_of[(s, fields[1])] = fields[2].lower()
    collected = Collected()

    def select(name):
        p = parts_of(name)
        if len(p) >= 2 and p[-2] in splits and (p[-2], p[-1]) in label_of:
            return (splits.index(p[-2]), name), label_of[(p[-2], p[-1])], ""
        return None
    _decode([folder], size, False, select, collected)
    if len(collected.images) != len(label_of):
        missing = len(label_of) - len(collected.images)
        raise ReadError(f"{folder}: {missing} images listed in the split files are missing")
    return _dataset(collected, classes, splits, str(folder))


# Omniglot ----------------------------------------------------------------------------------

OMNIGLOT = ImageDatasetSpec(
    "Omniglot", (download.RemoteFile("images_background.zip", "68d2efa1b9178cc56df9314c21c6e718"),
                 download.RemoteFile("images_evaluation.zip", "6b91aef0f799c5bb55b94e3f2daec811")),
    ("https://raw.githubusercontent.com/brendenlake/omniglot/master/python/",),
    ("background", "evaluation"), ("background", "evaluation"), 28, grey=True, natural=True,
    raw_help="images_background.zip and images_evaluation.zip, or their extracted folders")


def load_omniglot(raw_dir, download_dir, splits, size) -> RawDataset:
    files = _resolve(raw_dir, download_dir, OMNIGLOT)
    collected = Collected()

    def select(name):
        p = parts_of(name)
        if len(p) >= 4 and p[-4].startswith("images_") and p[-4][len("images_"):] in splits:
            # A class is one character of one alphabet; the alphabet is the natural client.
            return (splits.index(p[-4][len("images_"):]), name), f"{p[-3]}/{p[-2]}", p[-3]
        return None
    _decode(files, size, True, select, collected)
    classes = sorted(set(collected.labels))
    return _dataset(collected, classes, splits, str(files[0]),
                    group_names=sorted(set(collected.groups)))


LOADERS: dict[str, tuple[ImageDatasetSpec, Callable[..., RawDataset]]] = {
    "kvasir": (KVASIR, load_kvasir), "TinyImagenet": (TINY, load_tiny),
    "Country211": (COUNTRY211, load_country211), "Flowers102": (FLOWERS, load_flowers),
    "GTSRB": (GTSRB, load_gtsrb), "COVIDx": (COVIDX, load_covidx),
    "Omniglot": (OMNIGLOT, load_omniglot),
}


def add_image_arguments(spec: ImageDatasetSpec) -> Callable[[argparse.ArgumentParser], None]:
    def add(parser: argparse.ArgumentParser) -> None:
        add_image_size_argument(parser, spec.image_size)
        if len(spec.splits) > 1:
            parser.add_argument("--splits", nargs="+", choices=spec.splits,
                                default=list(spec.default_splits),
                                help=f"official splits to use, the first as training set "
                                     f"(default {' '.join(spec.default_splits)})")
    return add


def binder(name: str) -> Callable[[argparse.Namespace], tuple[Loader, int | None, dict]]:
    """The ``bind`` of ``dataset_utils.main`` for image dataset ``name``."""
    spec, load = LOADERS[name]

    def bind(args: argparse.Namespace):
        check_image_size(args.image_size)
        splits = tuple(dict.fromkeys(getattr(args, "splits", None) or spec.default_splits))

        def loader(raw_dir: Path | None, download_dir: Path) -> RawDataset:
            return load(raw_dir, download_dir, splits, args.image_size)
        return loader, spec.num_classes, {"image_size": args.image_size, "splits": list(splits)}
    return bind


# DomainNet ---------------------------------------------------------------------------------

DOMAINNET_DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
# FedBN's (Li et al. 2021) ten classes, the usual federated subset of the 345.
DOMAINNET_CLASSES = ("bird", "feather", "headphones", "ice_cream", "teapot", "tiger", "whale",
                     "windmill", "wine_glass", "zebra")
DOMAINNET = ImageDatasetSpec(
    "DomainNet", tuple(download.RemoteFile(f"{d}.zip", None) for d in DOMAINNET_DOMAINS),
    # The zips live under three folders of the VisDA server; a 404 moves on to the next.
    ("http://csr.bu.edu/ftp/visda/2019/multi-source/groundtruth/",
     "http://csr.bu.edu/ftp/visda/2019/multi-source/", "http://csr.bu.edu/ftp/visda/"),
    ("all",), ("all",), 64, natural=True,
    raw_help="the domain zips (clipart.zip, infograph.zip, painting.zip, quickdraw.zip, "
             "real.zip, sketch.zip) or their extracted <domain>/<class>/ folders")


def load_domainnet(raw_dir: Path | None, download_dir: Path, domains: tuple[str, ...],
                   classes: tuple[str, ...] | None, size: int) -> RawDataset:
    """One natural client per domain; ``classes`` None keeps all 345."""
    wanted = [f for f in DOMAINNET.files if f.name[:-4] in domains]
    spec = replace(DOMAINNET, files=tuple(wanted))
    sources = _resolve(raw_dir, download_dir, spec)
    collected = Collected()

    def select(name):
        p = parts_of(name)
        if len(p) >= 3 and p[-3] in domains and (classes is None or p[-2] in classes):
            return (0, name), p[-2], p[-3]
        return None
    _decode(sources, size, False, select, collected)
    found = sorted(set(collected.groups))
    if found != sorted(domains):
        missing = sorted(set(domains) - set(found))
        raise ReadError(f"{sources[0]}: no images of domain(s) {', '.join(missing)} "
                        f"({DOMAINNET.raw_help})")
    class_list = list(classes) if classes is not None else sorted(set(collected.labels))
    data = _dataset(collected, class_list, ("all",), str(sources[0]), group_names=list(domains))
    data.group_domains = list(domains)
    return data


def main(name: str, script_dir: Path) -> int:
    """Entry point of ``generate_<name>.py`` for the image-file datasets of :data:`LOADERS`."""
    from .dataset_utils import main as generator_main

    spec = LOADERS[name][0]
    return generator_main(None, name, None, script_dir, raw_dir_help=spec.raw_help,
                          natural=spec.natural, default_num_clients=None if spec.natural else 20,
                          add_arguments=add_image_arguments(spec), bind=binder(name))
