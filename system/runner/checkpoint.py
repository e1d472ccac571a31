"""Checkpoints for exact resume: ``--checkpoint_every N`` writes one, ``--resume`` continues from it.

A checkpoint is everything a run would carry from one round into the next, as each object of the
run declares it (the persistence contract, ``flcore.extension.Carries``):

* the server's ``state_dict()``: the attributes its class and bases name ``carried`` (the global
  model, momentum, controls, FedGen's generator and its optimizer, ...), the selection policy's
  (AdaFL's scores) and each round plug-in's (the virtual clock's time, DP-FedAvg's sampling
  rates), saved under its name; each client's ``carried_state()`` (participation counts, DP-SGD's
  step counts: the client-state contract);
* the per-client state store (control variates, personal models, private parts), as stored;
* the global random generators (Python, NumPy, torch) and the history recorded so far.

Nothing else is saved: a resumed run builds the server, its clients, plug-ins, selection policy and
engine again from the same flags and data, then loads these into them. The values are encoded into
tensors and plain data (``encode``) and put back into the freshly built objects (``decode``): a
module, an optimizer, a generator or an object with ``checkpoint_state()`` and
``load_checkpoint_state(state)`` methods (the working ``FlatModel``) is loaded into the one the new
run built. A value that cannot be encoded is a programming error reported with the attribute's
path.

The file is written atomically (temporary name, then rename) with ``torch.save`` and read with
``torch.load(weights_only=True)``: tensors and plain containers only, no pickled code.
"""
from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from utils.errors import FLError
from reporting.results import write_atomically

FORMAT = "fedcohort-checkpoint"
#: 2: clients save their carried state only, plug-ins, servers and selection policies their state_dict
VERSION = 2

#: flags that do not change a run's numbers: a resume may set them differently
RESUMABLE_FLAGS = frozenset({
    "resume", "overwrite", "checkpoint_every", "progress", "quiet", "tensorboard", "num_threads",
    "times", "prev", "save_model", "results_dir", "data_root",
})


class CheckpointError(FLError):
    """A checkpoint that cannot be written or does not belong to this run."""


