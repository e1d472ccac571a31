"""Read a generated federated dataset once into tensors.

Layout (written by ``dataset/generate_<Name>.py``)::

    dataset/<Name>/config.json
    dataset/<Name>/train/<i>.npz    plain arrays x, y
    dataset/<Name>/test/<i>.npz

Files are read with ``allow_pickle=False``. Folders written by PFLlib itself store a pickled
dict per file; reading them needs the explicit ``legacy_pickle`` opt-in, because unpickling a
file can execute code from it (``dataset/convert_pfllib.py`` converts them once instead).
"""
from __future__ import annotations

import json
import logging
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from utils.errors import FLError

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
DATASET_ROOT = REPO_ROOT / "dataset"

# The generator that creates each dataset a user is likely to ask for by name.
_GENERATORS = {
    "MNIST": "generate_MNIST.py noniid - dir",
    "FashionMNIST": "generate_FashionMNIST.py noniid - dir",
    "Cifar10": "generate_Cifar10.py noniid - dir",
    "Synthetic": "generate_Synthetic.py",
    "Digits": "generate_Digits.py noniid - dir",
}


def decode_inputs(x: torch.Tensor, table: torch.Tensor | None) -> torch.Tensor:
    """The float inputs that ``x`` stands for: ``x`` itself, or ``table[x]`` for uint8 codes."""
    return x if table is None else table[x.long()]


def split_views(all_x: torch.Tensor, all_y: torch.Tensor, sizes) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive (x, y) row blocks of ``sizes`` rows: the clients' views of a merged split."""
    views, start = [], 0
    for size in sizes:
        views.append((all_x[start : start + size], all_y[start : start + size]))
        start += size
    return views


@dataclass
class ClientData:
    """One client's train and test tensors (already on the simulation device).

    With compact inputs (see :func:`load_federated_dataset`), ``train_x``/``test_x`` hold uint8
    codes and ``table`` the float32 value of each code; :meth:`inputs` returns the float inputs."""

    cid: int
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    table: torch.Tensor | None = None

    def inputs(self, split: str, idx: torch.Tensor | slice | None = None) -> torch.Tensor:
        """Inputs of ``split`` ("train" or "test"), rows ``idx`` (all rows by default): floats, or int64 token ids."""
        x = getattr(self, f"{split}_x")
        return decode_inputs(x if idx is None else x[idx], self.table)

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.test_y.shape[0])


@dataclass
class FederatedDataset:
    name: str
    path: Path
    config: dict
    clients: list[ClientData] = field(default_factory=list)
    #: split -> (x, y, owner index) over all clients; the clients' tensors are views into it
    merged: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    #: float32 value of each uint8 input code when the inputs are stored compactly (else None)
    input_table: torch.Tensor | None = None

    @property
    def num_classes(self) -> int:
        return int(self.config["num_classes"])

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.config["input_shape"])

    def split(self, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x, y, owner client) of split ``name`` over all clients, client by client in order.

        The loader's merged tensors are returned as they are (the clients' tensors are views of
        them); a dataset assembled without them gets them concatenated once."""
        if name not in self.merged:
            xs = [getattr(c, f"{name}_x") for c in self.clients]
            ys = [getattr(c, f"{name}_y") for c in self.clients]
            owner = torch.cat([torch.full((len(y),), i, dtype=torch.long, device=y.device) for i, y in enumerate(ys)])
            self.merged[name] = (torch.cat(xs), torch.cat(ys), owner)
        return self.merged[name]

    def offsets(self, name: str) -> list[int]:
        """The row of ``split(name)`` where each client's samples start."""
        key = f"_offsets_{name}"
        if key not in self.__dict__:
            sizes = [len(getattr(c, f"{name}_y")) for c in self.clients]
            self.__dict__[key] = [0, *np.cumsum(sizes)[:-1].tolist()] if sizes else []
        return self.__dict__[key]

    def sample_inputs(self, count: int = 2) -> torch.Tensor:
        """Up to ``count`` decoded training inputs of the first client that has any (zeros of the
        inputs' dtype when no client has training data): what a model is probed with."""
        for client in self.clients:
            if client.num_train:
                return client.inputs("train", slice(0, count))
        empty = decode_inputs(self.split("train")[0][:0], self.input_table) if self.clients else torch.zeros(0)
        return torch.zeros(count, *self.input_shape, dtype=empty.dtype, device=empty.device)


