"""Reference suites: a published setting in one TOML file, run in one command, rendered as a page.

Run from the repository root (or anywhere)::

    python system/suite.py run suites/niid_bench.toml [--profile cpu|full] [--shard i/n] [--jobs J]
    python system/suite.py render suites/niid_bench.toml     # -> docs/results/niid_bench.md (+ a figure)
    python system/suite.py check suites/ci.toml              # stored curves, within the suite's tolerance
    python system/suite.py store suites/niid_bench.toml      # keep the finished runs behind the page
    python system/suite.py status suites/niid_bench.toml     # seeds done per cell, failures, the time left

A suite names its settings (a dataset generator call each), the algorithms with their flags, the
seeds and the published figures to compare with::

    [suite]                  title, about, source (where the setting and the numbers come from),
                             seeds (repeats: seeds seed, seed+1, ...), metric (best, last, last10 or
                             last10pct: the figure the reference is compared with), target (an
                             accuracy for the to-target columns; optional), notes (lines for the
                             page; optional)
    [flags]                  main.py flags of every run (spelled as in main.py --config files)
    [profiles.full]          flags that override [flags] for --profile full (the published setting)
    [profiles.cpu]           ... for --profile cpu, and any other profile
    [settings.ID]            label, generator (dataset/generate_<generator>.py), generate (its
                             arguments), flags, target and profiles (the profiles that run it, e.g.
                             a published setting only in full and a small stand-in only in cpu;
                             default all) (optional)
    [algorithms.ID]          algo (the -algo name; default ID), flags (optional)
    [reference.SETTING]      ALGORITHM_ID = published accuracy in percent (the page lists them all,
                             run or not, and sets each beside the runs of its setting)
    [check]                  curves (a JSON file beside the suite), tolerance (accuracy, absolute)

Each (setting, algorithm, seed) is one ``main.py`` process, planned by ``sweep.py``'s machinery: a
run whose result file exists with the same settings is never run again (an interrupted suite
continues where it stopped; a stored result made with other settings is reported as a conflict),
an interrupted run resumes from its checkpoint, and ``--shard i/n`` takes every n-th run from the
i-th, so n processes or machines share a suite (results are files: copy them into one folder).
Data go to ``dataset/<suite>-<setting>`` (the generator's own download, or ``--raw-dir NAME=DIR``),
results to ``results/<suite>/`` (``--results_dir``), with the machines that ran them.

The runs behind a page are kept apart from scratch results: ``store`` copies every finished run
(its h5 file) and the machine record from the results folder into ``runs/<suite>/`` beside the
suite file (``suites/runs/niid_bench/``, ignored by git like every result: copy the folder to
carry it to another machine or checkout). ``run`` and ``render`` count a stored run as done, so
a page is rendered again from the files its numbers came from and runs made on other machines
or days, copied into that folder, add up; ``--no-stored`` ignores them (an independent rerun:
``run --no-stored --results_dir results/mine``, then ``render --no-stored --results_dir
results/mine --out DIR``). ``check`` never reads them: it compares the runs made here.
``render`` does not replace a page with one that shows fewer runs of any of its rows (a checkout
that lacks some of the files behind it; ``--drop`` writes it all the same).
Exit status: 0; 1 when a run failed or conflicted, or ``check`` found a changed number; 2 on a bad
suite file or command line; 130 when interrupted.
"""
from __future__ import annotations

import argparse
import filecmp
import fnmatch
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

SYSTEM = Path(__file__).resolve().parent
ROOT = SYSTEM.parent
if str(SYSTEM) not in sys.path:
    sys.path.insert(0, str(SYSTEM))

import numpy as np  # noqa: E402

import main  # noqa: E402
import sweep  # noqa: E402
from reporting.cli import one_line_errors  # noqa: E402
from reporting.loading import RunResult, load_run  # noqa: E402
from reporting.results import machine_record, reach_target, write_atomically  # noqa: E402
from reporting.stats import AlgorithmSummary, Stat, summarize_runs  # noqa: E402
from cli.flags import IGNORED_DEST  # noqa: E402
from cli.config_file import find_flag, flag_tokens, read_toml  # noqa: E402
from utils.errors import FLError  # noqa: E402

PROG = "suite.py"
DATASET_DIR = ROOT / "dataset"  # the generators; the default home of the suites' data
NAME = re.compile(r"[A-Za-z0-9.+-]+")  # ids that become parts of file names (no "_": it separates them)
#: the keys each table may hold: name -> (required, type)
SUITE_KEYS = {"title": (True, str), "about": (True, str), "source": (True, str), "seeds": (True, int),
              "metric": (True, str), "target": (False, float), "notes": (False, list)}
SETTING_KEYS = {"label": (True, str), "generator": (True, str), "generate": (True, list), "flags": (False, dict),
                "target": (False, float), "profiles": (False, list)}
ALGORITHM_KEYS = {"algo": (False, str), "flags": (False, dict)}
CHECK_KEYS = {"curves": (True, str), "tolerance": (True, float)}
TOP_KEYS = {"suite", "flags", "profiles", "settings", "algorithms", "reference", "check"}
#: the figure the reference column is compared with -> the summary's figure
METRICS = {"best": "best", "last": "final", "last10": "last_n", "last10pct": "last_10pct"}
#: the accuracy columns of a page: summary figure -> header (a metric's figure not among them is added)
SHOWN = {"best": "best", "final": "last", "last_n": "mean of last 10"}
#: the header of each figure a metric names
FIGURE_HEADERS = {**SHOWN, "last_10pct": "mean of last 10%"}
#: flags a suite sets itself
SUITE_SET = {"dataset": "the setting's data", "algorithm": "[algorithms.ID] algo", "results_dir": "--results_dir",
             "goal": "the profile", "times": "[suite] seeds", "prev": "[suite] seeds", "resume": "the suite",
             "overwrite": "the suite"}


@dataclass
class Setting:
    id: str
    label: str
    generator: str
    generate: list[str]
    flags: dict[str, Any]
    target: float | None = None  # the suite's target unless the setting has its own
    profiles: list[str] | None = None  # the profiles that run it (None: every profile)

    def runs_in(self, profile: str) -> bool:
        return self.profiles is None or profile in self.profiles


@dataclass
class Entry:
    """One algorithm of the suite (an id, so that one -algo may appear with two sets of flags)."""

    id: str
    algo: str
    flags: dict[str, Any]