# ------------------------------------------------------------------------------------ encoding
def encode(value: Any, where: str) -> Any:
    """``value`` as tensors, numbers, strings and containers that ``weights_only`` loading accepts;
    typed wrappers ({"__kind__": ...}) keep what plain pickling of those would lose (tuples,
    NumPy dtypes, dict key types)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise CheckpointError(f"cannot checkpoint {where}: a NumPy object array")
        return {"__kind__": "ndarray", "data": torch.from_numpy(np.ascontiguousarray(value).copy())}
    if isinstance(value, np.generic):
        return {"__kind__": "npscalar", "dtype": value.dtype.str, "value": value.item()}
    if isinstance(value, torch.dtype):
        return {"__kind__": "dtype", "name": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"__kind__": "device", "name": str(value)}
    if isinstance(value, tuple):
        return {"__kind__": "tuple", "items": [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return {"__kind__": "set", "items": [encode(v, f"{where}{{}}") for v in sorted(value)]}
    if isinstance(value, dict):
        return {"__kind__": "dict", "items": [[encode(k, f"{where} key"), encode(v, f"{where}[{k!r}]")]
                                               for k, v in value.items()]}
    if callable(getattr(value, "checkpoint_state", None)) and not isinstance(value, type):
        return {"__kind__": "object", "state": encode(value.checkpoint_state(), f"{where}.checkpoint_state()")}
    if isinstance(value, nn.Module):
        return {"__kind__": "module", "state": {k: v.detach().clone() for k, v in value.state_dict().items()}}
    if isinstance(value, torch.optim.Optimizer):
        return {"__kind__": "optimizer", "state": encode(value.state_dict(), f"{where}.state_dict()")}
    if isinstance(value, torch.Generator):
        return {"__kind__": "generator", "state": value.get_state()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__kind__": "dataclass", "fields": encode(vars(value), where)}
    raise CheckpointError(
        f"cannot checkpoint {where} of type {type(value).__name__}: keep per-round state in tensors, "
        "arrays or plain data (see runner/checkpoint.py)"
    )


def decode(saved: Any, current: Any = None, device: torch.device | None = None) -> Any:
    """The value ``saved`` encodes; modules, flat models, optimizers and generators are loaded into
    ``current`` (the freshly built object); tensors go to ``current``'s device, or to ``device``
    where there is no current tensor (state created during the run)."""
    if isinstance(saved, torch.Tensor):
        if isinstance(current, torch.Tensor):
            return saved.to(current.device)
        return saved.to(device) if device is not None else saved
    if isinstance(saved, list):
        items = current if isinstance(current, list) and len(current) == len(saved) else [None] * len(saved)
        return [decode(s, c, device) for s, c in zip(saved, items)]
    if not isinstance(saved, dict):
        return saved
    kind = saved["__kind__"]
    if kind == "ndarray":
        return saved["data"].numpy().copy()
    if kind == "npscalar":
        return np.dtype(saved["dtype"]).type(saved["value"])
    if kind == "dtype":
        return getattr(torch, saved["name"])
    if kind == "device":
        return torch.device(saved["name"])
    if kind == "tuple":
        items = current if isinstance(current, tuple) and len(current) == len(saved["items"]) else [None] * len(saved["items"])
        return tuple(decode(s, c, device) for s, c in zip(saved["items"], items))
    if kind == "set":
        return set(decode(s) for s in saved["items"])
    if kind == "dict":
        current = current if isinstance(current, dict) else {}
        out = {}
        for key, value in saved["items"]:
            key = decode(key)
            out[key] = decode(value, current.get(key), device)
        return out
    if kind == "object":
        current.load_checkpoint_state(decode(saved["state"]))
        return current
    if kind == "module":
        current.load_state_dict(saved["state"])
        return current
    if kind == "optimizer":
        current.load_state_dict(decode(saved["state"]))
        return current
    if kind == "generator":
        generator = current if isinstance(current, torch.Generator) else torch.Generator()
        generator.set_state(saved["state"])
        return generator
    if kind == "dataclass":
        for name, value in decode(saved["fields"], vars(current), device).items():
            setattr(current, name, value)
        return current
    raise CheckpointError(f"unknown entry kind {kind!r} in checkpoint")


def saved_state(obj: Any, where: str) -> Any:
    """``obj.state_dict()`` (the persistence contract), encoded."""
    return encode(obj.state_dict(), where)


def load_saved_state(obj: Any, saved: Any, where: str, device: torch.device | None = None) -> None:
    """Put what ``saved_state`` returned back into ``obj``, a freshly built object of the same run:
    each entry decoded into the value it replaces (a module, an optimizer or a flat model is loaded
    in place), then handed to ``obj.load_state_dict``. A checkpoint whose entries are not the ones
    ``obj`` declares (written by a version that kept other state) is refused in one line."""
    current = obj.state_dict()
    readable = isinstance(saved, dict) and saved.get("__kind__") == "dict"  # a state_dict, as saved_state encodes it
    state = decode(saved, current, device) if readable else {}
    if not readable or set(state) != set(current):
        raise CheckpointError(
            f"the checkpoint's state of {where} ({', '.join(sorted(state)) or 'none'}) is not what this version "
            f"keeps ({', '.join(sorted(current)) or 'none'}); rerun with --overwrite to start again")
    obj.load_state_dict(state)


# ------------------------------------------------------------------ random generators, history
def global_rng_state() -> dict[str, Any]:
    state = {"python": encode(random.getstate(), "random"), "numpy": encode(np.random.get_state(), "np.random"),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_global_rng_state(state: dict[str, Any]) -> None:
    random.setstate(decode(state["python"]))
    np.random.set_state(decode(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------- the run's state
def comparable_config(args: Any) -> dict[str, str]:
    """The flags that decide a run's numbers, as strings (for the resume check)."""
    from cli.flags import IGNORED_DEST

    return {k: json.dumps(v, default=str) for k, v in sorted(vars(args).items())
            if k not in RESUMABLE_FLAGS and k != IGNORED_DEST}