def resolve_dataset_dir(name: str, data_root: str | Path | None = None) -> Path:
    """``-data MNIST`` means ``<repo>/dataset/MNIST``; an existing path is used as is."""
    candidate = Path(name).expanduser()
    if candidate.is_dir() and (candidate / "config.json").exists():
        return candidate
    root = Path(data_root) if data_root else DATASET_ROOT
    return root / name


def _generate_hint(name: str) -> str:
    script = _GENERATORS.get(name, f"generate_{name}.py noniid - dir")
    return f"cd dataset && python {script}"


def load_config(path: Path, name: str) -> dict:
    config_file = path / "config.json"
    if not config_file.exists():
        raise FLError(
            f"dataset {name!r} not found at {path} (no config.json); create it with: {_generate_hint(name)}"
        )
    try:
        return json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise FLError(f"{config_file} is not valid JSON ({exc}); regenerate it with --force") from exc


def _read_npz(file: Path, legacy_pickle: bool) -> tuple[np.ndarray, np.ndarray]:
    if not file.exists():
        raise FLError(f"missing client file {file}; regenerate the dataset with --force")
    try:
        with np.load(file, allow_pickle=False) as archive:
            if "x" in archive.files and "y" in archive.files:
                return archive["x"], archive["y"]
            if "data" not in archive.files:
                raise FLError(f"{file} holds {archive.files}, expected arrays 'x' and 'y'")
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise FLError(f"{file} is corrupt ({exc}); regenerate the dataset with --force") from exc
    except ValueError as exc:
        if "allow_pickle" not in str(exc):
            raise FLError(f"{file} cannot be read ({exc}); regenerate the dataset with --force") from exc
    # Only PFLlib's legacy layout (a pickled dict under 'data') reaches this point.
    if not legacy_pickle:
        raise FLError(
            f"{file} is a PFLlib pickle file; convert it with `python dataset/convert_pfllib.py "
            f"{file.parent.parent} --out-dir <new folder> --trust-pickle`, or pass --legacy-pickle if you trust it"
        )
    with np.load(file, allow_pickle=True) as archive:
        data = archive["data"].tolist()
    return np.asarray(data["x"]), np.asarray(data["y"])


def _read_npz_labels(file: Path, legacy_pickle: bool) -> np.ndarray:
    """Only the labels of a client file (the inputs are not read, except from PFLlib pickles)."""
    if file.exists():
        try:
            with np.load(file, allow_pickle=False) as archive:
                if "x" in archive.files and "y" in archive.files:
                    return archive["y"]
        except (zipfile.BadZipFile, OSError, EOFError, ValueError):
            pass  # _read_npz says what is wrong with the file
    return _read_npz(file, legacy_pickle)[1]


class _InputCoder:
    """Lossless uint8 coding of float inputs that take at most 256 distinct values.

    Image datasets are stored as normalised float32 pixels, which have 256 levels (MNIST:
    ``k / 127.5 - 1``); holding the level index instead of the float takes a quarter of the memory
    (real MNIST: 55 MB instead of 220 MB) and decoding a batch is one table lookup that gives the
    stored floats back bit for bit (except that -0.0 and 0.0, being equal, share one code). The
    table of distinct values grows as files are read; when it grows, the codes already written are
    renumbered, and when a dataset turns out to have more than 256 values (or NaN), the caller
    falls back to float32."""

    def __init__(self) -> None:
        self.table = np.zeros(0, dtype=np.float32)  # sorted distinct values seen so far

    def encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None] | None:
        """(codes, renumbering of earlier codes or None), or None when ``x`` does not fit 256 codes."""
        flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        renumber = None
        if len(self.table):
            pos = np.minimum(np.searchsorted(self.table, flat), len(self.table) - 1)
            known = self.table[pos] == flat
            if known.all():
                return pos.astype(np.uint8).reshape(x.shape), None
            new = np.unique(flat[~known])
        else:
            new = np.unique(flat)
        if np.isnan(new).any():
            return None
        table = np.union1d(self.table, new).astype(np.float32)
        if len(table) > 256:
            return None
        if len(self.table):
            renumber = np.searchsorted(table, self.table).astype(np.uint8)
        self.table = table
        return np.searchsorted(table, flat).astype(np.uint8).reshape(x.shape), renumber


