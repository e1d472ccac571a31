"""Which runs of one algorithm may be averaged: those made with the same settings.

Every file main.py writes stores its flags (the ``config`` attribute). Runs of one name that
differ in a flag that changes what is computed (``-m MLR`` in one, ``-m DNN -lr 0.1`` in the
other) are different experiments: their mean would describe neither. They are split into one
group per setting, with one note naming the flags that differ, the way ``sweep.py`` refuses to
count such a file as its job's.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from reporting.loading import Note, RunResult

#: Flags that say how a run was executed or reported, not what it computed (the same list as
#: ``sweep.RUN_ONLY_DESTS``, which ``tests/reporting/test_settings.py`` checks; written out here
#: because that one is built from the checkpoint code, which imports torch).
RUN_ONLY_KEYS = frozenset({
    "resume", "overwrite", "checkpoint_every", "progress", "quiet", "tensorboard", "num_threads",
    "times", "prev", "save_model", "results_dir", "data_root",
    "save_folder_name", "device", "device_id", "engine", "state_device", "state_dir",
    "eval_batch_size", "eval_frozen", "conv_layout", "compact_inputs", "num_clients", "num_classes", "goal",
    "ignored_flags",
})
NOT_STORED = "settings not stored"


def _value(run: RunResult, key: str) -> Any:
    """A flag as compared: the seed of repeat r is seed + r (main.py), so the base seed is
    compared; the dataset by its name, as main.py names files."""
    value = run.config[key]
    if key == "seed" and isinstance(value, int):
        return value - run.run
    if key == "dataset":
        return str(value).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    return json.loads(json.dumps(value, default=str))


def differing_flags(runs: Sequence[RunResult]) -> list[str]:
    """The flags, stored by every run that stores a configuration, whose values differ between
    them (run-only flags aside), sorted."""
    configured = [r for r in runs if r.config]
    if len(configured) < 2:
        return []
    shared = set.intersection(*(set(r.config) for r in configured)) - RUN_ONLY_KEYS
    return sorted(k for k in shared if len({json.dumps(_value(r, k), sort_keys=True) for r in configured}) > 1)


def _describe(run: RunResult, keys: Sequence[str]) -> str:
    if not run.config:
        return NOT_STORED
    if not keys:
        return "settings stored"
    shown = (_value(run, k) for k in keys)
    return ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in zip(keys, shown))


def split_by_setting(name: str, runs: Sequence[RunResult], note: Note | None = None,
                     where: str = "") -> dict[str, list[RunResult]]:
    """``{name: runs}`` when the runs share one setting; else one group per setting, named
    ``name {flag=value, ...}`` by the differing flags (files without a stored configuration
    together, ``{settings not stored}``), with one note naming those flags. ``where`` prefixes
    the note (the dataset and goal)."""
    keys = differing_flags(runs)
    unknown = any(not r.config for r in runs) and any(r.config for r in runs)
    if not keys and not unknown:
        return {name: list(runs)}
    groups: dict[str, list[RunResult]] = {}
    for run in runs:
        groups.setdefault(f"{name} {{{_describe(run, keys)}}}", []).append(run)
    if note is not None and len(groups) > 1:
        what = f"{', '.join(keys)} differ" if keys else "some files store no settings"
        note(f"{where}{name}: its {len(runs)} runs were made with different settings ({what}); "
             f"not averaged together but shown apart: {'; '.join(groups)}")
    return groups if len(groups) > 1 else {name: list(runs)}
