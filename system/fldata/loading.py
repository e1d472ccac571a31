"""Read a generated federated dataset once into tensors.

Layouts (written by ``dataset/generate_<Name>.py``, ``--layout``; ``dataset/datagen/layout.py``)::

    dataset/<Name>/config.json
    dataset/<Name>/train/<i>.npz    npz layout (PFLlib's): plain arrays x, y per client
    dataset/<Name>/test/<i>.npz

    dataset/<Name>/train/x.npy, y.npy, offsets.npy     packed layout: every client's rows in
    dataset/<Name>/test/...                            one file per array, client c's rows
                                                       offsets[c]:offsets[c+1]

A packed folder is mapped into memory, not read (:func:`load_packed`): the clients' tensors are
views of the mapped files, so a run reads the pages of the rows it uses, and start-up costs one
pass over the labels whatever the population; what is checked when is said there.

Files are read with ``allow_pickle=False``. Folders written by PFLlib itself store a pickled
dict per file; reading them needs the explicit ``legacy_pickle`` opt-in, because unpickling a
file can execute code from it (``dataset/convert_pfllib.py`` converts them once instead).

Everything is checked before a run starts, each problem one :class:`FLError` line naming the file
and what to do: a file that is not an npz archive (told apart by its first bytes: zip, npy, pickle
or other, so random bytes are never taken for a PFLlib pickle), a truncated or corrupt archive, a
config.json that contradicts the files (client files beyond ``num_clients``, sample counts other
than those it records), labels that are not whole numbers in ``[0, num_classes)``, NaN or infinite
inputs, inputs and labels of different lengths, train and test inputs of different shapes or
kinds, and a folder that a generator is writing (``dataset/datagen/lock.py``) or left incomplete.

Empty clients are kept, so client numbering and ``-nc`` stay those of the files: a client without
training samples takes no local step (``main.py`` warns, naming it, and refuses a run in which no
client would take one) and has weight 0 in FedAvg's average; a client without test samples has
weight 0 in the sample-weighted evaluation (its per-client accuracy is recorded as 0 and left out
of the std). ``main.py`` refuses a run on a dataset without any training or any test sample.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import warnings
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from utils.errors import FLError
from utils.mem_utils import device_room

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
#: config.json's "label_type": one class per sample (absent), or a set of label ids (flcore/objectives.py)
LABEL_TYPES = ("class", "multilabel")
DATASET_ROOT = REPO_ROOT / "dataset"

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

    def owned(self) -> "ClientData":
        """A copy whose tensors are its own (a client's tensors are views of the merged or mapped
        splits, and serialising a view would send the whole split): what goes to another process."""
        return ClientData(self.cid, *(getattr(self, k).clone() for k in ("train_x", "train_y", "test_x", "test_y")),
                          table=self.table)

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
    #: the clients' data: a list, or for the packed layout a :class:`PackedClients` that makes a
    #: client's views when it is asked for
    clients: Sequence[ClientData] = field(default_factory=list)
    #: split -> (x, y) over all clients, client by client; the clients' tensors are views into it
    merged: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    #: float32 value of each uint8 input code when the inputs are stored compactly (else None)
    input_table: torch.Tensor | None = None
    #: whether every input was checked for NaN and infinity when loaded (a packed folder's are
    #: checked client by client when used: :func:`load_packed`)
    inputs_checked: bool = True

    @property
    def num_classes(self) -> int:
        return int(self.config["num_classes"])

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.config["input_shape"])

    def split(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) of split ``name`` over all clients, client by client in order (``bounds`` says
        whose rows are where).

        The loader's merged tensors are returned as they are (the clients' tensors are views of
        them); a dataset assembled without them gets them concatenated once."""
        if name not in self.merged:
            xs = [getattr(c, f"{name}_x") for c in self.clients]
            ys = [getattr(c, f"{name}_y") for c in self.clients]
            self.merged[name] = (torch.cat(xs), torch.cat(ys))
        return self.merged[name]

    def owners(self, name: str) -> torch.Tensor:
        """int64, one per row of ``split(name)``: the position of the client that holds it. Made
        from ``bounds`` when asked (a row index over a large population is large: 8 bytes a row)."""
        bounds = self.bounds(name)
        return torch.repeat_interleave(torch.arange(len(bounds) - 1), torch.from_numpy(np.diff(bounds)))

    def fingerprint(self) -> str:
        """A BLAKE2 digest of every client's train and test inputs and labels (dtypes, shapes and
        bytes, client by client): what a resumed run checks against its checkpoint, so that a
        dataset regenerated under the same name is noticed. Computed once (about 0.1 s for MNIST).
        A packed folder's is the digest its writer computed of every array as it wrote them
        (``content_digest`` in config.json), with the files' shapes: reading the population
        again at every checkpoint would cost what the packed layout avoids."""
        if "_fingerprint" not in self.__dict__ and isinstance(self.clients, PackedClients):
            shapes = {split: [tuple(t.shape) for t in self.merged[split][:2]] for split in self.merged}
            text = f"{self.config.get('content_digest')};{shapes}".encode()
            self.__dict__["_fingerprint"] = hashlib.blake2b(text, digest_size=16).hexdigest()
        if "_fingerprint" not in self.__dict__:
            digest = hashlib.blake2b(digest_size=16)
            for client in self.clients:
                for tensor in (client.train_x, client.train_y, client.test_x, client.test_y):
                    digest.update(f"{tensor.dtype}{tuple(tensor.shape)};".encode())
                    digest.update(tensor.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy())
            if self.input_table is not None:
                digest.update(self.input_table.detach().contiguous().view(torch.uint8).cpu().numpy())
            self.__dict__["_fingerprint"] = digest.hexdigest()
        return self.__dict__["_fingerprint"]

    def bounds(self, name: str) -> np.ndarray:
        """int64 ``[num_clients + 1]``: client ``c`` owns rows ``bounds[c]:bounds[c + 1]`` of
        ``split(name)`` (the packed layout's offsets as they are stored)."""
        key = f"_bounds_{name}"
        if key not in self.__dict__:
            if isinstance(self.clients, PackedClients):
                self.__dict__[key] = self.clients.offsets[name]
            else:
                sizes = [len(getattr(c, f"{name}_y")) for c in self.clients]
                self.__dict__[key] = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        return self.__dict__[key]

    def offsets(self, name: str) -> list[int]:
        """The row of ``split(name)`` where each client's samples start."""
        key = f"_offsets_{name}"
        if key not in self.__dict__:
            self.__dict__[key] = self.bounds(name)[:-1].tolist()
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


