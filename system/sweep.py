"""Run ``main.py`` over a grid (or a list) of settings, several processes at a time, then summarise.

Run from ``system/``::

    python sweep.py -data FMNIST -m CNN -gr 60 -algo FedACS Local \\
        --grid fedacs_p=0.1,0.3,0.5,0.7,0.9 -lr 0.01,0.05 -t 3 --jobs 2

Every flag of ``main.py`` may be given; a value with commas (``-lr 0.01,0.05``, or
``--grid KEY=V1,V2`` for any flag, spelled ``lr``, ``-lr`` or ``local_learning_rate``) is an axis
of the sweep. Axes are crossed (a grid); with ``--zip`` they are paired element by element (a
list of settings, all axes of the same length). ``-algo`` takes several names; a flag only some
of them declare (``--fedacs_p``) applies to those, so Local above runs 2 settings, not 10.

Each (algorithm, setting, repeat) is one ``main.py`` process (``-pv r -t r+1``: repeat ``r`` uses
seed ``seed + r``, the file a ``-t`` run would write) with ``--num_threads`` = cores // ``--jobs``
unless given, so parallel jobs do not oversubscribe the cores. A setting's goal (``-go``) is the
base goal followed by the values of the axes it varies, e.g. ``sweep-fedacs_p=0.1-lr=0.01``, so
its files are ``results/<dataset>_<algo>_<goal>_<run>.h5``. A file that already exists is not
rerun when its stored configuration matches the job (an interrupted sweep continues where it
stopped); one made with other settings is reported as a conflict and left alone. A failed run is
reported with the last line of its error output (the whole output goes to
``<results>/sweep-logs/``) and the sweep goes on. Ctrl-C (or SIGTERM) stops a sweep as it stops one
run: every running ``main.py`` gets one SIGTERM, finishes the round it is in, writes its checkpoint
and exits, and the sweep waits for them however long a round takes; the same command then resumes
each from its checkpoint. A second Ctrl-C stops them at once, losing what they trained since their
last checkpoint. Each run is in a process group of its own, so a terminal's Ctrl-C reaches it only
through the sweep (once, not twice: a second signal would stop it unsaved).

At the end, the summary table that ``plot.py`` and ``summarize.py`` print
(:func:`reporting.stats.summarize_runs`: best, final and tail-mean accuracy, seconds per round,
memory, ... as mean ± population std over the repeats) is printed for every setting, then for
the best setting of each algorithm (``--rank_by best`` or ``final`` mean accuracy); when the
sweep varies ``--attack``, the best setting of each algorithm under each attack (an attack ×
defence grid ranks the defences within each attack, never across attacks).
Exit status: 0, 1 when a run failed or conflicted, 2 on a bad command line, 130 when interrupted.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

SYSTEM = Path(__file__).resolve().parent
MAIN_SCRIPT = SYSTEM / "main.py"
if str(SYSTEM) not in sys.path:  # also importable from the tests and from another directory
    sys.path.insert(0, str(SYSTEM))

import main  # noqa: E402
from runner.checkpoint import RESUMABLE_FLAGS  # noqa: E402
from cli.flags import IGNORED_DEST  # noqa: E402
from utils.errors import FLError  # noqa: E402
from reporting.loading import load_run  # noqa: E402
from reporting.stats import AlgorithmSummary, summarize_runs  # noqa: E402
from reporting.tables import format_summary_table  # noqa: E402
from reporting.results import result_path  # noqa: E402
from runner.checkpoint import checkpoint_path  # noqa: E402
from runner.run_control import is_finished  # noqa: E402

PROG = "sweep.py"
# Flags whose values are free text that may hold commas (device lists, paths): never split into axes.
LITERAL_DESTS = frozenset({"device_id", "results_dir", "data_root", "state_dir", "save_folder_name", "tensorboard"})
# Settings that say how a run is executed or reported, not what it computes: a stored result made
# with other values of these is still the same experiment (engines and layouts agree up to float
# rounding, see docs/architecture.md): the flags a --resume may change, and where and how it runs.
RUN_ONLY_DESTS = RESUMABLE_FLAGS | frozenset({
    "save_folder_name", "device", "device_id", "engine", "state_device", "state_dir",
    "eval_batch_size", "eval_frozen", "conv_layout", "compact_inputs", "num_clients", "num_classes", "goal",
})

@dataclass
class Axis:
    """One swept flag: the flag as typed (``-lr``, ``--fedacs_p``, or a --grid key) and its values."""

    key: str
    values: list[str | None]


#: the state of a job whose file holds an unfinished run without a checkpoint (it diverged or failed):
#: ``--resume`` refuses it, so it is listed, not run, and needs ``--overwrite`` by hand
FAILED = "failed; needs --overwrite"


@dataclass
class Job:
    """One ``main.py`` process: one repeat of one setting of one algorithm."""

    algorithm: str
    label: str            # the varied settings, e.g. "fedacs_p=0.1 lr=0.01" ("" when nothing varies)
    run: int
    argv: list[str]       # main.py's arguments
    path: Path            # the result file it writes
    settings: dict[str, Any]  # main's parsed namespace (repeat-independent part)
    state: str = "todo"   # "todo", "done" (its file exists with these settings), FAILED or "conflict: why"

    @property
    def name(self) -> str:
        return f"{self.algorithm}{' ' + self.label if self.label else ''} run {self.run}"


def own_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n", 1)[0],
        epilog="Every other flag goes to main.py (see `python main.py -h`); a value with commas is a "
               "sweep axis.\nExample: python sweep.py -data FMNIST -algo FedACS Local --grid "
               "fedacs_p=0.1,0.5,0.9 -lr 0.01,0.05 -t 3 --jobs 2",
    )
    parser.add_argument("-algo", "--algorithm", nargs="+", default=["FedAvg"], help="algorithms to run")
    parser.add_argument("--grid", nargs="+", default=[], metavar="KEY=V1,V2",
                        help="axes over any main.py flag (KEY as lr, -lr or local_learning_rate)")
    parser.add_argument("--zip", action="store_true",
                        help="pair the axes element by element (a list of settings) instead of crossing them")
    parser.add_argument("-t", "--times", type=int, default=1, help="repeats per setting (seeds seed+0..t-1)")
    parser.add_argument("-go", "--goal", default="sweep", help="base of every setting's goal (-go)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--threads", type=int, default=None,
                        help="--num_threads of each run (default: cores // --jobs, at least 1)")
    parser.add_argument("--rank_by", "--rank-by", choices=["best", "final"], default="best",
                        help="mean accuracy that picks each algorithm's best setting")
    parser.add_argument("--dry_run", "--dry-run", action="store_true", help="print the jobs and their state, run nothing")
    return parser


OWN_FLAGS = frozenset(s for a in own_parser()._actions for s in a.option_strings)


def is_flag(token: str) -> bool:
    """``-lr``/``--grid`` are flags, ``-0.5`` and ``-1e-3`` are (negative) values."""
    return token.startswith("-") and len(token) > 1 and not re.fullmatch(r"-[\d.]+([eE][-+]?\d+)?", token)


def split_command_line(argv: Sequence[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The sweep's own tokens, and main.py's flags each with the values that follow it.

    Own flags are found by exact match, not by argparse prefixes: ``-tc 5`` is main's flag, not
    ``-t c``. ``--flag=value`` is read as ``--flag value``."""
    own: list[str] = []
    passed: list[tuple[str, list[str]]] = []
    target: list[str] | None = None
    for token in argv:
        if is_flag(token):
            flag, sep, value = token.partition("=")
            if flag in OWN_FLAGS or flag in ("-h", "--help"):
                own.append(flag)
                target = own
            else:
                passed.append((flag, []))
                target = passed[-1][1]
            if sep:
                target.append(value)
        elif target is None:
            raise FLError(f"unexpected argument {token!r} before any flag")
        else:
            target.append(token)
    return own, passed