def server_state(server: Any, next_round: int) -> dict[str, Any]:
    """Everything needed to continue ``server``'s run at round ``next_round``."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "next_round": int(next_round),
        "config": comparable_config(server.args),
        "data": server.dataset.fingerprint(),
        "server": saved_state(server, type(server).__name__),
        "clients": [encode(c.carried_state(), f"client {c.index}") for c in server.clients],
        "plugins": {name: saved_state(p, f"plug-in {name}") for name, p in server.plugins.items()},
        "selector": saved_state(server.selector, type(server.selector).__name__),
        "state_store": server.state.state_dict(),
        "history": {name: encode(value, f"history.{name}") for name, value in vars(server.history).items()},
        "rng": global_rng_state(),
    }


def load_server_state(server: Any, saved: dict[str, Any]) -> int:
    """Put ``saved`` into a freshly built ``server``; returns the round to continue with."""
    device = server.device
    if len(saved["clients"]) != len(server.clients):
        raise CheckpointError(f"the checkpoint has {len(saved['clients'])} clients, the dataset {len(server.clients)}")
    if "data" in saved and saved["data"] != server.dataset.fingerprint():  # older checkpoints hold no digest
        raise CheckpointError(
            f"the dataset {server.dataset.path} is not the one the checkpoint was trained on (it was regenerated "
            "or edited since); restore it, or rerun with --overwrite to start again"
        )
    load_saved_state(server, saved["server"], type(server).__name__, device)
    for client, state in zip(server.clients, saved["clients"]):
        client.restore_carried_state(decode(state, None, device))
    if set(saved["plugins"]) != set(server.plugins):
        raise CheckpointError(f"the checkpoint's round plug-ins ({', '.join(sorted(saved['plugins']))}) are not this "
                              f"run's ({', '.join(sorted(server.plugins))}); rerun with the original flags")
    for name, plugin in server.plugins.items():
        load_saved_state(plugin, saved["plugins"][name], f"plug-in {name}", device)
    load_saved_state(server.selector, saved["selector"], type(server.selector).__name__, device)
    server.state.load_state_dict(saved["state_store"])
    for name, value in saved["history"].items():
        setattr(server.history, name, decode(value, getattr(server.history, name, None)))
    set_global_rng_state(saved["rng"])
    return int(saved["next_round"])


def checkpoint_path(result: Path) -> Path:
    """The checkpoint of the run whose results go to ``result``: next to it."""
    return result.with_suffix(".ckpt")


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    write_atomically(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path, args: Any) -> dict[str, Any]:
    """The checkpoint at ``path``, refused when it belongs to a run with other flags."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: say which, never a traceback
        raise CheckpointError(f"cannot read checkpoint {path} ({type(exc).__name__}); delete it and rerun with --overwrite") from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a checkpoint of this platform; delete it or rerun with --overwrite")
    if saved.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {saved.get('version')}, this version reads {VERSION}")
    now = comparable_config(args)
    then = saved["config"]
    differing = sorted(k for k in set(now) | set(then) if now.get(k) != then.get(k))
    if differing:
        shown = ", ".join(f"{k} ({then.get(k, 'unset')} -> {now.get(k, 'unset')})" for k in differing[:6])
        raise CheckpointError(
            f"--resume with other flags than the checkpoint {path.name}: {shown}"
            + (f" and {len(differing) - 6} more" if len(differing) > 6 else "")
            + "; rerun with the original flags, or --overwrite to start again"
        )
    return saved