@dataclass
class Suite:
    path: Path
    name: str
    title: str
    about: str
    source: str
    seeds: int
    metric: str
    target: float | None
    notes: list[str]
    flags: dict[str, Any]
    profiles: dict[str, dict[str, Any]]
    settings: list[Setting]
    algorithms: list[Entry]
    reference: dict[str, dict[str, float]]
    check: dict[str, Any] | None = None
    data_root: Path = DATASET_DIR

    @property
    def slug(self) -> str:
        return self.name.replace("_", "-")

    def data_dir(self, setting: Setting) -> Path:
        return self.data_root / f"{self.slug}-{setting.id}"

    def settings_of(self, profile: str) -> list[Setting]:
        return [s for s in self.settings if s.runs_in(profile)]

    def goal(self, profile: str, entry: Entry) -> str:
        return profile if entry.id == entry.algo else f"{profile}-{entry.id}"

    @property
    def stored_dir(self) -> Path:
        """Where the runs behind the suite's page are kept: ``runs/<suite>/`` beside the suite file."""
        return self.path.parent / "runs" / self.name


# --------------------------------------------------------------------------------------------
# Reading and validating a suite file
# --------------------------------------------------------------------------------------------

def _table(data: dict, keys: dict[str, tuple[bool, type]], where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise FLError(f"{where} must be a table")
    unknown = sorted(set(data) - set(keys))
    if unknown:
        raise FLError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(keys)}")
    for key, (required, kind) in keys.items():
        if key not in data:
            if required:
                raise FLError(f"{where}: missing {key}")
            continue
        value = data[key]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else isinstance(value, kind)
        if kind is int and isinstance(value, bool):
            ok = False
        if not ok:
            raise FLError(f"{where}: {key} must be {kind.__name__}, got {value!r}")
    return data


def _name(value: str, where: str) -> str:
    if not NAME.fullmatch(value):
        raise FLError(f"{where}: {value!r} must be letters, digits, '.', '+' or '-' (it is part of file names)")
    return value


def load_suite(path: str | Path) -> Suite:
    """The suite at ``path``, validated: every problem is one line (an FLError)."""
    path = Path(path)
    data = read_toml(path)
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise FLError(f"{path}: unknown table(s) {', '.join(unknown)}; allowed: {', '.join(sorted(TOP_KEYS))}")
    for key in ("suite", "flags", "profiles", "settings", "algorithms"):
        if key not in data:
            raise FLError(f"{path}: missing [{key}]")
    head = _table(data["suite"], SUITE_KEYS, f"{path} [suite]")
    if head["seeds"] < 1:
        raise FLError(f"{path} [suite]: seeds must be >= 1, got {head['seeds']}")
    if head["metric"] not in METRICS:
        raise FLError(f"{path} [suite]: metric must be one of {', '.join(METRICS)}, got {head['metric']!r}")
    profiles = data["profiles"]
    if not isinstance(profiles, dict) or "full" not in profiles:
        raise FLError(f"{path}: missing [profiles.full] (the published setting; it may be empty)")
    for name, table in profiles.items():
        _name(name, f"{path} [profiles]")
        if not isinstance(table, dict):
            raise FLError(f"{path} [profiles.{name}] must be a table of flags")
    settings = []
    for sid, table in _ids(data["settings"], f"{path} [settings]"):
        table = _table(table, SETTING_KEYS, f"{path} [settings.{sid}]")
        script = DATASET_DIR / f"generate_{table['generator']}.py"
        if not script.is_file():
            raise FLError(f"{path} [settings.{sid}]: generator {table['generator']!r}: no {script.relative_to(ROOT)}")
        runs_in = table.get("profiles")
        for name in runs_in or []:
            if name not in profiles:
                raise FLError(f"{path} [settings.{sid}]: profiles names {name!r}, which is no profile; "
                              f"profiles: {', '.join(profiles)}")
        settings.append(Setting(sid, table["label"], table["generator"], [str(a) for a in table["generate"]],
                                table.get("flags", {}), float(table["target"]) if "target" in table else None,
                                None if runs_in is None else [str(n) for n in runs_in]))
    entries = []
    for aid, table in _ids(data["algorithms"], f"{path} [algorithms]"):
        table = _table(table, ALGORITHM_KEYS, f"{path} [algorithms.{aid}]")
        entries.append(Entry(aid, table.get("algo", aid), table.get("flags", {})))
    reference = data.get("reference", {})
    if not isinstance(reference, dict):
        raise FLError(f"{path}: reference must be a table ([reference.SETTING])")
    setting_ids, entry_ids = {s.id for s in settings}, {e.id for e in entries}
    for sid, row in reference.items():
        if sid not in setting_ids:
            raise FLError(f"{path} [reference.{sid}]: no setting {sid!r}; settings: {', '.join(sorted(setting_ids))}")
        for aid, value in (row.items() if isinstance(row, dict) else [("", row)]):
            if aid not in entry_ids:
                raise FLError(f"{path} [reference.{sid}]: no algorithm {aid!r}; algorithms: {', '.join(sorted(entry_ids))}")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise FLError(f"{path} [reference.{sid}]: {aid} must be a number (percent), got {value!r}")
    check = _table(data["check"], CHECK_KEYS, f"{path} [check]") if "check" in data else None
    suite = Suite(path, path.stem, head["title"], head["about"], head["source"], head["seeds"], head["metric"],
                  float(head["target"]) if "target" in head else None, [str(n) for n in head.get("notes", [])],
                  data["flags"], profiles, settings, entries, reference, check)
    if not NAME.fullmatch(suite.slug):
        raise FLError(f"{path}: the file name must be letters, digits, '_', '.', '+' or '-'")
    for setting in settings:
        setting.target = suite.target if setting.target is None else setting.target
    for name in profiles:
        if not suite.settings_of(name):
            raise FLError(f"{path} [profiles.{name}]: no setting runs in it; add {name!r} to a setting's profiles")
    return suite


def _ids(table: Any, where: str) -> list[tuple[str, dict]]:
    if not isinstance(table, dict) or not table:
        raise FLError(f"{where}: needs at least one entry ([{where.split('[')[-1].rstrip(']')}.ID])")
    return [(_name(key, where), value) for key, value in table.items()]


# --------------------------------------------------------------------------------------------
# Planning: the runs of a profile, through sweep.py's jobs
# --------------------------------------------------------------------------------------------

def profile_flags(suite: Suite, profile: str) -> dict[str, Any]:
    if profile not in suite.profiles:
        raise FLError(f"{suite.path}: no profile {profile!r}; profiles: {', '.join(suite.profiles)}")
    return {**suite.flags, **suite.profiles[profile]}