class _ParserCache:
    """main.py's parser for a job's argv, built once per (algorithm, --select, --engine)."""

    def __init__(self) -> None:
        self._parsers: dict[tuple[str, str, str], argparse.ArgumentParser] = {}

    def get(self, argv: list[str]) -> argparse.ArgumentParser:
        probe = main._probe(argv)
        key = (probe.algorithm, probe.select, probe.engine)
        if key not in self._parsers:
            self._parsers[key] = main.build_parser(argv)
        return self._parsers[key]


def find_action(parser: argparse.ArgumentParser, key: str) -> argparse.Action | None:
    """The action of ``key`` as typed (``-lr``, ``lr``, ``--fedacs_p``, ``fedacs_p``,
    ``local_learning_rate``) when the parser's algorithm uses it. main.py also accepts every other
    algorithm's flags and ignores them; those count as absent, so a sweep does not run an
    algorithm once per value of a flag it ignores."""
    candidates = [key] if key.startswith("-") else [f"--{key}", f"-{key}"]
    for candidate in candidates:
        action = parser._option_string_actions.get(candidate)
        if action is not None:
            return None if action.dest == IGNORED_DEST else action
    return None


def short_name(action: argparse.Action) -> str:
    """The shortest underscore spelling of a flag without dashes: ``lr``, ``fedacs_p``."""
    names = [s.lstrip("-") for s in action.option_strings]
    return min(names, key=lambda n: ("-" in n, len(n)))