def available_generators() -> dict[str, str]:
    """Dataset name -> script, for every ``dataset/generate_<Name>.py`` that exists."""
    return {script.stem.removeprefix("generate_"): script.name for script in sorted(DATASET_ROOT.glob("generate_*.py"))}


def generate_hint(name: str, path: Path) -> str:
    """How to create dataset ``name`` at ``path``: the exact command of the generator of that name
    (letter case aside) where one exists, else the list of the generators that do exist."""
    generators = available_generators()
    wanted = Path(name).name
    match = next((known for known in generators if known.lower() == wanted.lower()), None)
    if match is None:
        return f"no generator makes {wanted!r}; the generators in {DATASET_ROOT} are for: {', '.join(generators) or 'none'}"
    # Without arguments every generator writes its default partition (PFLlib's `noniid - dir`, or
    # the natural clients) to dataset/<Name>; --out-dir sends it where this run looks instead.
    command = f"cd {DATASET_ROOT} && python {generators[match]}"
    if path.resolve() != (DATASET_ROOT / match).resolve():
        command += f" --out-dir {path}"
    return f"create it with: {command} (add -h for its partitions)"


def load_config(path: Path, name: str) -> dict:
    """``config.json`` of the dataset at ``path``, checked for the keys the loader relies on."""
    config_file = path / "config.json"
    if not config_file.exists():
        raise FLError(f"dataset {name!r} not found at {path} (no config.json); {generate_hint(name, path)}")
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FLError(f"{config_file} is not valid JSON ({exc}); regenerate the dataset with --force") from exc
    except OSError as exc:
        raise FLError(f"cannot read {config_file} ({exc.strerror or exc})") from exc
    if not isinstance(config, dict):
        raise FLError(f"{config_file} holds {type(config).__name__}, not an object; regenerate the dataset with --force")

    def whole(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    if not whole(config.get("num_clients")):
        raise FLError(f"{config_file}: \"num_clients\" must be a whole number >= 1, got {config.get('num_clients')!r}; "
                      "regenerate the dataset with --force")
    if "num_classes" in config and not whole(config["num_classes"]):
        raise FLError(f"{config_file}: \"num_classes\" must be a whole number >= 1, got {config['num_classes']!r}; "
                      "regenerate the dataset with --force")
    if config.get("label_type", "class") not in LABEL_TYPES:
        raise FLError(f"{config_file}: \"label_type\" {config['label_type']!r} is not one of "
                      f"{', '.join(LABEL_TYPES)}; regenerate the dataset with --force")
    if config.get("label_type") == "multilabel" and not (whole(config.get("max_labels"))
                                                         and whole(config.get("num_classes"))):
        raise FLError(f"{config_file}: multi-label data need whole numbers \"max_labels\" and \"num_classes\" >= 1, "
                      f"got {config.get('max_labels')!r} and {config.get('num_classes')!r}; regenerate the dataset with --force")
    shape = config.get("input_shape")
    if shape is not None and not (isinstance(shape, list) and all(whole(d) for d in shape)):
        raise FLError(f"{config_file}: \"input_shape\" must be a list of whole numbers >= 1, got {shape!r}; "
                      "regenerate the dataset with --force")
    return config


# ---------------------------------------------------------------- a generator writing the folder
#: the marker a generator holds an exclusive ``flock`` on while it writes a dataset folder (its pid
#: inside); written by ``dataset/datagen/lock.py``, whose name it must match
WRITER_LOCK = ".writing.lock"


def check_not_being_written(path: Path, name: str) -> None:
    """Refuse a folder that a generator is writing now, or that a killed generator left incomplete.

    The generator's lock is released by the kernel when it exits however it exits, so a marker
    whose lock can be taken is stale: harmless when ``config.json`` (written last) is there, an
    incomplete folder otherwise. The marker is only opened for reading: datasets may be read-only."""
    marker = path / WRITER_LOCK
    try:
        fd = os.open(marker, os.O_RDONLY)
    except OSError:
        return  # no marker (or one we may not read, which no generator of ours writes)
    try:
        pid = os.read(fd, 32).decode(errors="replace").strip() or "?"
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FLError(f"dataset {name} is being written by a generator (pid {pid}); wait for it to finish, "
                          "or stop it and regenerate with --force") from None
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    if not (path / "config.json").exists():
        raise FLError(f"dataset {name} was left incomplete by a generator that stopped (pid {pid}); "
                      f"regenerate it with --force ({generate_hint(name, path).removeprefix('create it with: ')})")


def _config_identity(path: Path) -> tuple[int, int] | None:
    """Identity of ``config.json`` (a generator replaces it last, so a rewrite changes it)."""
    try:
        info = (path / "config.json").stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns


# ---------------------------------------------------------------------------- client files
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # an npz archive (np.savez), PFLlib's files included
_NPY_MAGIC = b"\x93NUMPY"  # one array saved with np.save
_PICKLE_PROTO = 0x80  # a pickle of protocol 2 or later starts with the PROTO opcode and the protocol


def _file_kind(head: bytes) -> str:
    """What a file is, from its first bytes: 'npz', 'npy', 'pickle', 'empty' or 'unknown'.

    Deciding from the bytes keeps two files apart that ``np.load`` mixes up: with
    ``allow_pickle=False`` it takes any file that is neither zip nor npy for a pickle."""
    if head.startswith(_ZIP_MAGIC):
        return "npz"
    if head.startswith(_NPY_MAGIC):
        return "npy"
    if len(head) >= 2 and head[0] == _PICKLE_PROTO and 2 <= head[1] <= 5:
        return "pickle"
    return "empty" if not head else "unknown"


#: PFLlib's per-client label statistic in config.json: [label, count] pairs over train + test
STATS_KEY = "Size of samples for labels in clients"
#: what to do about a file that does not hold what config.json and the format say
REGENERATE = "regenerate the dataset (its generator with --force)"


def _read_npz(file: Path, legacy_pickle: bool, inputs: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
    """(x, y) of a client file, ``x`` only when ``inputs``; anything unreadable is one FLError line.

    Only PFLlib's layout (an npz archive whose array ``data`` is a pickled dict) is ever unpickled,
    and only with ``legacy_pickle``; a file of any other kind is reported as what it is."""
    try:
        with open(file, "rb") as handle:
            head = handle.read(8)
    except FileNotFoundError:
        raise FLError(f"missing client file {file}; {REGENERATE}") from None
    except OSError as exc:
        raise FLError(f"cannot read {file} ({exc.strerror or exc})") from None
    kind = _file_kind(head)
    if kind == "empty":
        raise FLError(f"{file} is empty (0 bytes); {REGENERATE}")
    if kind == "npy":
        raise FLError(f"{file} holds one .npy array, not an npz archive of arrays 'x' and 'y'; {REGENERATE}")
    if kind == "pickle":
        raise FLError(f"{file} is a bare pickle, not an npz archive (PFLlib's files are npz archives too), "
                      f"so it is never unpickled; {REGENERATE}")
    if kind == "unknown":
        raise FLError(f"{file} is not an npz archive (it starts with bytes {head.hex(' ')}): the file is corrupt; {REGENERATE}")
    try:
        with np.load(file, allow_pickle=False) as archive:
            if "x" in archive.files and "y" in archive.files:
                return (archive["x"] if inputs else None), archive["y"]
            if "data" not in archive.files:
                raise FLError(f"{file} holds arrays {archive.files}, expected 'x' and 'y'; {REGENERATE}")
            try:
                archive["data"]
            except ValueError as exc:  # an object array: only a pickle can hold one
                if "allow_pickle" not in str(exc):
                    raise
            else:
                raise FLError(f"{file} holds one array 'data', expected 'x' and 'y'; {REGENERATE}")
    except FLError:
        raise
    except ValueError as exc:
        if "allow_pickle" in str(exc):  # numpy's refusal to read an object array ('x' or 'y')
            raise FLError(f"{file} holds pickled Python objects (an object array), which are never unpickled: "
                          f"its arrays must be plain numbers; {REGENERATE}") from None
        raise FLError(f"{file} is corrupt or truncated ({_one_line(exc)}); {REGENERATE}") from exc
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, KeyError) as exc:
        raise FLError(f"{file} is corrupt or truncated ({_one_line(exc)}); {REGENERATE}") from exc
    # PFLlib's layout: a pickled dict {'x', 'y'} under 'data'.
    if not legacy_pickle:
        raise FLError(
            f"{file} is a PFLlib pickle file; convert it with `python dataset/convert_pfllib.py "
            f"{file.parent.parent} --out-dir <new folder> --trust-pickle`, or pass --legacy-pickle if you trust it"
        )
    try:
        with np.load(file, allow_pickle=True) as archive:
            data = archive["data"]
        data = data.tolist() if isinstance(data, np.ndarray) else data
    except Exception as exc:  # unpickling a damaged file can fail with any exception type
        raise FLError(f"{file} is a damaged PFLlib pickle file ({type(exc).__name__}: {_one_line(exc)}); "
                      f"{REGENERATE}") from exc
    if not isinstance(data, dict) or "x" not in data or "y" not in data:
        raise FLError(f"{file}: the PFLlib pickle holds {type(data).__name__}, not a dict of 'x' and 'y'; {REGENERATE}")
    return (np.asarray(data["x"]) if inputs else None), np.asarray(data["y"])


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def label_width(config: dict) -> int | None:
    """Labels per sample of a multi-label dataset (its ``y`` is ``[rows, width]``, -1 padding), None
    for one class per sample (``y`` is ``[rows]``): config.json's ``label_type`` and ``max_labels``."""
    return int(config["max_labels"]) if config.get("label_type") == "multilabel" else None


def _label_problem(y: np.ndarray, width: int | None) -> str | None:
    """What is wrong with the shape of labels ``y`` for ``width`` (:func:`label_width`), or None."""
    if width is None and y.ndim != 1:
        return f"labels y have shape {list(y.shape)}, expected one label per sample"
    if width is not None and (y.ndim != 2 or y.shape[1] != width):
        return f"labels y have shape {list(y.shape)}, expected [rows, {width}] label ids (multi-label, -1 padding)"
    return None


def _check_labels(file: Path, y: np.ndarray, num_classes: int | None, config_file: Path,
                  width: int | None = None) -> np.ndarray:
    """``y`` as int64 after checking it holds whole numbers in [0, num_classes) (multi-label ``y``
    of ``width`` columns: in [-1, num_classes), -1 the padding)."""
    problem = _label_problem(y, width)
    if problem:
        raise FLError(f"{file}: {problem}; {REGENERATE}")
    if y.dtype.kind not in "iub":
        whole = y.dtype.kind == "f" and bool(np.all(np.isfinite(y))) and bool(np.all(y == np.round(y)))
        if not whole:
            raise FLError(f"{file}: labels y are {y.dtype}, not whole class numbers; {REGENERATE}")
    if not len(y):
        return np.zeros(y.shape, dtype=np.int64)
    _check_label_range(file, y, num_classes, config_file, width)
    return y.astype(np.int64, copy=False)


def _check_label_range(file: Path, y: np.ndarray, num_classes: int | None, config_file: Path,
                       width: int | None) -> None:
    """Labels in [0, num_classes), or in [-1, num_classes) for multi-label ``y`` (-1 the padding); one
    pass over a non-empty ``y``."""
    low, high = int(y.min()), int(y.max())
    floor = 0 if width is None else -1
    if low < floor or (num_classes is not None and high >= num_classes):
        bound = f"[{floor}, {num_classes})" if num_classes is not None else f"[{floor}, ...)"
        fix = (f"set \"num_classes\": {high + 1} in {config_file} if the data are right, or {REGENERATE}"
               if low >= floor else REGENERATE)
        raise FLError(f"{file} has labels {low}..{high}, outside {bound} of {config_file.name} "
                      f"(\"num_classes\": {num_classes}); {fix}")


def _check_sample_counts(config: dict, config_file: Path, cid: int, train: int, test: int) -> None:
    """Compare a client's sample counts with those config.json records: ours per split
    (``train_samples``/``test_samples``), else PFLlib's label statistic over train + test."""
    recorded = [(key, n) for key, n in (("train_samples", train), ("test_samples", test)) if key in config]
    if not recorded and STATS_KEY in config:
        stats = config[STATS_KEY]
        entry = stats[cid] if isinstance(stats, list) and cid < len(stats) else None
        try:
            expected = sum(int(count) for _, count in entry) if entry is not None else None
        except (TypeError, ValueError):
            expected = None
        if expected is None:
            raise FLError(f"{config_file}: {STATS_KEY!r} has no entry for client {cid}; {REGENERATE}")
        if expected != train + test:
            raise FLError(f"client {cid} holds {train + test} samples (train + test), {config_file} records {expected}; "
                          f"the files and config.json are from different runs: {REGENERATE}")
    for key, found in recorded:
        values = config[key]
        expected = values[cid] if isinstance(values, list) and cid < len(values) else "no entry"
        if expected is not None and expected != found:  # None: a client absent when the folder was converted
            raise FLError(f"client {cid} has {found} {key.split('_')[0]} samples, {config_file} records {expected}; "
                          f"the files and config.json are from different runs: {REGENERATE}")


def _check_inputs(file: Path, x: np.ndarray, rows: int) -> None:
    """A client's inputs: one row per label, numbers, and no NaN or infinity."""
    if x.ndim == 0 or len(x) != rows:
        raise FLError(f"{file} has {len(x) if x.ndim else 0} inputs for {rows} labels; {REGENERATE}")
    if x.dtype.kind not in "biuf":
        raise FLError(f"{file}: inputs x are {x.dtype}, not numbers; {REGENERATE}")
    if x.dtype.kind == "f":
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
        if bad:
            raise FLError(f"{file} has {bad} NaN or infinite input values; fix or regenerate the dataset")


def _check_client_files(path: Path, total: int, config_file: Path) -> None:
    """Refuse client files numbered beyond ``num_clients``: config.json then describes other files."""
    for split in ("train", "test"):
        folder = path / split
        if not folder.is_dir():
            continue
        extra = sorted(int(f.stem) for f in folder.glob("*.npz") if f.stem.isdigit() and int(f.stem) >= total)
        if extra:
            raise FLError(f"{config_file} says {total} clients (0..{total - 1}) but {folder} also holds "
                          f"{', '.join(f'{i}.npz' for i in extra[:3])}{' ...' if len(extra) > 3 else ''}; "
                          f"the files and config.json are from different runs: {REGENERATE}")


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
    check_not_being_written(path, name)
    identity = _config_identity(path)
    config = load_config(path, name)
    config_file = path / "config.json"
    total = config["num_clients"]
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
    if few_shot > 0 and label_width(config) is not None:
        raise FLError(f"--few_shot picks rows per client and class, and dataset {name!r} has a set of labels per "
                      "sample (\"label_type\": \"multilabel\"); run it without --few_shot")
    if config.get("format") == PACKED_FORMAT:
        if legacy_pickle:
            raise FLError(f"--legacy-pickle is for PFLlib's pickled npz files; {path} is a packed folder of plain "
                          "arrays: leave the flag out")
        if few_shot > 0:
            raise FLError(f"--few_shot picks rows per client and label, which the packed folder {path} holds "
                          "as mapped files: generate the dataset with --few-shot, or convert it to the npz "
                          "layout (dataset/convert_layout.py --to npz)")
        dataset = load_packed(path, name, config, device)
        if _config_identity(path) != identity:
            raise FLError(f"dataset {name} was rewritten while it was being loaded (a generator ran); run again")
        return dataset
    ids = [i for i in range(total) if (path / "train" / f"{i}.npz").exists()]
    if not ids:
        raise FLError(f"no client files in {path / 'train'}; {generate_hint(name, path)}")
    # Read one file first so a PFLlib folder gets the pickle advice, not a missing-files one.
    _read_npz(path / "train" / f"{ids[0]}.npz", legacy_pickle, inputs=False)
    if len(ids) < total and not legacy_pickle:
        missing = sorted(set(range(total)) - set(ids))[:5]
        raise FLError(f"client files missing in {path / 'train'} (e.g. {missing}); {REGENERATE}")
    _check_client_files(path, total, config_file)
    # Two passes, so the inputs are written once into one tensor per split: the peak is the data
    # plus one client's file, not the data twice (the per-client arrays plus their concatenation).
    # The first reads and checks the labels (and the sample counts config.json records).
    declared_classes, width = config.get("num_classes"), label_width(config)
    keep: dict[tuple[str, int], np.ndarray | None] = {}
    rows: dict[tuple[str, int], int] = {}
    labels: dict[str, list[np.ndarray]] = {"train": [], "test": []}
    for cid in ids:
        for split in ("train", "test"):
            file = path / split / f"{cid}.npz"
            y = _check_labels(file, _read_npz(file, legacy_pickle, inputs=False)[1], declared_classes, config_file,
                              width)
            rows[split, cid] = len(y)
            if split == "train" and few_shot > 0:
                keep[split, cid] = _few_shot_rows(y, few_shot)
                y = y[keep[split, cid]]
            labels[split].append(y)
    shape = tuple(config["input_shape"]) if config.get("input_shape") is not None else None
    shape_source = "config.json says"
    merged: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    coder = _InputCoder() if compact else None
    #: integer inputs are token ids (text) or category codes: kept as int64 (embeddings index with
    #: them), never coded or converted to floats; decided by the first file's dtype
    integer_inputs: bool | None = None
    first_file = None
    for split in ("train", "test"):
        sizes = [len(y) for y in labels[split]]
        all_y = torch.as_tensor(np.concatenate(labels[split]), dtype=torch.int64).to(device)
        all_x = None
        start = 0
        for cid, size in zip(ids, sizes):
            file = path / split / f"{cid}.npz"
            x, _ = _read_npz(file, legacy_pickle)
            _check_inputs(file, x, rows[split, cid])
            if (split, cid) in keep:
                x = x[keep[split, cid]]
            if integer_inputs is None:
                integer_inputs, first_file = bool(np.issubdtype(x.dtype, np.integer)), file
                coder = None if integer_inputs else coder
            elif bool(np.issubdtype(x.dtype, np.integer)) != integer_inputs and size:
                kinds = ("integer", "float") if integer_inputs else ("float", "integer")
                raise FLError(f"{file} has {kinds[1]} inputs, {first_file} {kinds[0]} ones; {REGENERATE}")
            if size:
                if shape is None:
                    shape, shape_source = tuple(int(d) for d in x.shape[1:]), f"{file} has"
                if tuple(x.shape[1:]) != shape:
                    raise FLError(
                        f"client {cid} inputs have shape {list(x.shape[1:])} ({file}), {shape_source} {list(shape)}; "
                        f"{REGENERATE}"
                    )
            if all_x is None and shape is not None:
                dtype = torch.int64 if integer_inputs else torch.uint8 if coder is not None else torch.float32
                if split == "train":
                    _check_fits(name, device, labels, shape, dtype)
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
        merged[split] = (all_x, all_y)
    # Compared last, so that a file of the wrong shape or length is reported as such.
    for cid in ids:
        _check_sample_counts(config, config_file, cid, rows["train", cid], rows["test", cid])
    # A generator that started while we read would have replaced config.json (or holds its lock).
    check_not_being_written(path, name)
    if _config_identity(path) != identity:
        raise FLError(f"dataset {name} was rewritten while it was being loaded (a generator ran); run again")
    # the clients' tensors are views of the merged ones (made last: a fallback to float32 replaces them)
    views = {split: split_views(all_x, all_y, map(len, labels[split])) for split, (all_x, all_y) in merged.items()}
    table = torch.as_tensor(coder.table, device=device) if coder is not None else None
    clients = [
        ClientData(cid=cid, train_x=tx, train_y=ty, test_x=vx, test_y=vy, table=table)
        for cid, (tx, ty), (vx, vy) in zip(ids, views["train"], views["test"])
    ]
    if config.get("input_shape") is None:
        config["input_shape"] = list(shape or ())
    if "num_classes" not in config:
        seen = [int(y.max()) for split in ("train", "test") for y in labels[split] if len(y)]
        if not seen:
            raise FLError(f"dataset {name!r} has no samples and {config_file} no \"num_classes\"; {REGENERATE}")
        config["num_classes"] = max(seen) + 1
    return FederatedDataset(name=name, path=path, config=config, clients=clients, merged=merged, input_table=table)


def _check_fits(name: str, device, labels: dict[str, list[np.ndarray]], shape: tuple, dtype: torch.dtype) -> None:
    """Refuse in one line a dataset whose inputs and labels cannot fit the GPU's free memory: every
    split is loaded onto the training device whole, and the out-of-memory error that would follow
    would point at the batch size instead."""
    room = device_room(torch.device(device))
    if room is None:
        return
    rows = sum(len(y) for split in labels.values() for y in split)
    need = rows * (int(np.prod(shape, dtype=np.int64)) * dtype.itemsize + 8)  # inputs; labels (int64)
    if need > room[0]:
        gib = 1024**3
        raise FLError(f"dataset {name} needs {need / gib:.1f} GiB on {device} ({rows} samples, loaded whole onto the "
                      f"training device) and {room[0] / gib:.1f} of its {room[1] / gib:.1f} GiB are free: "
                      "run with -dev cpu, on a larger GPU, or on fewer or smaller samples")


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
    done = {split: (decode_inputs(x, values), y) for split, (x, y) in merged.items()}
    return floats, done, None


# ---------------------------------------------------------------------------- packed layout
#: the packed layout's format name and files (``dataset/datagen/layout.py`` writes them)
PACKED_FORMAT = "packed-npy-v1"
PACKED_FILES = ("x.npy", "y.npy", "offsets.npy")


def _npy_header(file: Path) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, shape, byte offset of the data) of an ``.npy`` file whose size matches its header.

    numpy's header reader parses the header as a literal (``ast.literal_eval``), never a pickle;
    an object dtype, which only a pickle could fill, is refused."""
    try:
        with open(file, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(handle)
            start = handle.tell()
            size = os.fstat(handle.fileno()).st_size
    except FileNotFoundError:
        raise FLError(f"missing packed file {file}; {REGENERATE}") from None
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        raise FLError(f"{file} is not a readable .npy file ({_one_line(exc)}); {REGENERATE}") from None
    if dtype.hasobject or fortran:
        raise FLError(f"{file} holds {'Python objects' if dtype.hasobject else 'a Fortran-ordered array'}, not a "
                      f"plain C-ordered array; {REGENERATE}")
    need = start + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size < need:
        raise FLError(f"{file} is truncated: its header says {list(shape)} {dtype} ({need} bytes), the file has "
                      f"{size}; {REGENERATE}")
    if size > need:
        raise FLError(f"{file} holds {size - need} bytes more than its header ({list(shape)} {dtype}) says: the "
                      f"header lies about its size; {REGENERATE}")
    return dtype, tuple(int(d) for d in shape), start


def _map(file: Path) -> np.ndarray:
    """The array of ``file`` mapped copy-on-write (writes stay in this process's memory)."""
    dtype, shape, start = _npy_header(file)
    if not np.prod(shape, dtype=np.int64):
        return np.zeros(shape, dtype=dtype)  # mmap cannot map zero bytes
    return np.memmap(file, dtype=dtype, mode="c", offset=start, shape=shape)


def _packed_split(path: Path, split: str, config: dict, config_file: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, offsets) of one split, their headers checked against each other and config.json."""
    folder = path / split
    x, y, offsets = (_map(folder / name) for name in PACKED_FILES)
    files = {name: folder / name for name in PACKED_FILES}
    total = config["num_clients"]
    if offsets.dtype != np.int64 or offsets.shape != (total + 1,):
        raise FLError(f"{files['offsets.npy']} holds {offsets.dtype} {list(offsets.shape)}, expected int64 "
                      f"[{total + 1}] ({total} clients, config.json); {REGENERATE}")
    # kept mapped (8 bytes a client: file pages, not this process's memory)
    rows = len(y)
    steps = np.diff(offsets)
    if offsets[0] != 0 or offsets[-1] != rows or (steps < 0).any() or (offsets > rows).any():
        bad = int(np.flatnonzero(steps < 0)[0]) if (steps < 0).any() else None
        what = (f"client {bad}'s rows end before they start (offsets {offsets[bad]} > {offsets[bad + 1]}: "
                f"overlapping clients)" if bad is not None else
                f"offsets run from {offsets[0]} to {offsets.max()} over {rows} rows of {files['y.npy'].name}")
        raise FLError(f"{files['offsets.npy']}: {what}; {REGENERATE}")
    width = label_width(config)
    if _label_problem(y, width) or y.dtype != np.int64:
        expected = "one per row" if width is None else f"[rows, {width}] (multi-label, -1 padding)"
        raise FLError(f"{files['y.npy']} holds {y.dtype} {list(y.shape)}, expected int64 labels, {expected}; {REGENERATE}")
    if x.ndim == 0 or len(x) != rows:
        raise FLError(f"{files['x.npy']} has {len(x) if x.ndim else 0} rows, {files['y.npy']} {rows}; {REGENERATE}")
    if x.dtype not in (np.float32, np.int64):
        raise FLError(f"{files['x.npy']} holds {x.dtype}, expected float32 (or int64 token ids); {REGENERATE}")
    recorded = config.get(f"{split}_rows")
    if recorded != rows:
        raise FLError(f"{files['y.npy']} holds {rows} rows, {config_file} records {split}_rows {recorded!r}: the files "
                      f"and config.json are from different runs: {REGENERATE}")
    shape = config.get("input_shape")
    if shape is not None and list(x.shape[1:]) != list(shape):
        raise FLError(f"{files['x.npy']} has inputs of shape {list(x.shape[1:])}, {config_file} says {list(shape)}; "
                      f"{REGENERATE}")
    num_classes = config.get("num_classes")
    if rows:  # one pass over the labels (8 bytes a row): the only check that reads every row
        _check_label_range(files['y.npy'], y, num_classes, config_file, width)
    return x, y, offsets


class PackedClients(Sequence):
    """The clients of a packed folder, each made when it is asked for (a small object whose
    tensors are views of the mapped splits, made when read); a client's inputs of a split are
    checked for NaN or infinity the first time they are read through :meth:`ClientData.inputs`."""

    def __init__(self, merged: dict, offsets: dict[str, np.ndarray], files: dict[str, Path]) -> None:
        self.merged, self.offsets, self.files = merged, offsets, files
        self._checked = {split: np.zeros(len(offsets[split]) - 1, dtype=bool) for split in offsets}

    def __len__(self) -> int:
        return len(self._checked["train"])

    def __getitem__(self, index):
        count = len(self._checked["train"])
        if isinstance(index, slice):
            return [PackedClientData(i, self) for i in range(*index.indices(count))]
        index = int(index)
        if not -count <= index < count:
            raise IndexError(f"client {index} of {count}")
        return PackedClientData(index % count, self)

    def __iter__(self):
        return (PackedClientData(i, self) for i in range(len(self)))

    def rows(self, cid: int, split: str) -> tuple[int, int]:
        """(start, stop) of client ``cid``'s rows of ``split``."""
        return int(self.offsets[split][cid]), int(self.offsets[split][cid + 1])

    def view(self, cid: int, split: str, which: int) -> torch.Tensor:
        """Client ``cid``'s inputs (``which`` 0) or labels (1) of ``split``: a view."""
        start, stop = self.rows(cid, split)
        return self.merged[split][which][start:stop]

    def check(self, cid: int, split: str) -> None:
        """Refuse client ``cid``'s inputs of ``split`` if they hold NaN or infinity (once)."""
        if self._checked[split][cid]:
            return
        x = self.view(cid, split, 0)
        if x.is_floating_point():
            bad = int(x.numel() - torch.isfinite(x).sum())
            if bad:
                start, stop = self.rows(cid, split)
                raise FLError(f"client {cid} has {bad} NaN or infinite {split} input values ({self.files[split]} "
                              f"rows {start}..{stop - 1}); fix or regenerate the dataset")
        self._checked[split][cid] = True


class PackedClientData(ClientData):
    """One client of a packed folder: its tensors are views of the mapped splits, made when read
    (the object itself holds two references, so a population of them is cheap)."""

    def __init__(self, cid: int, clients: PackedClients) -> None:  # noqa: D107 - no dataclass fields stored
        self.__dict__.update(cid=cid, table=None, _clients=clients)

    train_x = property(lambda self: self._clients.view(self.cid, "train", 0))
    train_y = property(lambda self: self._clients.view(self.cid, "train", 1))
    test_x = property(lambda self: self._clients.view(self.cid, "test", 0))
    test_y = property(lambda self: self._clients.view(self.cid, "test", 1))

    def inputs(self, split: str, idx: torch.Tensor | slice | None = None) -> torch.Tensor:
        self._clients.check(self.cid, split)
        return super().inputs(split, idx)

    def owned(self) -> ClientData:
        """The copy, checked as a first use checks (its holder reads plain tensors, unchecked)."""
        for split in ("train", "test"):
            self._clients.check(self.cid, split)
        return super().owned()

    @property
    def num_train(self) -> int:
        start, stop = self._clients.rows(self.cid, "train")
        return stop - start

    @property
    def num_test(self) -> int:
        start, stop = self._clients.rows(self.cid, "test")
        return stop - start


def load_packed(path: Path, name: str, config: dict, device: torch.device | str = "cpu") -> FederatedDataset:
    """A packed folder as a :class:`FederatedDataset` whose tensors are views of the mapped files.

    Checked at start-up, at a cost independent of the number of samples except the last: every
    file's header (a plain C-ordered array of the expected dtype, as many bytes as it says: a
    truncated or padded file is refused), the offsets (int64, one per client and one more, from 0
    rising to the split's row count: overlapping or out-of-range ones are refused), rows of x
    and y equal, rows and input shape equal to config.json's, and the labels in
    ``[0, num_classes)`` (one pass over ``y``). Checked when a client's data are first used
    (its inputs read through ``client.data.inputs``, i.e. when it is first trained): they hold no
    NaN or infinity;
    the evaluation refuses rows with NaN or infinite inputs where it meets them
    (``flcore/evaluation.py``). ``dataset/convert_layout.py --check`` reads everything.

    On a CPU nothing is copied: the tensors share the mapped pages, which the kernel reads
    when a round touches them. On a GPU every split is copied to the device whole, as the npz
    layout is."""
    config_file = path / "config.json"
    merged, offsets, files = {}, {}, {}
    shapes = {}
    for split in ("train", "test"):
        x, y, offsets[split] = _packed_split(path, split, config, config_file)
        shapes[split] = (x.dtype, x.shape[1:])
        files[split] = path / split / "x.npy"
        xt = torch.from_numpy(x) if x.size else torch.zeros(x.shape, dtype=torch.float32 if x.dtype == np.float32 else torch.int64)
        yt = torch.from_numpy(y) if y.size else torch.zeros(y.shape, dtype=torch.int64)
        merged[split] = (xt, yt)
    if shapes["train"] != shapes["test"] and min(len(merged[s][1]) for s in merged):
        raise FLError(f"{files['train']} holds {shapes['train'][0]} inputs of shape {list(shapes['train'][1])}, "
                      f"{files['test']} {shapes['test'][0]} of shape {list(shapes['test'][1])}; {REGENERATE}")
    device = torch.device(device)
    if device.type != "cpu":
        labels = {split: [merged[split][1].numpy()] for split in merged}
        _check_fits(name, device, labels, tuple(merged["train"][0].shape[1:]), merged["train"][0].dtype)
        merged = {split: tuple(t.to(device) for t in tensors) for split, tensors in merged.items()}
    if config.get("input_shape") is None:
        config["input_shape"] = list(merged["train"][0].shape[1:])
    if "num_classes" not in config:
        seen = [int(merged[split][1].max()) for split in merged if len(merged[split][1])]
        if not seen:
            raise FLError(f"dataset {name!r} has no samples and {config_file} no \"num_classes\"; {REGENERATE}")
        config["num_classes"] = max(seen) + 1
    clients = PackedClients(merged, offsets, files)
    return FederatedDataset(name=name, path=path, config=config, clients=clients, merged=merged, inputs_checked=False)