def _applied(table: dict[str, Any], parser: argparse.ArgumentParser, where: str,
             algorithm: str | None = None) -> list[tuple[str, argparse.Action, str | None]]:
    """A flag table as sweep's (flag, action, value) triples: one value a flag. With ``algorithm``
    (an algorithm's own table) a flag that algorithm does not use is refused (main.py would ignore it)."""
    applied = []
    for key, value in table.items():
        if isinstance(value, list):
            raise FLError(f"{where}: {key} has a list; a suite's flag takes one value")
        action = find_flag(parser, key)
        if action is not None and action.dest in SUITE_SET:
            raise FLError(f"{where}: {key} is set by {SUITE_SET[action.dest]}, not a flag table")
        if action is not None and algorithm and action.dest == IGNORED_DEST:
            raise FLError(f"{where}: {key} is not a flag of {algorithm} (main.py would ignore it); "
                          f"see python system/main.py -algo {algorithm} -h")
        tokens = flag_tokens({key: value}, parser, where)
        if tokens:
            applied.append((tokens[0], find_flag(parser, key), tokens[1] if len(tokens) > 1 else None))
    return applied


def entry_parser(suite: Suite, entry: Entry) -> argparse.ArgumentParser:
    """main.py's parser for the algorithm with the entry's own flags, so that a flag the entry's
    choices bring (``select = "adafl"`` brings ``adafl_frac_step``) is that algorithm's flag."""
    tokens = flag_tokens(entry.flags, main.build_parser(["-algo", entry.algo]),
                         f"{suite.path} [algorithms.{entry.id}] flags")
    return main.build_parser(["-algo", entry.algo, *tokens])


@dataclass
class Planned:
    """One run of a suite: its setting, its algorithm and sweep.py's job (argv, file, state)."""

    setting: Setting
    entry: Entry
    job: sweep.Job
    stored: bool = False  # done by a run among the suite's stored runs

    @property
    def key(self) -> str:
        return f"{self.setting.id}/{self.entry.id}/{self.job.run}"


def plan(suite: Suite, profile: str, results_dir: Path, jobs: int = 1, stored: bool = False) -> list[Planned]:
    """Every run of the profile, in a fixed order (settings, then algorithms, then seeds), each
    marked todo, done, failed or in conflict (sweep.py's states). With ``stored``, a run that is to
    do in ``results_dir`` but finished among the suite's stored runs is done, its path the stored
    file. Nothing runs; no data is read."""
    out = _plan(suite, profile, results_dir, jobs)
    if stored and suite.stored_dir.is_dir() and suite.stored_dir.resolve() != results_dir.resolve():
        for run, kept in zip(out, _plan(suite, profile, suite.stored_dir, jobs)):
            if run.job.state == "todo" and kept.job.state == "done":
                run.job.state, run.job.path, run.stored = "done", kept.job.path, True
    return out


def _plan(suite: Suite, profile: str, results_dir: Path, jobs: int) -> list[Planned]:
    common = profile_flags(suite, profile)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    head = ["--progress", "False", "--num_threads", str(threads), "-q", "True"]
    out: list[Planned] = []
    parsers = {entry.id: entry_parser(suite, entry) for entry in suite.algorithms}
    for setting in suite.settings_of(profile):
        for entry in suite.algorithms:
            parser = parsers[entry.id]
            where = f"{suite.path} {setting.id}/{entry.id}"
            applied = [*_applied(common, parser, f"{suite.path} [flags]/[profiles.{profile}]"),
                       *_applied(setting.flags, parser, f"{suite.path} [settings.{setting.id}] flags"),
                       *_applied(entry.flags, parser, f"{suite.path} [algorithms.{entry.id}] flags", entry.algo)]
            fixed = [("-data", find_flag(parser, "data"), str(suite.data_dir(setting))),
                     ("--results_dir", find_flag(parser, "results_dir"), str(results_dir))]
            own = argparse.Namespace(goal=suite.goal(profile, entry), times=suite.seeds)
            try:
                made = sweep.jobs_of_setting(own, entry.algo, [*applied, *fixed], [], head)
            except FLError as exc:
                raise FLError(f"{where}: {exc}") from None
            for job in made:  # named by setting and entry in the progress lines
                job.label = setting.id if entry.id == entry.algo else f"{setting.id} {entry.id}"
                out.append(Planned(setting, entry, job))
    return out


def shard(jobs: list[Planned], spec: str | None) -> list[Planned]:
    """The runs of shard ``i/n`` (1 <= i <= n): every n-th run from the i-th."""
    if spec is None:
        return jobs
    match = re.fullmatch(r"(\d+)/(\d+)", spec)
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise FLError(f"--shard {spec!r}: write i/n with 1 <= i <= n, e.g. --shard 1/2")
    i, n = int(match.group(1)), int(match.group(2))
    return jobs[i - 1::n]


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------

def generator_command(suite: Suite, setting: Setting, raw_dirs: dict[str, str]) -> list[str]:
    command = [sys.executable, str(DATASET_DIR / f"generate_{setting.generator}.py"), *setting.generate,
               "--out-dir", str(suite.data_dir(setting))]
    if setting.generator in raw_dirs:
        command += ["--raw-dir", raw_dirs[setting.generator]]
    return command