def parse_main_argv(argv: list[str], what: str) -> argparse.Namespace:
    """main.py's validation of one job's flags; its error as one line naming the job."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return main.parse_args(argv)
    except SystemExit:
        lines = [line for line in captured.getvalue().splitlines() if line.strip()]
        raise FLError(f"{what}: {lines[-1] if lines else 'main.py rejected the flags'}") from None
    except FLError as exc:
        raise FLError(f"{what}: {exc}") from None


def goal_value(value: Any) -> str:
    """A parsed value as it appears in a goal (parsed, so 0.10 and 0.1 are one setting); characters
    unsafe in file names become ``~``, with a hash of the value so that distinct values stay distinct."""
    text = str(value)
    safe = re.sub(r"[^A-Za-z0-9._+-]", "~", text)
    return safe if safe == text else f"{safe}~{hashlib.sha1(text.encode()).hexdigest()[:6]}"


def settings_points(axes: list[Axis], zipped: bool) -> list[tuple[tuple[str, str | None], ...]]:
    """Every combination of the axes' values, or with ``zipped`` the element-wise pairs of the
    swept axes (one-value axes, the fixed flags, join every pair)."""
    if not zipped:
        return [tuple(zip([a.key for a in axes], combo)) for combo in itertools.product(*(a.values for a in axes))]
    lengths = {len(a.values) for a in axes if len(a.values) > 1}
    if len(lengths) > 1:
        raise FLError("--zip needs swept flags with the same number of values; got "
                      + ", ".join(f"{a.key} ({len(a.values)})" for a in axes if len(a.values) > 1))
    count = lengths.pop() if lengths else 1
    return [tuple((a.key, a.values[i if len(a.values) > 1 else 0]) for a in axes) for i in range(count)]


def read_axes(own: argparse.Namespace, passed: list[tuple[str, list[str]]]) -> list[Axis]:
    """main.py's flags in the order given: a fixed flag is an axis of one value (None for a bare
    boolean flag such as ``-ab``), a comma-separated value or a ``--grid`` item an axis of several."""
    axes: list[Axis] = []
    for flag, values in passed:
        if len(values) > 1:
            raise FLError(f"{flag} got {len(values)} values ({' '.join(values)}); separate a sweep's values with commas")
        axes.append(Axis(flag, [values[0] if values else None]))
    for item in own.grid:
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise FLError(f"--grid {item!r}: expected KEY=V1,V2,...")
        axes.append(Axis(key, values.split(",")))
    return axes


def split_commas(axes: list[Axis], parsers: list[argparse.ArgumentParser]) -> None:
    """A typed value with commas (``-lr 0.01,0.05``) becomes several; paths and device lists stay whole."""
    for axis in axes:
        value = axis.values[0]
        if len(axis.values) == 1 and value is not None and "," in value:
            actions = [a for p in parsers if (a := find_action(p, axis.key)) is not None]
            if not actions or actions[0].dest not in LITERAL_DESTS:
                axis.values = value.split(",")
        if any(v == "" for v in axis.values):
            raise FLError(f"{axis.key}: empty value in {','.join(map(str, axis.values))}")


def tokens(items: Sequence[tuple[str, str | None]]) -> list[str]:
    return [t for flag, value in items for t in ([flag] if value is None else [flag, value])]


def flag_token(key: str, action: argparse.Action) -> str:
    """The flag to pass main.py: the key as typed when it is a flag, else the action's first spelling."""
    return key if key.startswith("-") else action.option_strings[0]


