"""Conversion of PFLlib dataset folders to ``npz-xy-v1`` (see ``convert_pfllib.py``)."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .dataset_utils import CONFIG_NAME, FORMAT, STATS_KEY, write_json_atomic
from .layout import save_npz as _save_npz
from .errors import DatasetError, ReadError
from .legacy import load_pfllib_npz
from .lock import writing
from .out_dir import output_folder

PICKLE_WARNING = ("warning: PFLlib npz files are pickles; loading them can execute code "
                  "from the file. Convert only folders you trust.")


def _read_client(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A client file in either format; only PFLlib's pickled layout is unpickled."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            if sorted(archive.files) == ["x", "y"]:
                # Already converted (an interrupted in-place run): no pickle involved.
                return archive["x"], archive["y"]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile):
        pass  # not our format; load_pfllib_npz reports what is wrong with it
    return load_pfllib_npz(path)


def convert_pfllib_folder(source: str | Path, out_dir: str | Path | None = None, *,
                          trust_pickle: bool, in_place: bool = False, name: str | None = None,
                          force: bool = False) -> dict[str, Any]:
    """Convert the clients present in ``source`` into ``out_dir``; returns the written config.

    ``in_place=True`` (and no ``out_dir``) replaces the source files instead, which
    destroys PFLlib's copies: each file is replaced atomically and ``config.json``
    is rewritten last, so an interrupted run can simply be repeated. Raises
    :class:`DatasetError` without ``trust_pickle``, without a destination, when a
    client has only one of its train/test files, or when no client file is present.
    """
    source = Path(source).resolve()
    if (out_dir is None) == (not in_place):
        raise DatasetError("pass either --out-dir DIR (write a converted copy) or --in-place "
                           "(replace the PFLlib files in the source folder)")
    out_dir = source if in_place else output_folder(out_dir)
    if out_dir == source and not in_place:
        raise DatasetError("--out-dir is the source folder; pass --in-place instead to "
                           "replace the PFLlib files")
    if not trust_pickle:
        raise DatasetError(f"refusing to load {source}: PFLlib npz files are pickles and loading "
                           f"them can execute code from the file; pass --trust-pickle if you "
                           f"trust where they come from")
    if not in_place and (out_dir / CONFIG_NAME).is_file() and not force:
        raise DatasetError(f"{out_dir} already holds a dataset; pass --force to overwrite it")
    try:
        config = json.loads((source / CONFIG_NAME).read_text())
        num_clients = int(config["num_clients"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReadError(f"{source / CONFIG_NAME}: not a PFLlib config ({exc})") from None
    if in_place and config.get("format") == FORMAT:
        print(f"{source} is already in {FORMAT} format; nothing to do.")
        return config
    print(PICKLE_WARNING, file=sys.stderr)

    present = []
    for client in range(num_clients):
        files = [source / part / f"{client}.npz" for part in ("train", "test")]
        exists = [f.is_file() for f in files]
        if any(exists) and not all(exists):
            missing = files[exists.index(False)]
            raise ReadError(f"client {client}: {missing} is missing while its pair exists")
        if all(exists):
            present.append(client)
    if not present:
        raise ReadError(f"{source}: no client files train/<id>.npz and test/<id>.npz")

    with writing(out_dir):  # a run started meanwhile refuses the folder (see lock.py)
        try:
            config = _convert_clients(source, out_dir, config, present, in_place)
        except OSError as exc:
            raise DatasetError(f"cannot write {out_dir} ({exc.strerror or exc})") from None
        if name is not None:
            config["dataset"] = name
        stats = config.get(STATS_KEY)
        if "num_classes" not in config and isinstance(stats, list) and any(stats):
            # Older PFLlib configs lack num_classes; the label statistic bounds it from below.
            config["num_classes"] = 1 + max(int(pair[0]) for client in stats for pair in client)
        write_json_atomic(out_dir / CONFIG_NAME, config)
    return config


def _convert_clients(source: Path, out_dir: Path, config: dict[str, Any], present: list[int],
                     in_place: bool) -> dict[str, Any]:
    for part in ("train", "test"):
        (out_dir / part).mkdir(parents=True, exist_ok=True)
    if not in_place:
        (out_dir / CONFIG_NAME).unlink(missing_ok=True)
    num_clients = int(config["num_clients"])
    train_samples: list[int | None] = [None] * num_clients
    test_samples: list[int | None] = [None] * num_clients
    input_shape = None
    for client in present:
        labels = []
        for part, sizes in (("train", train_samples), ("test", test_samples)):
            x, y = _read_client(source / part / f"{client}.npz")
            if x.dtype == object or not np.issubdtype(y.dtype, np.integer):
                raise ReadError(f"{source / part}/{client}.npz: x must be a numeric array and y "
                                f"integer labels (text datasets are not supported)")
            input_shape = list(x.shape[1:])
            _save_npz(out_dir / part / f"{client}.npz", x.astype(np.float32, copy=False),
                      y.astype(np.int64, copy=False))
            sizes[client] = len(y)
            labels.append(y)
        _check_counts(config, client, np.concatenate(labels))
    return {**config, "format": FORMAT, "input_shape": input_shape,
            "train_samples": train_samples, "test_samples": test_samples,
            "clients_present": present, "converted_from": str(source)}


def _check_counts(config: dict[str, Any], client: int, labels: np.ndarray) -> None:
    """Warn when a client's labels disagree with PFLlib's recorded statistic."""
    stats = config.get(STATS_KEY)
    if not isinstance(stats, list) or client >= len(stats):
        return
    values, counts = np.unique(labels, return_counts=True)
    found = [[int(v), int(c)] for v, c in zip(values, counts)]
    if found != [list(map(int, pair)) for pair in stats[client]]:
        print(f"warning: client {client}'s labels {found} differ from config.json's "
              f"{stats[client]}", file=sys.stderr)
