"""Conversion between the npz and the packed layouts (``convert_layout.py``), and a full check.

Every client is read, checked (labels whole numbers in ``[0, num_classes)``; for multi-label data,
config.json's ``label_type`` ``multilabel``, rows of ``max_labels`` labels in ``[-1, num_classes)``,
-1 the padding; inputs numbers without NaN or infinity, as many inputs as labels, one input
shape) and written in the other
layout client by client, so the memory holds one client at a time. The arrays are copied as
they are: a run on the converted folder is the run on the original, bit for bit.
``--check`` reads and checks every client without writing anything.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .dataset_utils import CONFIG_NAME, PICTURE_NAME, STATS_KEY, _prepare_out_dir, write_json_atomic
from .errors import DatasetError
from .layout import FORMATS, PACKED_FILES, SPLITS, WRITERS, open_packed
from .lock import writing
from .out_dir import output_folder

#: config.json keys that only one layout has (the npz layout's per-client lists; the packed
#: layout's file description)
LAYOUT_KEYS = {"npz": (STATS_KEY, "train_samples", "test_samples"),
               "packed": ("train_rows", "test_rows", "content_digest")}
#: files beside the clients that a conversion copies
COPIED = (PICTURE_NAME, "tokenizer.json")


def _read_config(folder: Path) -> tuple[dict[str, Any], str]:
    try:
        config = json.loads((folder / CONFIG_NAME).read_text())
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{folder / CONFIG_NAME}: cannot read it ({exc}); pass a dataset folder") from None
    layouts = [layout for layout, fmt in FORMATS.items() if config.get("format") == fmt]
    if not isinstance(config.get("num_clients"), int) or not layouts:
        raise DatasetError(f"{folder / CONFIG_NAME} is not a generator's config (format "
                           f"{config.get('format')!r}, num_clients {config.get('num_clients')!r})")
    return config, layouts[0]


def label_width(config: dict[str, Any], folder: Path) -> int | None:
    """None for one class a sample; for multi-label data (``label_type`` ``multilabel``) the
    labels a row holds, ``max_labels``."""
    kind = config.get("label_type")
    if kind is None:
        return None
    width = config.get("max_labels")
    if kind != "multilabel" or not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise DatasetError(f"{folder / CONFIG_NAME}: label_type {kind!r} with max_labels {width!r}; "
                           f"a generator writes 'multilabel' with a positive max_labels (regenerate the dataset)")
    return width


def _clients(folder: Path, layout: str, num_clients: int) -> Iterator[tuple[int, str, np.ndarray, np.ndarray]]:
    """(client, split, x, y) of every client in order, as stored."""
    if layout == "packed":
        try:
            splits = open_packed(folder)
        except (OSError, ValueError) as exc:
            raise DatasetError(f"{folder}: a packed file is missing or damaged ({exc})") from None
        for split, (x, y, offsets) in splits.items():
            if offsets.shape != (num_clients + 1,) or offsets[0] != 0 or offsets[-1] != len(y) \
                    or (np.diff(offsets) < 0).any() or len(x) != len(y):
                raise DatasetError(f"{folder / split}: offsets.npy does not cut {len(y)} rows into "
                                   f"{num_clients} clients; regenerate the dataset")
        for client in range(num_clients):
            for split in SPLITS:
                x, y, offsets = splits[split]
                lo, hi = int(offsets[client]), int(offsets[client + 1])
                yield client, split, np.asarray(x[lo:hi]), np.asarray(y[lo:hi])
        return
    for client in range(num_clients):
        for split in SPLITS:
            file = folder / split / f"{client}.npz"
            try:
                with np.load(file, allow_pickle=False) as archive:
                    yield client, split, archive["x"], archive["y"]
            except (OSError, ValueError, KeyError, EOFError) as exc:
                raise DatasetError(f"{file}: not a readable client file ({exc}); regenerate the dataset") from None


def _checked(clients, num_classes: int | None, folder: Path, width: int | None = None):
    """The clients of ``_clients``, each refused in one line where it breaks the format
    (``width``: :func:`label_width`)."""
    shape = None
    low, dims = (0, 1) if width is None else (-1, 2)
    for client, split, x, y in clients:
        where = f"{folder} client {client} ({split})"
        if y.ndim != dims or not np.issubdtype(y.dtype, np.integer):
            raise DatasetError(f"{where}: labels are {y.dtype} {list(y.shape)}, not whole numbers"
                               + ("" if width is None else f" in rows of {width}"))
        if width is not None and y.shape[1] != width:
            raise DatasetError(f"{where}: label rows of {y.shape[1]}, config.json's max_labels is {width}")
        if y.size and (y.min() < low or (num_classes is not None and y.max() >= num_classes)):
            raise DatasetError(f"{where}: labels {y.min()}..{y.max()} outside [{low}, {num_classes})")
        if x.ndim == 0 or len(x) != len(y) or x.dtype.kind not in "biuf":
            raise DatasetError(f"{where}: {len(x) if x.ndim else 0} {x.dtype} inputs for {len(y)} labels")
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            raise DatasetError(f"{where}: NaN or infinite inputs")
        if len(y):
            if shape is not None and tuple(x.shape[1:]) != shape:
                raise DatasetError(f"{where}: inputs of shape {list(x.shape[1:])} after {list(shape)}")
            shape = tuple(x.shape[1:])
        yield client, split, x, y


def check_folder(folder: str | Path) -> dict[str, Any]:
    """Read and check every client of a dataset folder of either layout; its config."""
    folder = Path(folder).resolve()
    config, layout = _read_config(folder)
    width = label_width(config, folder)
    for _ in _checked(_clients(folder, layout, config["num_clients"]), config.get("num_classes"), folder, width):
        pass
    return config


def convert_layout(source: str | Path, out_dir: str | Path, to: str, *, force: bool = False) -> dict[str, Any]:
    """Write the dataset at ``source`` in layout ``to`` into ``out_dir``; the written config."""
    source = Path(source).resolve()
    config, layout = _read_config(source)
    if layout == to:
        raise DatasetError(f"{source} is already in the {to} layout")
    out_dir = output_folder(out_dir)
    if out_dir == source:
        raise DatasetError("--out-dir is the source folder; pass a new folder")
    if (out_dir / CONFIG_NAME).is_file() and not force:
        raise DatasetError(f"{out_dir} already holds a dataset; pass --force to overwrite it")
    num_clients, num_classes = config["num_clients"], config.get("num_classes")
    width = label_width(config, source)
    with writing(out_dir):
        _prepare_out_dir(out_dir)
        writer = WRITERS[to](out_dir)
        sizes = {split: np.zeros(num_clients, dtype=np.int64) for split in SPLITS}
        stats: list[dict[int, int]] = [{} for _ in range(num_clients)] if to == "npz" else []
        try:
            for client, split, x, y in _checked(_clients(source, layout, num_clients), num_classes, source, width):
                writer.add(client, split, x, y)
                sizes[split][client] = len(y)
                if stats:
                    for label, count in zip(*np.unique(y if width is None else y[y >= 0], return_counts=True)):
                        stats[client][int(label)] = stats[client].get(int(label), 0) + int(count)
            keys = writer.finish()
        except OSError as exc:
            writer.discard()
            raise DatasetError(f"cannot write {exc.filename or out_dir} ({exc.strerror or exc})") from None
        except BaseException:
            writer.discard()
            raise
        converted = {k: v for k, v in config.items() if k not in LAYOUT_KEYS[layout]}
        converted["format"] = FORMATS[to]
        if to == "npz":
            keys = {STATS_KEY: [[[k, c] for k, c in sorted(s.items())] for s in stats],
                    "train_samples": sizes["train"].tolist(), "test_samples": sizes["test"].tolist()}
        converted.update(keys)
        for name in COPIED:
            if (source / name).is_file():
                shutil.copyfile(source / name, out_dir / name)
        write_json_atomic(out_dir / CONFIG_NAME, converted)
    return converted


__all__ = ["check_folder", "convert_layout", "PACKED_FILES"]