def plan(argv: Sequence[str]) -> tuple[argparse.Namespace, list[Job]]:
    """Parse the sweep's command line and expand it into jobs, each marked "todo", "done" (its file
    exists with the same settings) or with a conflict note. Nothing runs and no data is read."""
    own_tokens, passed = split_command_line(argv)
    own = own_parser().parse_args(own_tokens)
    if own.times < 1 or own.jobs < 1 or (own.threads is not None and own.threads < 1):
        raise FLError("-t, --jobs and --threads must be >= 1")
    if not re.fullmatch(r"[A-Za-z0-9._+=-]+", own.goal):
        raise FLError(f"-go {own.goal!r}: use letters, digits and . _ + = - only (it is part of file names)")
    axes = read_axes(own, passed)
    cache = _ParserCache()
    algorithms = list(dict.fromkeys(own.algorithm))
    split_commas(axes, [cache.get(["-algo", algorithm]) for algorithm in algorithms])
    threads = own.threads or max(1, (os.cpu_count() or 1) // own.jobs)
    # The sweep's defaults come first so that the user's own --progress/--num_threads win.
    head = ["--progress", "False", "--num_threads", str(threads)]
    declared: set[str] = set()
    jobs: dict[Path, Job] = {}
    for algorithm in algorithms:
        settings: dict[tuple, list[tuple[str, argparse.Action, str | None]]] = {}
        for point in settings_points(axes, own.zip):
            probe = [(k if k.startswith("-") else f"--{k}", v) for k, v in point]  # finds --select/--engine
            parser = cache.get([*tokens(probe), "-algo", algorithm])
            applied = [(key, action, value) for key, value in point
                       if (action := find_action(parser, key)) is not None]
            declared.update(key for key, _, _ in applied)
            settings.setdefault(tuple((action.dest, value) for _, action, value in applied), applied)
        for applied in settings.values():
            for job in jobs_of_setting(own, algorithm, applied, axes, head):
                jobs.setdefault(job.path, job)
    unknown = [axis.key for axis in axes if axis.key not in declared]
    if unknown:
        raise FLError(f"{', '.join(unknown)}: not a flag that {' or '.join(algorithms)} use(s); main.py would "
                      f"ignore it (see python main.py -algo NAME -h)")
    return own, list(jobs.values())


def jobs_of_setting(own: argparse.Namespace, algorithm: str, applied: list[tuple[str, argparse.Action, str | None]],
                    axes: list[Axis], head: list[str]) -> list[Job]:
    """The ``-t`` repeats of one setting, with its goal derived from the values it varies."""
    for key, action, _ in applied:
        if action.dest in ("prev", "times", "goal", "algorithm"):
            raise FLError(f"{key}: the sweep sets it for every run; use the sweep's -t, -go or -algo")
    swept = {axis.key for axis in axes if len(axis.values) > 1}
    argv = [*head, *tokens([(flag_token(k, a), v) for k, a, v in applied]), "-algo", algorithm]
    described = " ".join(f"{k}={v}" for k, a, v in applied if k in swept)
    settings = parse_main_argv(argv, f"{algorithm} {described}".strip())
    parts = [f"{short_name(a)}={goal_value(getattr(settings, a.dest))}" for k, a, _ in applied if k in swept]
    goal = "-".join([own.goal, *parts])
    if len(goal) > 150:  # file names are limited to 255 bytes: long settings are named by a hash
        goal = f"{own.goal}-{hashlib.sha1(goal.encode()).hexdigest()[:12]}"
    settings.goal = goal
    argv += ["-go", goal]
    jobs = []
    for run in range(own.times):
        path = result_path(settings.dataset, settings.algorithm, goal, run, settings.results_dir)
        # --resume: a run the sweep's Ctrl-C interrupted continues from its checkpoint
        job = Job(settings.algorithm, " ".join(parts), run, [*argv, "--resume", "-pv", str(run), "-t", str(run + 1)],
                  path, vars(settings))
        if path.exists() and is_finished(path):
            job.state = stored_conflict(path, job) or "done"
        elif path.exists() and not checkpoint_path(path).exists():  # diverged or failed: --resume refuses it
            job.state = FAILED
        jobs.append(job)
    return jobs


def _as_json(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def stored_conflict(path: Path, job: Job) -> str | None:
    """Why an existing result file is not this job's run (None when it is)."""
    try:
        stored = load_run(path).config
    except FLError as exc:
        return f"conflict: {exc}"
    if not stored:
        return f"conflict: {path} holds no configuration to compare with"
    expected = dict(job.settings, seed=job.settings["seed"] + job.run, dataset=Path(job.settings["dataset"]).name)
    stored = dict(stored, dataset=Path(str(stored.get("dataset", ""))).name)
    for key, value in expected.items():
        if key in stored and key not in RUN_ONLY_DESTS and _as_json(value) != stored[key]:
            return (f"conflict: {path} was made with {key}={stored[key]!r}, this job has {value!r}; "
                    f"remove it or use another -go")
    return None


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------

class Runner:
    """Runs jobs as ``main.py`` processes, ``jobs`` at a time; remembers them to stop them on Ctrl-C."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._stopping = False

    def run(self, job: Job) -> tuple[int, str, float]:
        """Exit status, the last line of the error output, seconds."""
        started = time.perf_counter()
        with self._lock:
            if self._stopping:
                return 130, "not started: the sweep was interrupted", 0.0
            process = subprocess.Popen([sys.executable, str(MAIN_SCRIPT), *job.argv], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, start_new_session=True)
            self._running.add(process)
        out, err = process.communicate()
        with self._lock:
            self._running.discard(process)
        seconds = time.perf_counter() - started
        if process.returncode == 0:
            return 0, "", seconds
        if self._stopping:
            return process.returncode, "interrupted", seconds
        lines = [line for line in err.splitlines() if line.strip()]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / (job.path.stem + ".log")
        log.write_text(f"$ {sys.executable} {MAIN_SCRIPT} {' '.join(job.argv)}\n{out}\n--- stderr ---\n{err}")
        return process.returncode, f"{lines[-1] if lines else 'no error output'} (log: {log})", seconds

    def stop(self) -> None:
        """Stop the running processes as Ctrl-C stops one run: one SIGTERM each, then wait while they
        finish their round and write their checkpoint (a round may take minutes). A second Ctrl-C
        meanwhile sends the second signal that stops them at once; one still alive 5 s later is killed."""
        with self._lock:
            self._stopping = True
            running = [process for process in self._running if process.poll() is None]
        if not running:
            return
        self._signal(running)
        print(f"{PROG}: waiting for {len(running)} run(s) to finish their round and write a checkpoint "
              "(Ctrl-C again stops them at once, unsaved)", file=sys.stderr, flush=True)
        try:
            for process in running:
                while process.poll() is None:  # in short waits, so that a second Ctrl-C is seen at once
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(timeout=0.5)
        except KeyboardInterrupt:
            self._signal(running)
            deadline = time.monotonic() + 5
            for process in running:
                try:
                    process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

    @staticmethod
    def _signal(processes: list[subprocess.Popen]) -> None:
        for process in processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)


def run_jobs(jobs: list[Job], parallel: int, log_dir: Path) -> list[str]:
    """Run the jobs still to do; print one line per finished job; returns the failures."""
    todo = [job for job in jobs if job.state == "todo"]
    failures: list[str] = []
    runner = Runner(log_dir)
    pool = ThreadPoolExecutor(max_workers=parallel)
    try:
        futures = {pool.submit(runner.run, job): job for job in todo}
        for count, future in enumerate(as_completed(futures), start=1):
            job = futures[future]
            code, error, seconds = future.result()
            if code == 0:
                print(f"[{count}/{len(todo)}] done {job.name} ({seconds:.1f} s)", flush=True)
            else:
                failures.append(f"{job.name}: exit {code}: {error}")
                print(f"[{count}/{len(todo)}] FAILED {job.name}: exit {code}: {error}", flush=True)
    except KeyboardInterrupt:
        runner.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return failures


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------

@dataclass
class SettingSummary:
    """One setting's summary row, with what its best setting is chosen among: its algorithm and
    the attack it runs under (settings under different attacks are not ranked against each other:
    an attack × defence grid's best defence is chosen per attack)."""

    row: AlgorithmSummary
    algorithm: str
    attack: str | None


def summaries(jobs: list[Job]) -> dict[str, list[SettingSummary]]:
    """Per dataset, the summary of every setting that has results, labelled "algorithm setting"."""
    by_setting: dict[tuple[str, str, str], list[Job]] = {}
    for job in jobs:
        key = (Path(job.settings["dataset"]).name, job.algorithm, job.label)
        by_setting.setdefault(key, []).append(job)
    tables: dict[str, list[SettingSummary]] = {}
    for (dataset, algorithm, label), group in by_setting.items():
        runs = [load_run(job.path) for job in group if job.path.exists() and is_finished(job.path) and not job.state.startswith("conflict")]
        if runs:
            row = dataclasses.replace(summarize_runs(runs), algorithm=f"{algorithm} {label}".strip())
            tables.setdefault(dataset, []).append(SettingSummary(row, algorithm, group[0].settings.get("attack")))
    return tables


def best_settings(settings: list[SettingSummary], rank_by: str) -> list[AlgorithmSummary]:
    """The row with the highest mean ``best`` (or ``final``) accuracy of each algorithm under each
    attack (one per algorithm when the attack is not swept)."""
    best: dict[tuple[str, str | None], AlgorithmSummary] = {}
    for setting in settings:
        key = (setting.algorithm, setting.attack)
        score = getattr(setting.row, f"{rank_by}_mean")
        if key not in best or score > getattr(best[key], f"{rank_by}_mean"):
            best[key] = setting.row
    return list(best.values())


def print_summary(jobs: list[Job], goal: str, rank_by: str) -> None:
    for dataset, settings in summaries(jobs).items():
        print()
        print(format_summary_table([s.row for s in settings], dataset, goal + "-*"))
        print()
        per = " and attack" if len({s.attack for s in settings}) > 1 else ""
        print(f"Best setting per algorithm{per} (highest mean {rank_by} accuracy):")
        print(format_summary_table(best_settings(settings, rank_by), dataset, goal + "-*"))


def main_cli(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        own, jobs = plan(argv)
        conflicts = [f"{job.name}: {job.state}" for job in jobs if job.state.startswith("conflict")]
        done = sum(job.state == "done" for job in jobs)
        todo = sum(job.state == "todo" for job in jobs)
        failed = [f"{job.name}: {job.path.name} {job.state}: python main.py "
                  f"{' '.join(job.argv).replace('--resume', '--overwrite')}"
                  for job in jobs if job.state == FAILED]
        print(f"{len(jobs)} runs: {done} done earlier, {todo} to run, {len(failed)} failed earlier, "
              f"{len(conflicts)} in conflict; {own.jobs} at a time", flush=True)
        conflicts += failed  # not run again here: listed with the conflicts, exit status 1
        for line in conflicts:
            print(line, file=sys.stderr)
        if own.dry_run:
            for job in jobs:
                print(f"{job.state.split(':')[0]:8s} {job.path.name}: python main.py {' '.join(job.argv)}")
            return 1 if conflicts else 0
        log_dir = jobs[0].path.parent / "sweep-logs" if jobs else Path("sweep-logs")
        failures = run_jobs(jobs, own.jobs, log_dir)
        print_summary(jobs, own.goal, own.rank_by)
    except FLError as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; finished runs are kept, rerun the same command to continue", file=sys.stderr)
        return 130
    if failures or conflicts:
        print(f"\n{len(failures)} run(s) failed, {len(conflicts)} in conflict:", file=sys.stderr)
        for line in failures + conflicts:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the runs as Ctrl-C does
    sys.exit(main_cli())