def generate(suite: Suite, setting: Setting, raw_dirs: dict[str, str]) -> None:
    """Write the setting's data (the generator leaves a folder that holds this configuration alone)."""
    command = generator_command(suite, setting, raw_dirs)
    done = subprocess.run(command, cwd=DATASET_DIR, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise FLError(f"{setting.id}: generate_{setting.generator}.py failed: {lines[-1] if lines else 'no output'}"
                      + ("" if setting.generator in raw_dirs else f" (offline: --raw-dir {setting.generator}=DIR)"))


def record_machine(results_dir: Path) -> None:
    """Add this machine to ``machines.json`` in the results folder (one entry per host)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / "machines.json"
    machines = json.loads(path.read_text()) if path.is_file() else {}
    machines[platform.node() or "host"] = machine_record()
    write_machines(results_dir, machines)


def write_machines(folder: Path, machines: dict[str, Any]) -> None:
    """``machines.json`` of ``folder``, written atomically."""
    text = json.dumps(machines, indent=1, sort_keys=True) + "\n"
    write_atomically(folder / "machines.json", lambda tmp: Path(tmp).write_text(text))


def only(runs: list[Planned], patterns: Sequence[str]) -> list[Planned]:
    """The runs whose key (``setting/algorithm/seed``) matches one of the shell patterns (all without any)."""
    if not patterns:
        return runs
    chosen = [r for r in runs if any(fnmatch.fnmatchcase(r.key, p) for p in patterns)]
    if not chosen:
        raise FLError(f"--only {' '.join(patterns)}: no run matches; keys are SETTING/ALGORITHM/SEED, "
                      f"e.g. {runs[0].key}")
    return chosen


def run_suite(suite: Suite, profile: str, results_dir: Path, shard_spec: str | None, jobs: int,
              raw_dirs: dict[str, str], patterns: Sequence[str] = (), stored: bool = True) -> int:
    runs = shard(only(plan(suite, profile, results_dir, jobs, stored), patterns), shard_spec)
    planned = [p.job for p in runs]
    counts = {state: sum(j.state.split(":")[0] == state for j in planned) for state in ("todo", "done", "conflict")}
    failed = [j for j in planned if j.state == sweep.FAILED]
    kept = sum(p.stored for p in runs)
    print(f"{suite.name} ({profile}{', shard ' + shard_spec if shard_spec else ''}): {len(planned)} runs, "
          f"{counts['done']} done earlier"
          + (f" ({kept} of them stored in {_shown_path(suite.stored_dir)}; --no-stored reruns them)" if kept else "")
          + f", {counts['todo']} to run, {len(failed)} failed earlier, {counts['conflict']} in conflict", flush=True)
    problems = [f"{j.name}: {j.state}" for j in planned if j.state not in ("todo", "done")]
    todo = [j for j in planned if j.state == "todo"]
    if todo:
        needed = {Path(j.settings["dataset"]).name for j in todo}
        for setting in suite.settings:
            if suite.data_dir(setting).name in needed:
                generate(suite, setting, raw_dirs)
        record_machine(results_dir)
        problems += sweep.run_jobs(planned, jobs, results_dir / "sweep-logs")
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------

@dataclass
class Cell:
    """The finished runs of one (setting, algorithm) of a profile, and their summary."""

    runs: list[RunResult]
    summary: AlgorithmSummary | None = None
    mb_up: float | None = None
    mb_down: float | None = None
    uploads: Stat | None = None  # client uploads to the target (None: no target or no upload counts)
    command: str = ""


def collect(suite: Suite, profile: str, results_dir: Path, stored: bool = False) -> dict[tuple[str, str], Cell]:
    """(setting id, algorithm id) -> its finished runs of ``profile`` (none: absent)."""
    cells: dict[tuple[str, str], Cell] = {}
    for run in plan(suite, profile, results_dir, stored=stored):
        if run.job.state != "done":
            continue
        cell = cells.setdefault((run.setting.id, run.entry.id), Cell([]))
        cell.runs.append(load_run(run.job.path))
        cell.command = "python system/main.py " + " ".join(_shown(run.job.argv))
    targets = {setting.id: setting.target for setting in suite.settings}
    for (sid, _), cell in cells.items():
        cell.summary = summarize_runs(cell.runs, avg_last=10, target_acc=targets[sid])
        cell.mb_up = _mean_per_round(cell.runs, "rs_bytes_up")
        cell.mb_down = _mean_per_round(cell.runs, "rs_bytes_down")
        if targets[sid] is not None:
            cell.uploads = _stat([uploads_to_target(r, targets[sid]) for r in cell.runs])
    return cells


def uploads_to_target(run: RunResult, target: float) -> float | None:
    """The client uploads of training rounds 0..r-1, r the first evaluated round at ``target`` (AdaFL's
    cost, the sum of m_r); NaN when no evaluation reaches it, None when the file has no upload counts."""
    clients = run.get("rs_clients_per_round")
    if clients is None:
        return None
    reached = reach_target(run.series["rs_test_acc"], run.eval_rounds, [], target)
    return np.nan if reached is None else float(np.sum(clients[:reached[0]]))


def _stat(values: list[float | None]) -> Stat | None:
    """Mean and population std over the finite values (count: how many); None when every value is None."""
    present = np.array([v for v in values if v is not None], dtype=float)
    if not present.size:
        return None
    finite = present[np.isfinite(present)]
    return Stat(float(finite.mean()), float(finite.std()), int(finite.size)) if finite.size else Stat(np.nan, np.nan, 0)


def _shown(argv: list[str]) -> list[str]:
    """A job's main.py argv as a user types it: repository-relative paths, the seed's own flags left out."""
    shown, skip = [], False
    for token in argv:
        if skip:
            skip = False
            continue
        if token in ("--resume", "-pv", "-t", "--num_threads", "--progress", "-q"):
            skip = token != "--resume"
            continue
        shown.append(os.path.relpath(token, ROOT) if token.startswith(str(ROOT)) else token)
    return shown


def _mean_per_round(runs: list[RunResult], key: str) -> float | None:
    """MB a training round of the series ``key``, mean over the runs."""
    totals = [float(np.sum(s)) / max(1, len(s)) for r in runs if (s := r.get(key)) is not None and s.size]
    return float(np.mean(totals)) / 1e6 if totals else None


def _pm(stat, percent: bool = True, digits: int = 2, signed: bool = False) -> str:
    if stat is None or not np.isfinite(stat.mean):
        return "–"
    scale = 100.0 if percent else 1.0
    return f"{scale * stat.mean:{'+' if signed else ''}.{digits}f} ± {scale * stat.std:.{digits}f}"


def _num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None or not np.isfinite(value) else f"{value:.{digits}f}"


def _to_target(stat: Stat | None, runs: int, digits: int) -> str:
    """A to-target figure: its mean over the runs that reach the target, (k/n) when only k of n do."""
    if stat is None:
        return "–"
    if not np.isfinite(stat.mean):
        return "not reached"
    text = f"{stat.mean:.{digits}f}"
    return text if stat.count == runs else f"{text} ({stat.count}/{runs})"


def seconds_per_round(cell: Cell, machines: dict[Path, str] | None = None) -> str:
    """The runs' mean wall seconds a round, with the intra-op threads they ran on where a run set
    ``--num_threads`` (``run --jobs N`` runs N at a time on one thread each; 0 is one per core), and
    the machines they ran on where ``machines`` (run file -> letter) names more than one."""
    stat = cell.summary.stats.get("s_per_round") if cell.summary else None
    text = _num(stat.mean if stat is not None else None)
    if text == "–":
        return text
    threads = sorted({int(r.config.get("num_threads") or 0) for r in cell.runs})
    notes = [] if threads == [0] else [
        "/".join("one per core" if t == 0 else str(t) for t in threads) + f" thread{'' if threads == [1] else 's'}"]
    if machines and len(set(machines.values())) > 1:
        notes.append("on " + "/".join(sorted({machines[r.path] for r in cell.runs})))
    return f"{text} ({', '.join(notes)})" if notes else text


def seeds_text(cell: Cell) -> str:
    """How many runs a row has, and which of them diverged (``--record_divergence``: their figures are
    those evaluated before the round that produced NaN/inf)."""
    rounds = [int(r.attrs["diverged_round"]) for r in cell.runs if r.diverged]
    if not rounds:
        return str(len(cell.runs))
    return f"{len(cell.runs)} ({len(rounds)} diverged, in round {'/'.join(map(str, sorted(rounds)))})"


def scored(cell: Cell) -> str:
    """Which model is scored over which clients, from the files themselves."""
    config = cell.runs[0].config
    model = "each client's own model" if cell.summary and cell.summary.personalized else "the global model"
    gap = int(config.get("eval_gap", 1))
    return (f"{model}, on all {config.get('num_clients', '?')} clients' test data, "
            + ("after every round" if gap == 1 else f"every {gap} rounds"))


def render_profile(suite: Suite, profile: str, cells: dict[tuple[str, str], Cell],
                   machines: dict[Path, str] | None = None) -> list[str]:
    flags = suite.profiles[profile]
    changed = ", ".join(f"`{k} = {v}`" for k, v in flags.items()) or "none"
    tag = "" if profile == "full" else f" ({profile})"
    lines = [f"## Profile `{profile}`", "",
             f"Overrides of `[flags]`: {changed}." + ("" if profile == "full" else
             f" Every number in this section is of the `{profile}` profile, not the published setting."), ""]
    metric = METRICS[suite.metric]
    shown = {**SHOWN, metric: FIGURE_HEADERS[metric]}  # the metric's figure is always a column
    for setting in suite.settings:
        reached = setting.target is not None  # the to-target columns: only a setting with a target has them
        target = f" to {100 * setting.target:.0f}%" if reached else ""
        rows = [(entry, cells.get((setting.id, entry.id))) for entry in suite.algorithms]
        if not any(cell for _, cell in rows):
            continue
        header = ["algorithm", "seeds", *[f"{h}{tag}" for h in shown.values()], "reference", "difference",
                  f"last 10 gain{tag}", *([f"rounds{target}", f"uploads{target}", f"virtual s{target}"] if reached
                                          else []), "s/round", "MB up / down a round", "scored"]
        lines += [f"### {setting.label}{tag}", "", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
        for entry, cell in rows:
            reference = suite.reference.get(setting.id, {}).get(entry.id)
            ref_text = "–" if reference is None else f"{reference:.2f}"
            if cell is None:
                row = [entry.id, "0", "not run", *[""] * (len(shown) - 1), ref_text]
                lines.append("| " + " | ".join(row + [""] * (len(header) - len(row))) + " |")
                continue
            s = cell.summary
            ours = s.stats.get(metric)
            diff = "–" if reference is None or ours is None else f"{100 * ours.mean - reference:+.2f}"
            to_target = [_to_target(s.stats.get("rounds_to_target"), s.n_runs, 1),
                         _to_target(cell.uploads, s.n_runs, 0),
                         _to_target(s.stats.get("virtual_to_target"), s.n_runs, 1)] if reached else []
            row = [entry.id, seeds_text(cell), *[_pm(s.stats.get(key)) for key in shown], ref_text, diff,
                   _pm(s.stats.get("gain_last_n"), signed=True), *to_target, seconds_per_round(cell, machines),
                   f"{_num(cell.mb_up, 3)} / {_num(cell.mb_down, 3)}", scored(cell)]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    commands = [f"    {cells[key].command}" for key in cells]
    if commands:
        lines += ["<details><summary>the main.py command of every row (seed r: add <code>-pv r -t r+1</code>)"
                  "</summary>", "", *commands, "", "</details>", ""]
    return lines


def published_lines(suite: Suite) -> list[str]:
    """The reference column of every setting, run or not: an algorithm a row, a setting a column."""
    settings = [s for s in suite.settings if suite.reference.get(s.id)]
    if not settings:
        return []
    lines = ["## Published figures", "",
             f"The reference figures (percent, compared with *{FIGURE_HEADERS[METRICS[suite.metric]]}*), from "
             "the source above; each profile's tables below set them beside the runs of their setting.", "",
             "| algorithm | " + " | ".join(s.id for s in settings) + " |", "|---" * (len(settings) + 1) + "|"]
    for entry in suite.algorithms:
        values = [suite.reference[s.id].get(entry.id) for s in settings]
        if any(v is not None for v in values):
            lines.append(f"| {entry.id} | " + " | ".join("–" if v is None else f"{v:.2f}" for v in values) + " |")
    return [*lines, ""]


def machines_of(*folders: Path) -> dict[str, Any]:
    """host -> its record, from the ``machines.json`` of each folder that has one (later folders win)."""
    machines: dict[str, Any] = {}
    for folder in folders:
        path = folder / "machines.json"
        if path.is_file():
            machines.update(json.loads(path.read_text()))
    return machines


def _described(m: dict[str, Any]) -> str:
    return (f"{m.get('cpu')} ({m.get('cores')} cores{', ' + m['gpu'] if m.get('gpu') else ''}), "
            f"{m.get('os')}; Python {m.get('python')}, torch {m.get('torch')}, numpy {m.get('numpy')}")


def machine_labels(runs: list[RunResult], *folders: Path) -> tuple[dict[Path, str], list[str]]:
    """Each run's machine as a letter, and the page's lines naming them. A run's machine is its
    file's own record (attribute ``machine``); a file without one is taken to come from the machine
    of the folders' ``machines.json`` when that names a single one (else ``?``)."""
    hosts = machines_of(*folders)
    fallback = json.dumps(next(iter(hosts.values())), sort_keys=True) if len(hosts) == 1 else None
    keys: dict[Path, str | None] = {}
    for run in runs:
        own = run.attrs.get("machine")
        keys[run.path] = json.dumps(json.loads(own), sort_keys=True) if own else fallback
    letters: dict[str, str] = {}
    for key in keys.values():
        if key is not None and key not in letters:
            letters[key] = chr(ord("A") + len(letters)) if len(letters) < 26 else f"M{len(letters) + 1}"
    labels = {path: letters[key] if key is not None else "?" for path, key in keys.items()}
    count = {label: sum(1 for v in labels.values() if v == label) for label in set(labels.values())}
    lines = [f"- `{letter}` ({count[letter]} run{'s' * (count[letter] != 1)}): {_described(json.loads(key))}"
             for key, letter in letters.items()]
    if "?" in count:
        lines.append(f"- `?` ({count['?']} run{'s' * (count['?'] != 1)}): no machine record in the result file "
                     + (f"and several in machines.json ({', '.join(sorted(hosts))})" if hosts else "or beside it"))
    return labels, lines or ["No finished run."]


def _shown_path(path: Path) -> str:
    """A path as a page shows it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def page_rows(lines: Sequence[str]) -> dict[tuple[str, str, str], int]:
    """The seeds behind each row of a rendered page's tables, keyed (profile, setting, algorithm)."""
    rows: dict[tuple[str, str, str], int] = {}
    profile = heading = None
    for line in lines:
        if line.startswith("## "):
            profile = line.split("`")[1] if line.startswith("## Profile `") else None
            heading = None
        elif line.startswith("### "):
            heading = line[4:]
        elif profile and heading and line.startswith("| "):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            seeds = re.match(r"\d+", cells[1]) if len(cells) > 1 else None  # "3", or "3 (1 diverged, ...)"
            if seeds:
                rows[(profile, heading, cells[0])] = int(seeds.group())
    return rows


def dropped_rows(page: Path, lines: Sequence[str]) -> list[str]:
    """The rows of the page already at ``page`` that ``lines`` would show with fewer seeds or not at all."""
    if not page.is_file():
        return []
    new = page_rows(lines)
    return [f"{heading} / {algorithm} ({seeds} seed{'s' * (seeds > 1)} -> {new.get((profile, heading, algorithm), 0)}"
            f", profile {profile})" for (profile, heading, algorithm), seeds in
            page_rows(page.read_text().splitlines()).items() if seeds > new.get((profile, heading, algorithm), 0)]


def render(suite: Suite, results_dir: Path, out_dir: Path, stored: bool = True, drop: bool = False) -> Path:
    """Write ``<out_dir>/<suite>.md`` (and a figure per profile with results); returns the page.
    With ``stored``, the suite's stored runs count where ``results_dir`` has no run of their own.
    A page already there is not replaced by one showing fewer runs of any row (their files are
    elsewhere: result files are not in git) unless ``drop``."""
    rel = os.path.relpath(suite.path.resolve(), ROOT)
    runs = [f"python system/suite.py run {rel}" + ("" if p == "full" else f" --profile {p}") for p in suite.profiles]
    lines = [f"# {suite.title}", "", suite.about, "", f"Source of the setting and the reference column: {suite.source}", "",
             "## Commands", "", "```", *runs, f"python system/suite.py render {rel}", "```", "",
             "The data (one generator call per setting):", "", "```",
             *[" ".join(["python", f"dataset/generate_{s.generator}.py", *s.generate, "--out-dir",
                         os.path.relpath(suite.data_dir(s), ROOT)])
               + ("" if s.profiles is None else f"   # profile {', '.join(s.profiles)}") for s in suite.settings],
             "```", "",
             f"Seeds: {suite.seeds} (seed, seed + 1, ...); each figure is the mean ± population std over them. "
             "*best*: the highest test accuracy of a run over all its evaluations; *last*: the accuracy after the last "
             "round; *mean of last 10*: the mean of the last 10 evaluations of trained models"
             + ("; *mean of last 10%*: the mean of the last 10% of them (at least one)" if suite.metric == "last10pct"
                else "") + ". "
             f"The reference column is compared with *{FIGURE_HEADERS[METRICS[suite.metric]]}*. *last 10 gain*: the mean of "
             "the last 10 evaluations minus the mean of the 10 before them, in points (– under 20 evaluations): about 0 "
             "where the runs had converged when they stopped, a gain where they were still learning (then a difference "
             "from a reference that ran more rounds is in part the rounds). "
             + ("*rounds*, *uploads*, *virtual s* to a target: the first evaluated round at the target, the models the "
                "clients sent in the training rounds before it, the virtual clock's reading then. "
                if any(setting.target is not None for setting in suite.settings) else "")
             + "*s/round*: wall seconds a round on the machine under Machines (named beside the figure where the "
             "page's runs come from several), with the intra-op threads of the run where it set them (`run --jobs N` runs N at a time, one thread each); *MB up / down a round*: all "
             "clients' traffic per training round.", ""]
    if suite.notes:
        lines += [*[f"- {note}" for note in suite.notes], ""]
    lines += published_lines(suite)
    stored = stored and suite.stored_dir.is_dir()
    if stored:
        lines += [f"The result files behind every number below were stored in `{_shown_path(suite.stored_dir)}/` "
                  "where this page was rendered (h5, not in git; `python system/summarize.py` and `python "
                  "system/report.py` read them); `run` counts them as done (`--no-stored` reruns them).", ""]
    profiles = {profile: cells for profile in suite.profiles if (cells := collect(suite, profile, results_dir, stored))}
    if not profiles:
        raise FLError(f"{suite.path}: no finished run in {results_dir}; run it first: python system/suite.py run {rel}")
    runs = [run for cells in profiles.values() for cell in cells.values() for run in cell.runs]
    machines, machine_lines = machine_labels(runs, *([suite.stored_dir] if stored else []), results_dir)
    lines += ["## Machines", "", *machine_lines, ""]
    for profile, cells in profiles.items():
        lines += render_profile(suite, profile, cells, machines)
        lines += [f"![test accuracy over rounds, profile {profile}]({suite.name}-{profile}.png)", ""]
        if any(run.diverged for cell in cells.values() for run in cell.runs):
            lines += ["Each line is the mean over a row's runs, dashed where only some of them go on (the others "
                      "diverged earlier); an x marks a run's last evaluation before it diverged.", ""]
    page = out_dir / f"{suite.name}.md"
    if not drop and (lost := dropped_rows(page, lines)):
        raise FLError(f"{_shown_path(page)} shows runs whose result files are in neither {_shown_path(results_dir)} nor "
                      f"{_shown_path(suite.stored_dir)}: {'; '.join(lost[:3])}" + (f"; and {len(lost) - 3} more"
                      if len(lost) > 3 else "") + "; copy their h5 files there (or rerun them), or pass --drop "
                      "to write the page without them")
    out_dir.mkdir(parents=True, exist_ok=True)
    for profile, cells in profiles.items():
        draw(suite, profile, cells, out_dir / f"{suite.name}-{profile}.png")
    page.write_text("\n".join(lines).rstrip() + "\n")
    return page


def mean_curve(cell: Cell) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rounds of the cell's longest run, the mean test accuracy at each over the runs that have
    that evaluation, and how many runs that is (a diverged run stops early: the mean goes on over
    the runs still going)."""
    longest = max(cell.runs, key=lambda r: r.n_evals)
    sums, counts = np.zeros(longest.n_evals), np.zeros(longest.n_evals, dtype=int)
    for run in cell.runs:
        sums[:run.n_evals] += run.series["rs_test_acc"][:run.n_evals]
        counts[:run.n_evals] += 1
    return np.asarray(longest.eval_rounds[:longest.n_evals]), sums / counts, counts


def draw(suite: Suite, profile: str, cells: dict[tuple[str, str], Cell], path: Path) -> Path:
    """Mean test accuracy over rounds, one panel per setting, one line per algorithm: solid while
    every run of the row has the evaluation, dashed where only some do (the others diverged before);
    an x where a run diverged (its last evaluation before the NaN/inf)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [s for s in suite.settings if any((s.id, e.id) in cells for e in suite.algorithms)]
    cols = min(3, len(shown))
    rows = -(-len(shown) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, setting in zip(axes.flat, shown):
        for entry in suite.algorithms:
            cell = cells.get((setting.id, entry.id))
            if cell is None:
                continue
            rounds, acc, counts = mean_curve(cell)
            every = int(np.sum(counts == len(cell.runs)))
            (line,) = ax.plot(rounds[:every], 100 * acc[:every], label=entry.id, linewidth=1.2)
            if every < len(rounds):  # from the last evaluation of all runs on, over the runs still going
                ax.plot(rounds[every - 1:], 100 * acc[every - 1:], "--", color=line.get_color(), linewidth=1.0)
            for run in (r for r in cell.runs if r.diverged):  # x: its last evaluation before the NaN/inf
                ax.plot(run.eval_rounds[-1], 100 * run.series["rs_test_acc"][-1], "x", color=line.get_color())
        ax.set_title(textwrap.fill(setting.label, 48), fontsize=8)
        ax.set_xlabel("round", fontsize=8)
        ax.set_ylabel("test accuracy (%)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(textwrap.fill(f"{suite.title} (profile {profile})", width=50 * cols), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------
# What is done and what is left
# --------------------------------------------------------------------------------------------

def _seconds_a_round(path: Path) -> float | None:
    times = load_run(path).series.get("rs_round_time")
    return float(np.mean(times)) if times is not None and len(times) else None


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def show_status(suite: Suite, profiles: Sequence[str], results_dir: Path, stored: bool = True) -> int:
    """Print, per profile, each (setting, algorithm)'s finished seeds, the runs that failed or
    conflict, and what the runs left would take one at a time, estimated from the seconds a round
    of the finished runs (the same setting and algorithm, else the same algorithm, else the same
    setting, else any). Nothing runs."""
    for profile in profiles:
        runs = plan(suite, profile, results_dir, stored=stored)
        timed: dict[tuple[str, str], list[float]] = {}
        for run in runs:
            if run.job.state == "done" and (seconds := _seconds_a_round(run.job.path)) is not None:
                timed.setdefault((run.setting.id, run.entry.id), []).append(seconds)

        def estimate(run: Planned) -> float | None:
            for match in (lambda k: k == (run.setting.id, run.entry.id), lambda k: k[1] == run.entry.id,
                          lambda k: k[0] == run.setting.id, lambda k: True):
                values = [v for key, seconds in timed.items() if match(key) for v in seconds]
                if values:
                    return float(np.mean(values)) * int(run.job.settings.get("global_rounds") or 0)
            return None

        done = [r for r in runs if r.job.state == "done"]
        todo = [r for r in runs if r.job.state == "todo"]
        bad = [r for r in runs if r.job.state not in ("todo", "done")]
        print(f"{suite.name} ({profile}): {len(done)} of {len(runs)} runs done"
              + (f" ({sum((suite.stored_dir / r.job.path.name).is_file() for r in done)} of them stored in "
                 f"{_shown_path(suite.stored_dir)})" if stored else "")
              + f", {len(todo)} to run" + (f", {len(bad)} failed or in conflict" if bad else ""))
        settings = [s.id for s in suite.settings_of(profile)]
        algorithms = [e.id for e in suite.algorithms]
        count = {}
        for run in runs:
            done_, total, flagged = count.get((run.setting.id, run.entry.id), (0, 0, ""))
            count[(run.setting.id, run.entry.id)] = (done_ + (run.job.state == "done"), total + 1,
                                                     flagged or "!" * (run.job.state not in ("todo", "done")))
        by_algorithm = len(algorithms) > len(settings)  # the longer list down the side
        rows, cols = (algorithms, settings) if by_algorithm else (settings, algorithms)
        width = max(map(len, rows))
        print("  " + " " * width + "  " + "  ".join(cols))
        for row in rows:
            cells = []
            for col in cols:
                d, t, flagged = count[(col, row) if by_algorithm else (row, col)]
                cells.append(f"{d}/{t}{flagged}".ljust(len(col)))
            print(f"  {row.ljust(width)}  " + "  ".join(cells).rstrip())
        for run in bad:
            print(f"  {run.key}: {run.job.state}")
        if todo:
            left = [estimate(run) for run in todo]
            if all(v is None for v in left):
                print("  left: no finished run to estimate the time from")
            else:
                unknown = sum(v is None for v in left)
                print(f"  left: about {_duration(sum(v for v in left if v is not None))} one run at a time, "
                      "at the finished runs' seconds a round "
                      f"where they ran{f' ({unknown} runs not estimated)' if unknown else ''}; "
                      f"run --jobs N on N cores or --shard i/n on n machines divides it")
    return 0


# --------------------------------------------------------------------------------------------
# Keeping the runs behind a page
# --------------------------------------------------------------------------------------------

def store(suite: Suite, results_dir: Path, replace: bool = False) -> int:
    """Copy every finished run of every profile from ``results_dir`` into the suite's stored runs,
    with the machines that made them. A stored file that differs from the new run is kept unless
    ``replace`` (one line names them)."""
    target = suite.stored_dir
    if target.resolve() == results_dir.resolve():
        raise FLError(f"--results_dir {results_dir} is the stored runs' folder itself; store copies from another")
    copied, same, differ = 0, 0, []
    for profile in suite.profiles:
        for run in plan(suite, profile, results_dir):
            if run.job.state != "done":
                continue
            dest = target / run.job.path.name
            if dest.is_file() and filecmp.cmp(run.job.path, dest, shallow=False):
                same += 1
                continue
            if dest.is_file() and not replace:
                differ.append(run.key)
                continue
            write_atomically(dest, lambda tmp, source=run.job.path: shutil.copyfile(source, tmp))
            copied += 1
    if not copied and not same and not differ:
        raise FLError(f"{suite.path}: no finished run in {results_dir}; run it first: python system/suite.py run {suite.path}")
    if copied:
        write_machines(target, machines_of(target, results_dir))
    print(f"{PROG}: stored {copied} run(s) in {_shown_path(target)}, {same} there already")
    if differ:
        print(f"{PROG}: {len(differ)} run(s) differ from the stored ones and were left alone "
              f"({', '.join(differ[:3])}{', ...' if len(differ) > 3 else ''}); --replace stores the new ones",
              file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------------------------------
# Checking stored curves
# --------------------------------------------------------------------------------------------

def curves(suite: Suite, results_dir: Path) -> dict[str, list[float]]:
    """``setting/algorithm/seed`` -> test accuracy at every evaluation, of profile full."""
    out = {}
    for run in plan(suite, "full", results_dir):
        if run.job.state != "done":
            raise FLError(f"{run.key}: no finished run in {results_dir} ({run.job.state}); "
                          f"run python system/suite.py run {suite.path} first")
        out[run.key] = [round(float(a), 6) for a in load_run(run.job.path).series["rs_test_acc"]]
    return out


def check(suite: Suite, results_dir: Path, update: bool = False) -> int:
    """Compare the runs' curves with the stored ones (``[check] curves``) within ``tolerance``;
    ``update`` writes the current curves there instead."""
    if suite.check is None:
        raise FLError(f"{suite.path}: no [check] table (curves, tolerance)")
    stored_path = suite.path.parent / suite.check["curves"]
    now = curves(suite, results_dir)
    if update:
        rows = ",\n".join(f"  {json.dumps(key)}: {json.dumps(values)}" for key, values in now.items())
        stored_path.write_text(f'{{"curves": {{\n{rows}\n}}}}\n')
        print(f"{PROG}: wrote {len(now)} curves to {stored_path}")
        return 0
    if not stored_path.is_file():
        raise FLError(f"{stored_path}: no stored curves; write them with python system/suite.py check {suite.path} --update")
    stored = json.loads(stored_path.read_text())["curves"]
    tolerance = float(suite.check["tolerance"])
    moved = []
    for key in sorted(set(now) | set(stored)):
        if key not in stored or key not in now:
            moved.append(f"{key}: {'new, not stored' if key not in stored else 'stored, not run'}")
            continue
        a, b = now[key], stored[key]
        if len(a) != len(b):
            moved.append(f"{key}: {len(a)} evaluations, stored {len(b)}")
            continue
        for i, (x, y) in enumerate(zip(a, b)):
            if abs(x - y) > tolerance:
                moved.append(f"{key}: accuracy at evaluation {i} is {x:.4f}, stored {y:.4f} (tolerance {tolerance})")
                break
    if moved:
        for line in moved:
            print(f"{PROG}: changed: {line}", file=sys.stderr)
        print(f"{PROG}: {len(moved)} curve(s) moved beyond the tolerance; if the change is intended, store the new "
              f"curves in the same commit: python system/suite.py check {suite.path} --update", file=sys.stderr)
        return 1
    print(f"{PROG}: {len(now)} curves within {tolerance} of {stored_path.name}")
    return 0


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n", 1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("run", "run the suite's runs that are not done"), ("render", "write docs/results/<suite>.md"),
                       ("check", "compare the runs' curves with the stored ones"),
                       ("store", "keep the finished runs in runs/<suite>/ beside the suite file"),
                       ("status", "what is done, what failed and what is left, with the time it would take")):
        sub = commands.add_parser(name, help=text, allow_abbrev=False)
        sub.add_argument("suite", help="the suite file, e.g. suites/niid_bench.toml")
        sub.add_argument("--results_dir", "--results-dir", default=None,
                         help="where the suite's results are (default results/<suite>)")
        sub.add_argument("--data_dir", "--data-dir", default=None,
                         help="where the suite's data folders are (default dataset/)")
        if name in ("run", "render", "status"):
            sub.add_argument("--no-stored", "--no_stored", dest="stored", action="store_false",
                             help="ignore the runs kept in runs/<suite>/ beside the suite file")
        if name == "store":
            sub.add_argument("--replace", action="store_true", help="replace stored runs that differ from the new ones")
        if name == "run":
            sub.add_argument("--profile", default="full", help="the profile to run (default full)")
            sub.add_argument("--shard", default=None, metavar="i/n", help="run every n-th run from the i-th")
            sub.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
            sub.add_argument("--raw-dir", "--raw_dir", action="append", default=[], metavar="NAME=DIR",
                             help="raw files of dataset NAME (its generator's --raw-dir), instead of the download")
            sub.add_argument("--only", action="append", default=[], metavar="PATTERN",
                             help="only the runs whose SETTING/ALGORITHM/SEED matches (shell pattern, e.g. 'MNIST-*/FedAvg/0')")
            sub.add_argument("--check", action="store_true", help="then compare with the stored curves (check)")
        if name == "status":
            sub.add_argument("--profile", action="append", default=None,
                             help="only this profile (repeatable; default every profile)")
        if name == "render":
            sub.add_argument("--out", default=str(ROOT / "docs" / "results"), help="page folder (default docs/results)")
            sub.add_argument("--drop", action="store_true",
                             help="replace the page even where it would show fewer runs of a row than the page there")
        if name == "check":
            sub.add_argument("--update", action="store_true", help="store the current curves instead")
    return parser


def raw_dirs_of(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            raise FLError(f"--raw-dir {item!r}: write NAME=DIR, e.g. --raw-dir MNIST=/data/mnist")
        out[name] = folder
    return out


def command(args: argparse.Namespace) -> int:
    """The exit status of one parsed command (errors raise FLError)."""
    suite = load_suite(args.suite)
    results_dir = Path(args.results_dir) if args.results_dir else ROOT / "results" / suite.name
    if args.data_dir:
        suite.data_root = Path(args.data_dir).resolve()
    if args.command == "run":
        if args.jobs < 1:
            raise FLError("--jobs must be >= 1")
        # --check compares the runs made here, so stored runs do not stand in for them
        status = run_suite(suite, args.profile, results_dir, args.shard, args.jobs, raw_dirs_of(args.raw_dir),
                           args.only, args.stored and not args.check)
        return status or (check(suite, results_dir) if args.check else 0)
    if args.command == "render":
        print(f"{PROG}: wrote {render(suite, results_dir, Path(args.out), args.stored, args.drop)}")
        return 0
    if args.command == "store":
        return store(suite, results_dir, args.replace)
    if args.command == "status":
        for profile in args.profile or []:
            profile_flags(suite, profile)  # an unknown profile: one line, before anything is printed
        return show_status(suite, args.profile or list(suite.profiles), results_dir, args.stored)
    return check(suite, results_dir, args.update)


def main_cli(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    status = []
    try:
        failed = one_line_errors(PROG, lambda: status.append(command(args)))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; finished runs are kept, rerun the same command to continue", file=sys.stderr)
        return 130
    return failed or status[0]


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, sweep._interrupt)  # `kill` stops the runs as Ctrl-C does
    sys.exit(main_cli())