def _few_shot_rows(y: np.ndarray, per_label: int) -> np.ndarray:
    """The first ``per_label`` samples of every label, in file order."""
    if len(y) == 0:
        return np.zeros(0, dtype=np.int64)
    keep = np.concatenate([np.flatnonzero(y == label)[:per_label] for label in np.unique(y)])
    keep.sort()
    return keep


def load_federated_dataset(
    name: str,
    device: torch.device | str = "cpu",
    *,
    data_root: str | Path | None = None,
    num_clients: int | None = None,
    legacy_pickle: bool = False,
    few_shot: int = 0,
    compact: bool = True,
) -> FederatedDataset:
    """Load every client's data once, as float32 inputs and int64 labels on ``device``
    (integer inputs, such as text token ids, stay integers: int64).

    ``num_clients`` (``-nc``) must match config.json; with a PFLlib folder whose config lists
    more clients than files are present, only the present client files are loaded.

    With ``compact`` (``--compact_inputs``, the default), inputs with at most 256 distinct values
    (8-bit images) are held as uint8 codes plus a table of their float32 values, a quarter of the
    memory; ``ClientData.inputs`` and the engines decode them per batch to the same floats.
    """
    path = resolve_dataset_dir(name, data_root)
    config = load_config(path, name)
    total = int(config["num_clients"])
    if num_clients is not None and num_clients != total:
        raise FLError(
            f"-nc {num_clients} does not match dataset {name!r}, which has {total} clients "
            f"(config.json); pass -nc {total} or regenerate the data with --num-clients {num_clients}"
        )
    if legacy_pickle:
        warnings.warn(
            "--legacy-pickle: loading pickled npz files can execute code from them; "
            "only use files you created yourself (dataset/convert_pfllib.py converts them once)",
            stacklevel=2,
        )
    ids = [i for i in range(total) if (path / "train" / f"{i}.npz").exists()]
    if not ids:
        raise FLError(f"no client files in {path / 'train'}; regenerate with: {_generate_hint(name)}")
    # Read one file first so a PFLlib folder gets the pickle advice, not a missing-files one.
    _read_npz(path / "train" / f"{ids[0]}.npz", legacy_pickle)
    if len(ids) < total and not legacy_pickle:
        missing = sorted(set(range(total)) - set(ids))[:5]
        raise FLError(f"client files missing in {path / 'train'} (e.g. {missing}); regenerate with --force")
    # Two passes, so the inputs are written once into one tensor per split: the peak is the data
    # plus one client's file, not the data twice (the per-client arrays plus their concatenation).
    keep: dict[tuple[str, int], np.ndarray | None] = {}
    labels: dict[str, list[np.ndarray]] = {"train": [], "test": []}
    for cid in ids:
        for split in ("train", "test"):
            y = _read_npz_labels(path / split / f"{cid}.npz", legacy_pickle)
            if split == "train" and few_shot > 0:
                keep[split, cid] = _few_shot_rows(y, few_shot)
                y = y[keep[split, cid]]
            labels[split].append(np.asarray(y, dtype=np.int64))
    shape = tuple(int(d) for d in config["input_shape"]) if "input_shape" in config else None
    merged: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    coder = _InputCoder() if compact else None
    #: integer inputs are token ids (text) or category codes: kept as int64 (embeddings index with
    #: them), never coded or converted to floats; decided by the first file's dtype
    integer_inputs: bool | None = None
    for split in ("train", "test"):
        sizes = [len(y) for y in labels[split]]
        all_y = torch.as_tensor(np.concatenate(labels[split]), dtype=torch.int64).to(device)
        owner = torch.repeat_interleave(torch.arange(len(ids), device=device), torch.tensor(sizes, device=device))
        all_x = None
        start = 0
        for cid, size in zip(ids, sizes):
            x, _ = _read_npz(path / split / f"{cid}.npz", legacy_pickle)
            if (split, cid) in keep:
                x = x[keep[split, cid]]
            if integer_inputs is None:
                integer_inputs = bool(np.issubdtype(x.dtype, np.integer))
                coder = None if integer_inputs else coder
            if size:
                if shape is None:
                    shape = tuple(int(d) for d in x.shape[1:])
                if tuple(x.shape[1:]) != shape:
                    raise FLError(
                        f"client {cid} inputs have shape {list(x.shape[1:])}, config.json says {list(shape)}; "
                        "regenerate the dataset with --force"
                    )
            if all_x is None and shape is not None:
                dtype = torch.int64 if integer_inputs else torch.uint8 if coder is not None else torch.float32
                all_x = torch.empty((sum(sizes), *shape), dtype=dtype, device=device)
            if size and coder is not None:
                coded = coder.encode(x)
                if coded is None:  # more than 256 values: float32 from here on, earlier codes decoded
                    all_x, merged, coder = _decode_all(all_x, merged, coder.table, start)
                else:
                    codes, renumber = coded
                    if renumber is not None:
                        _renumber(renumber, [all_x[:start]] + [m[0] for m in merged.values()])
                    x = codes
            if size:
                all_x[start : start + size].copy_(torch.as_tensor(np.ascontiguousarray(x)).to(all_x.dtype))
            del x
            start += size
        if all_x is None:  # no client has a sample of this split
            dtype = torch.int64 if integer_inputs else torch.uint8 if coder else torch.float32
            all_x = torch.empty((0, *(shape or ())), dtype=dtype, device=device)
        merged[split] = (all_x, all_y, owner)
    # the clients' tensors are views of the merged ones (made last: a fallback to float32 replaces them)
    views = {split: split_views(all_x, all_y, map(len, labels[split])) for split, (all_x, all_y, _) in merged.items()}
    table = torch.as_tensor(coder.table, device=device) if coder is not None else None
    clients = [
        ClientData(cid=cid, train_x=tx, train_y=ty, test_x=vx, test_y=vy, table=table)
        for cid, (tx, ty), (vx, vy) in zip(ids, views["train"], views["test"])
    ]
    if "input_shape" not in config:
        config["input_shape"] = list(shape or ())
    if "num_classes" not in config:
        config["num_classes"] = int(max(int(c.train_y.max()) for c in clients if c.num_train) + 1)
    return FederatedDataset(name=name, path=path, config=config, clients=clients, merged=merged, input_table=table)


def _renumber(renumber: np.ndarray, code_tensors: list[torch.Tensor]) -> None:
    """Rewrite codes in place after the table of values grew (old code k becomes renumber[k])."""
    lookup = torch.as_tensor(renumber)
    for codes in code_tensors:
        if codes.numel():
            codes.copy_(lookup.to(codes.device)[codes.long()])


def _decode_all(all_x: torch.Tensor, merged: dict, table: np.ndarray, written: int):
    """Give up compact inputs: float32 copies of the splits coded so far; (all_x, merged, None)."""
    values = torch.as_tensor(table, device=all_x.device)
    floats = torch.empty(all_x.shape, dtype=torch.float32, device=all_x.device)
    if written:
        floats[:written] = decode_inputs(all_x[:written], values)
    done = {split: (decode_inputs(x, values), y, owner) for split, (x, y, owner) in merged.items()}
    return floats, done, None
