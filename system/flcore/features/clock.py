"""A virtual clock: how long each round would take on real devices and links.

Every client has a compute speed (training samples per second), a download and an upload link
speed (bytes per second) and an availability schedule. A round's simulated duration follows from
the work and the bytes each client really had in it::

    client time t_i = package.nbytes(i) / down_i + samples_i / compute_i + update.nbytes() / up_i

where ``samples_i`` is the number of samples the client computed gradients on this round
(``Client.samples_processed``): steps × batch size, so a slow trainer's fewer epochs count, and
every extra pass an algorithm makes (Ditto's personal model, APFL's second gradient, pFedMe's K
inner steps, FedALA's weight learning, Per-FedAvg's meta-steps). The server
is synchronous, as PFLlib's: the round lasts until the last upload it waits for arrives::

    duration = wait + max( t_i over the uploads that arrived (kept or dropped by -tth),
                           down_i/down + samples_i/compute over the -cdr drop-outs )

* ``wait``: when no selectable client is available at the end of the previous round, the server
  waits for the first one to become available (0 otherwise).
* ``-cdr`` drop-outs fail while uploading: the server notices when their upload should begin
  (after download and training) and stops waiting for them then.
* ``-tth`` (PFLlib's ``receive_models``): an upload is discarded when the client's *mean* time
  cost over the rounds it trained in, this one included, exceeds the threshold; PFLlib measures
  train + send wall-clock seconds, we use the virtual ``t_i``. The server has waited for the upload
  before discarding it, so it counts in the duration (the straggler's wait). PFLlib's default
  10000 s never triggers on its wall clock; here the threshold applies only when ``-ts`` is on or
  ``-tth`` is given another value, so runs without these flags train exactly as before.
* ``-ts`` (stored but unused by PFLlib): select only clients whose *predicted* time is at most
  ``-tth``. The prediction is what the server knows before the round: the model's shared part
  down and up (``shared_numel × element size`` each way; extras and per-client payloads are not
  predicted) and the full local work ``E × steps per epoch × B`` at the client's speed (a slow
  trainer's random epoch cut is not known in advance); algorithms with a fixed number of extra
  passes scale it (``Client.expected_gradient_samples``: Ditto, APFL, pFedMe). It is computed
  once: speeds are fixed.
* Availability: a client can be selected only while it is available at the round's virtual start
  time (the end of the previous round, plus any wait). It need not stay available during the round.

The restrictions reach the selection through :meth:`VirtualClock.selectable` (via
``Server.selectable``), which every policy in ``flcore/selectors/`` honours: without availability
limits and ``-ts`` it is None and selection is exactly what it was.

Speeds without a trace (``--client_trace``) are drawn per client from the seed, log-normal
(a common model of device and bandwidth heterogeneity: the log of a speed is normal)::

    compute_c = --clock_compute_speed · exp(--clock_compute_spread · z1)
    down_c    = --clock_link_speed    · exp(--clock_link_spread · z2),   up_c = down_c · --clock_uplink_ratio

with z1, z2 standard normals from (seed, "clock-speeds", client), so the same seed gives the same
speeds whatever the engine, cohort or round. A client's speeds are drawn the first time a round
times it (the same values whenever they are drawn) and kept, as its time costs are, for the clients
timed so far, so the clock's memory follows the clients that trained, not the population, unless
``-ts`` needs every client's prediction; ``--clock_avail_period`` draws every client's phase. ``--clock_avail_period P`` with ``--clock_avail_duty D``
makes every client available a fraction D of each period of P virtual seconds, from a phase drawn
from (seed, "clock-phase", client); the default (P = 0) keeps every client always available.

PFLlib's ``-tsr``, ``-ssr`` and ``-cdr`` belong to the clock, which draws them and applies them:

* ``-tsr`` slow trainers and ``-ssr`` slow senders: round(rate · N) clients of each, drawn without
  replacement from (seed, "slow-clients") and (seed, "slow-senders") (:attr:`VirtualClock.train_slow`,
  :attr:`VirtualClock.send_slow`). A slow trainer computes ``--clock_train_slow_factor`` times
  slower (PFLlib sleeps up to 0.1 s per batch) and trains a random 1..max(1, E//2) epochs a round,
  drawn from (seed, "slow-epochs", round, client). The epochs reach its local training through the
  client's ``epoch_schedule`` (a settable attribute, ``Client.epochs_this_round``): the clock sets
  :class:`SlowEpochs` on the slow trainers once, when it is built, so every engine (Ray's actors
  receive the client's settings) plans the same shorter rounds and the clock charges the samples
  they really computed. A slow sender's links are ``--clock_send_slow_factor`` times slower both
  ways (PFLlib marks slow senders but never slows them down). The factors apply to trace speeds too.
* ``-cdr`` drop-outs: in each round a fraction of the uploads never arrives, drawn from
  (seed, "drop", round) over the round's uploads in cohort order (:meth:`VirtualClock.drop_uploads`,
  the first thing the clock's ``after_training`` does, so every later plug-in sees only the uploads
  that arrived). They are timed as described above and charged their time cost. Their uploads
  count as sent (``rs_bytes_up``), not as arrived (``rs_bytes_up_arrived``); those ``-tth``
  rejects count as both.

Trace file (``--client_trace FILE.csv``): a header line, then one row per client::

    client,samples_per_s,bytes_per_s,available
    0,120,1e6,
    1,40,2.5e5,0-3600;7200-inf

* ``client``: the client's index 0..N-1 (each exactly once; rows for indices >= N are ignored).
* ``samples_per_s``, ``bytes_per_s``: positive numbers; optional ``down_bytes_per_s`` and
  ``up_bytes_per_s`` replace ``bytes_per_s`` for one direction (``bytes_per_s`` may then be empty).
* availability, optional: ``available`` as ``start-end`` windows in virtual seconds separated by
  ``;`` (the client is available for start <= t < end; ``inf`` ends never; empty: always), or a
  duty cycle with ``period`` (> 0), ``duty`` (in (0, 1]) and optional ``offset``: available while
  ``(t + offset) mod period < duty · period``. A row uses one form or the other.
A bad file is one line naming the file, the line and the column (exit status 2).

The clock is a round plug-in (``flcore/features/__init__.py``), in every run. What persists across
rounds is what it names ``carried`` (the checkpoint keeps it): the cumulative virtual time ``now`` and each
client's time cost, ``client_seconds``/``client_rounds``; the rest is what the seed and the trace
determine. After each training round it records ``rs_virtual_time`` (virtual seconds at the end
of the round) and ``rs_virtual_round_time`` (the round's duration, waits included).
"""
from __future__ import annotations

from argparse import ArgumentParser

import csv
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from flcore.extension import RoundPlugin
from flcore.protocol import ClientUpdate, RoundPackage, RoundResult, Runtime
from flcore.registry import register_plugin
from cli.flags import add_flag
from reporting.results import RunHistory, rounds_to_target
from utils.errors import FLError
from utils.seeding import numpy_rng

#: PFLlib's default -tth; left at it (and without -ts) no upload is dropped for its time
PFLLIB_DEFAULT_THRESHOLD = 10000.0


@dataclass
class Profiles:
    """Every client's speeds and availability (arrays indexed by client position; the speeds None
    while they are drawn client by client as needed, :meth:`VirtualClock.effective_speeds`)."""

    compute: np.ndarray | None  # samples per second
    down: np.ndarray | None  # bytes per second, server -> client
    up: np.ndarray | None  # bytes per second, client -> server
    #: client position -> an (k, 2) array of [start, end) windows, for the clients windows limit
    windows: dict[int, np.ndarray]
    period: np.ndarray  # duty cycle length; 0 = no duty cycle
    duty: np.ndarray
    offset: np.ndarray

    def available(self, t: float) -> np.ndarray:
        """Which clients are available at virtual time ``t``."""
        ok = np.ones(len(self.period), dtype=bool)
        cycled = self.period > 0
        if cycled.any():
            phase = np.mod(t + self.offset[cycled], self.period[cycled])
            ok[cycled] = phase < self.duty[cycled] * self.period[cycled]
        for i, win in self.windows.items():
            ok[i] = bool(((win[:, 0] <= t) & (t < win[:, 1])).any())
        return ok

    def next_available(self, t: float, among: np.ndarray) -> float | None:
        """The earliest time after ``t`` at which one of the clients ``among`` becomes available
        (None: never)."""
        times = []
        for i in np.flatnonzero(among):
            if i in self.windows:
                starts = self.windows[i][:, 0]
                later = starts[starts > t]
                if later.size:
                    times.append(float(later.min()))
            elif self.period[i] > 0:
                phase = math.fmod(t + self.offset[i], self.period[i])
                times.append(t + self.period[i] - phase)
            else:
                return t  # always available
        return min(times) if times else None

    @property
    def limited(self) -> bool:
        """Whether any client is ever unavailable."""
        return bool((self.period > 0).any()) or bool(self.windows)


def drawn_speeds(args, cids: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compute, down, up) of the clients ``cids``: log-normal speeds (module docstring), one stream per
    client, so a client's speeds are the same whichever others are drawn with it."""
    z = np.stack([numpy_rng(args.seed, "clock-speeds", cid).standard_normal(2) for cid in cids]) if len(cids) else np.zeros((0, 2))
    compute = args.clock_compute_speed * np.exp(args.clock_compute_spread * z[:, 0])
    down = args.clock_link_speed * np.exp(args.clock_link_spread * z[:, 1])
    return compute, down, down * args.clock_uplink_ratio


def drawn_profiles(args, cids: Sequence[int], speeds: bool = True) -> Profiles:
    """Log-normal speeds and the seeded duty cycle (module docstring), one stream per client; with
    ``speeds`` False the speeds are left None, to be drawn (``drawn_speeds``) when first needed."""
    n = len(cids)
    compute, down, up = drawn_speeds(args, cids) if speeds else (None, None, None)
    # one value for every client: read-only views of it, no memory per client
    period = np.broadcast_to(float(args.clock_avail_period), (n,))
    duty = np.broadcast_to(float(args.clock_avail_duty), (n,))
    offset = np.broadcast_to(0.0, (n,))
    if args.clock_avail_period > 0:
        offset = np.asarray([numpy_rng(args.seed, "clock-phase", cid).uniform(0, args.clock_avail_period) for cid in cids])
    return Profiles(compute, down, up, {}, period, duty, offset)


def slow_clients(seed: int, rate: float, num_clients: int, purpose: str) -> np.ndarray:
    """round(rate · N) of the N clients (a boolean mask), drawn without replacement from (seed, purpose)."""
    mask = np.zeros(num_clients, dtype=bool)
    count = int(round(float(rate) * num_clients))
    if count:
        mask[numpy_rng(seed, purpose).choice(num_clients, count, replace=False)] = True
    return mask


@dataclass(frozen=True)
class SlowEpochs:
    """A slow trainer's ``epoch_schedule``: a random 1..max(1, E//2) of the E local epochs in each round,
    drawn from (seed, "slow-epochs", round, client id)."""

    seed: int
    local_epochs: int

    def __call__(self, rnd: int, cid: int) -> int:
        upper = max(1, self.local_epochs // 2)
        return int(numpy_rng(self.seed, "slow-epochs", rnd, cid).integers(1, upper + 1))


# ----------------------------------------------------------------------------- trace files
TRACE_COLUMNS = ("client", "samples_per_s", "bytes_per_s", "down_bytes_per_s", "up_bytes_per_s",
                 "available", "period", "duty", "offset")


def read_trace(path: str | Path, num_clients: int) -> Profiles:
    """Every client's profile from a trace CSV (format: module docstring)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: a spreadsheet's byte-order mark is no column name
    except (OSError, UnicodeDecodeError) as exc:
        raise FLError(f"--client_trace {path}: cannot read it as UTF-8 text ({getattr(exc, 'strerror', None) or exc})") from exc
    reader = csv.reader(text.splitlines())
    try:
        rows = iter(list(reader))
    except csv.Error as exc:
        raise FLError(f"--client_trace {path} line {reader.line_num}: {exc}") from exc

    def fail(line: int, column: str, message: str) -> None:
        raise FLError(f"--client_trace {path} line {line} column {column}: {message}")

    header = next(rows, None)
    if not header or not any(cell.strip() for cell in header):
        raise FLError(f"--client_trace {path} line 1: empty file; expected a header such as "
                      f"client,samples_per_s,bytes_per_s,available")
    names = [cell.strip() for cell in header]
    for name in names:
        if name not in TRACE_COLUMNS:
            fail(1, name or "(empty)", f"unknown column; known: {', '.join(TRACE_COLUMNS)}")
    if len(set(names)) != len(names):
        fail(1, next(n for n in names if names.count(n) > 1), "column given twice")
    for needed in ("client", "samples_per_s"):
        if needed not in names:
            fail(1, needed, "missing column")
    if "bytes_per_s" not in names and not {"down_bytes_per_s", "up_bytes_per_s"} <= set(names):
        fail(1, "bytes_per_s", "missing column (or give both down_bytes_per_s and up_bytes_per_s)")

    nan = float("nan")
    compute, down, up = np.full(num_clients, nan), np.full(num_clients, nan), np.full(num_clients, nan)
    period, duty, offset = np.zeros(num_clients), np.ones(num_clients), np.zeros(num_clients)
    windows: dict[int, np.ndarray] = {}
    seen: dict[int, int] = {}
    for line, row in enumerate(rows, start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(names):
            fail(line, names[min(len(row), len(names) - 1)], f"{len(row)} cells for {len(names)} columns")
        cells = {name: cell.strip() for name, cell in zip(names, row)}

        def number(column: str, positive: bool = True, lowest: float | None = None) -> float | None:
            raw = cells.get(column, "")
            if raw == "":
                return None
            try:
                value = float(raw)
            except ValueError:
                fail(line, column, f"{raw!r} is not a number")
            if math.isnan(value) or (positive and not value > 0) or (lowest is not None and value < lowest):
                fail(line, column, f"{raw!r} must be {'> 0' if positive else f'>= {lowest}'}")
            return value

        raw_id = cells["client"]
        if not raw_id.isdigit():
            fail(line, "client", f"{raw_id!r} is not a client index (0, 1, ...)")
        client = int(raw_id)
        if client in seen:
            fail(line, "client", f"client {client} already given on line {seen[client]}")
        seen[client] = line
        speed = number("samples_per_s")
        if speed is None:
            fail(line, "samples_per_s", "empty; a number > 0 is required")
        both = number("bytes_per_s")
        down_i, up_i = number("down_bytes_per_s") or both, number("up_bytes_per_s") or both
        for column, value in (("down_bytes_per_s", down_i), ("up_bytes_per_s", up_i)):
            if value is None:
                fail(line, "bytes_per_s", f"empty, and {column} is not given")
        cycle = number("period")
        share, shift = number("duty"), number("offset", positive=False, lowest=0.0)
        window_text = cells.get("available", "")
        if cycle is not None and window_text:
            fail(line, "period", "give either available windows or a period, not both")
        if (share is not None or shift is not None) and cycle is None:
            fail(line, "duty" if share is not None else "offset", "needs a period")
        if share is not None and share > 1:
            fail(line, "duty", f"{cells['duty']!r} must be in (0, 1]")
        if cycle is not None and math.isinf(cycle):
            fail(line, "period", "must be finite")
        if client >= num_clients:
            continue
        compute[client], down[client], up[client] = speed, down_i, up_i
        if cycle is not None:
            period[client], duty[client], offset[client] = cycle, share if share is not None else 1.0, shift or 0.0
        if window_text:
            windows[client] = _parse_windows(window_text, lambda message: fail(line, "available", message))
    missing = [i for i in range(num_clients) if i not in seen]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise FLError(f"--client_trace {path}: no row for client(s) {', '.join(map(str, missing[:5]))}{more} "
                      f"of the dataset's {num_clients}")
    return Profiles(compute, down, up, windows, period, duty, offset)


def _parse_windows(text: str, fail) -> np.ndarray:
    """``"0-100;200-inf"`` as a sorted (k, 2) array of [start, end) windows."""
    windows = []
    for part in text.split(";"):
        start_text, sep, end_text = part.strip().partition("-")
        try:
            start, end = float(start_text), float(end_text)
        except ValueError:
            start = end = float("nan")
        if not sep or math.isnan(start) or math.isnan(end):
            fail(f"{part.strip()!r} is not a start-end window (e.g. 0-3600;7200-inf)")
        if not 0 <= start < end or math.isinf(start):
            fail(f"window {part.strip()!r} needs 0 <= start < end")
        windows.append((start, end))
    return np.asarray(sorted(windows), dtype=np.float64)


# ------------------------------------------------------------------------------- the clock
@register_plugin("clock")
class VirtualClock(RoundPlugin):
    """Speeds, availability and the timing of rounds (module docstring)."""
    objectives = ("class", "multilabel")  # the label types it trains on (flcore/objectives.py)

    flag_group = "system heterogeneity and the virtual clock (PFLlib's -cdr -tsr -ssr -ts -tth; flcore/features/clock.py)"
    flag_order = 10
    #: what persists (checkpoints): the virtual time and each client's time cost so far
    carried = ("now", "client_seconds", "client_rounds")

    @classmethod
    def check(cls, args) -> None:
        trace = cls.flags(args).client_trace
        if trace is not None and not Path(trace).is_file():
            raise FLError(f"--client_trace {trace}: no such file")

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-cdr", "--client_drop_rate", type=float, default=0.0, low=0, below=1,
                 help="fraction of uploads dropped each round (drop-outs fail while uploading, on the virtual clock)")
        add_flag(parser, "-tsr", "--train_slow_rate", type=float, default=0.0, low=0, high=1,
                 help="fraction of clients that are slow trainers (they run 1..E//2 epochs)")
        add_flag(parser, "-ssr", "--send_slow_rate", type=float, default=0.0, low=0, high=1,
                 help="fraction of clients that are slow senders: links --clock_send_slow_factor times slower on the "
                      "virtual clock (flcore/features/clock.py)")
        add_flag(parser, "-ts", "--time_select", type=bool, default=False,
                 help="select only clients whose predicted round time on the virtual clock is at most -tth")
        add_flag(parser, "-tth", "--time_threthold", type=float, default=10000, above=0,
                 help="virtual seconds: drop uploads of clients whose mean round time exceeds it (PFLlib's rule); "
                      "with -ts also the selection limit. The default alone drops nothing")
        add_flag(parser, "--client_trace", type=str, default=None,
                 help="CSV of client,samples_per_s,bytes_per_s[,available|period,duty,offset] giving every client's "
                      "speeds and availability (default: speeds drawn from the seed)")
        add_flag(parser, "--clock_compute_speed", type=float, default=100.0, above=0,
                 help="median compute speed (samples/s) of the drawn, log-normal speeds")
        add_flag(parser, "--clock_compute_spread", type=float, default=0.5, low=0,
                 help="sigma of log(compute speed): 0 gives every client the median")
        add_flag(parser, "--clock_link_speed", type=float, default=1.25e6, above=0,
                 help="median download speed (bytes/s; 1.25e6 = 10 Mbit/s) of the drawn, log-normal speeds")
        add_flag(parser, "--clock_link_spread", type=float, default=0.5, low=0, help="sigma of log(link speed)")
        add_flag(parser, "--clock_uplink_ratio", type=float, default=1.0, above=0,
                 help="drawn upload speed = download speed x this ratio")
        add_flag(parser, "--clock_train_slow_factor", type=float, default=10.0, low=1,
                 help="a -tsr slow trainer computes this many times slower")
        add_flag(parser, "--clock_send_slow_factor", type=float, default=10.0, low=1,
                 help="a -ssr slow sender's links are this many times slower")
        add_flag(parser, "--clock_avail_period", type=float, default=0.0, low=0,
                 help="virtual seconds of a duty cycle: each client is available --clock_avail_duty of every period "
                      "from a phase drawn from the seed (0: always available; a trace's availability replaces it)")
        add_flag(parser, "--clock_avail_duty", type=float, default=1.0, above=0, high=1,
                 help="fraction of each --clock_avail_period a client is available")

    order = 10  # first: its restrictions shape the selection, and -tth which uploads count

    def __init__(self, runtime: Runtime, server_cls: type):
        super().__init__(runtime, server_cls)
        args = runtime.args
        clients = runtime.clients
        n = len(clients)
        trace = self.flags(args).client_trace
        if trace:
            self._profiles = read_trace(trace, n)
        else:  # speeds drawn when first needed (speeds_of); phases, where there are any, now
            cids = [c.cid for c in clients] if args.clock_avail_period > 0 else range(n)
            self._profiles = drawn_profiles(args, cids, speeds=False)
        #: the drawn speeds (compute, down, up) of the clients timed so far, by position (no trace)
        self._drawn: dict[int, tuple[float, float, float]] = {}
        self.batch_size = int(args.batch_size)
        #: -tsr slow trainers and -ssr slow senders (boolean masks over client positions)
        self.train_slow = slow_clients(args.seed, args.train_slow_rate, n, "slow-clients")
        self.send_slow = slow_clients(args.seed, args.send_slow_rate, n, "slow-senders")
        if self.train_slow.any():  # they also train fewer epochs (module docstring)
            schedule = SlowEpochs(int(args.seed), int(args.local_epochs))
            for i in np.flatnonzero(self.train_slow):
                clients[i].configure(epoch_schedule=schedule)
        self.drop_rate = float(args.client_drop_rate)
        self.time_select = bool(args.time_select)
        self.threshold = float(args.time_threthold)
        #: whether -tth discards uploads (module docstring: PFLlib's default alone does not)
        self.drops_late = self.time_select or self.threshold != PFLLIB_DEFAULT_THRESHOLD
        self.fast_enough = self.predicted <= self.threshold if self.time_select else np.ones(n, dtype=bool)
        if not self.fast_enough.any():
            raise FLError(
                f"-ts: no client's predicted round time is at most -tth {self.threshold:g} virtual seconds "
                f"(the fastest needs {self.predicted.min():.4g}); raise -tth"
            )
        self.restricts_selection = self.time_select or self._profiles.limited
        #: virtual seconds since the start of training
        self.now = 0.0
        #: each client's virtual seconds over the rounds it trained in, and their number (-tth): client
        #: position -> value, for the clients that trained (memory follows them, not the population)
        self.client_seconds: dict[int, float] = {}
        self.client_rounds: dict[int, int] = {}
        self._round_began = 0.0
        #: the virtual time the round's training began (after any wait), and each upload's seconds from it
        self._round_start = 0.0
        self.upload_seconds: dict[int, float] = {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        rounds = self.client_rounds
        if isinstance(rounds, np.ndarray):  # a checkpoint of when these were arrays over every client
            trained = np.flatnonzero(rounds).tolist()
            self.client_seconds = {i: float(self.client_seconds[i]) for i in trained}
            self.client_rounds = {i: int(rounds[i]) for i in trained}

    def _base_speeds(self, positions: np.ndarray) -> np.ndarray:
        """(compute, down, up) of the clients at ``positions`` before the slow factors, (3, k): the
        trace's, or drawn; those not drawn yet are drawn at once (a cohort of new clients: one
        vectorised draw) and kept for the clients timed, not for the population."""
        p = self._profiles
        if p.compute is not None:
            return np.stack([p.compute[positions], p.down[positions], p.up[positions]])
        wanted = positions.tolist()
        missing = [i for i in dict.fromkeys(wanted) if i not in self._drawn]
        if missing:
            clients = self.runtime.clients
            drawn = np.stack(drawn_speeds(self.args, [clients[i].cid for i in missing]), axis=1)
            self._drawn.update(zip(missing, map(tuple, drawn.tolist())))
        return np.asarray([self._drawn[i] for i in wanted], dtype=np.float64).reshape(-1, 3).T

    def speeds_of(self, index: int) -> tuple[float, float, float]:
        """Client ``index``'s effective (compute, down, up) speeds (:meth:`effective_speeds`)."""
        compute, down, up = self.effective_speeds(np.asarray([index]))[:, 0]
        return float(compute), float(down), float(up)

    def effective_speeds(self, positions: np.ndarray) -> np.ndarray:
        """The effective speeds (3, len(positions)) of the clients at ``positions``: drawn the
        first time they are needed, -tsr's and -ssr's slow factors applied (computed when asked:
        no array per client)."""
        args = self.args
        base, down, up = self._base_speeds(positions)
        compute = np.where(self.train_slow[positions], base / args.clock_train_slow_factor, base)
        links = [np.where(self.send_slow[positions], speed / args.clock_send_slow_factor, speed) for speed in (down, up)]
        return np.stack([compute, *links])

    @property
    def profiles(self) -> Profiles:
        """Every client's speeds (all drawn) and availability."""
        self._draw_every_client()
        return self._profiles

    def _draw_every_client(self) -> None:
        """Draw the speeds of the clients not timed yet into arrays over every client (what ``-ts``'s
        predictions and :attr:`profiles` need)."""
        p = self._profiles
        if p.compute is None:
            p.compute, p.down, p.up = self._base_speeds(np.arange(len(p.period)))

    @functools.cached_property
    def predicted(self) -> np.ndarray:
        """Each client's expected round time from what the server knows in advance (module docstring,
        ``-ts``); computed once, for every client: speeds are fixed."""
        runtime = self.runtime
        vector = runtime.model.vector
        shared = vector.numel() if runtime.shared is None else int(runtime.shared.sum())
        model_bytes = shared * vector.element_size()
        samples = [client.expected_gradient_samples() for client in runtime.clients]
        self._draw_every_client()
        compute, down, up = self.effective_speeds(np.arange(len(runtime.clients)))
        return model_bytes / down + np.asarray(samples, dtype=np.float64) / compute + model_bytes / up

    # ------------------------------------------------------------------ plug-in hooks
    def before_selection(self, rnd: int, selecting: bool) -> None:
        self._round_began = self.now
        if selecting:  # the server waits until a client it may select is available
            self.now = self.wait_for_clients(self.now)

    def after_training(self, package: RoundPackage, trained: list[ClientUpdate], arrived: list[ClientUpdate],
                       result: RoundResult) -> list[ClientUpdate]:
        self._round_start = self.now  # after the wait for an available client
        arrived = self.drop_uploads(package.round, arrived)
        kept, seconds = self.finish_round(package, trained, arrived)
        aggregated = {id(u) for u in kept}  # -tth's rejected uploads arrived (the server waited for them)
        result.discarded_nbytes += sum(u.nbytes() for u in arrived if id(u) not in aggregated)
        self.now += seconds
        result.virtual_seconds = self.now - self._round_began
        return kept

    @property
    def round_start(self) -> float:
        """The virtual time the round's training began (after any wait for an available client)."""
        return self._round_start

    def upload_time(self, index: int) -> float:
        """Virtual seconds from the round's start until client ``index``'s upload of the round arrives."""
        return self.upload_seconds[index]

    def retime_round(self, seconds: float, result: RoundResult) -> None:
        """Let the round last ``seconds`` from its start instead: a server that stops waiting for
        stragglers, or waits longer for them (features/stragglers.py)."""
        self.now = self.round_start + seconds
        result.virtual_seconds = self.now - self._round_began

    def extend_round(self, seconds: float, result: RoundResult) -> None:
        """Let the round end ``seconds`` later: work the server does after the uploads arrived
        (FLChain's consensus and block), in both ``rs_virtual_time`` and ``rs_virtual_round_time``."""
        self.now += seconds
        result.virtual_seconds = self.now - self._round_began

    def record(self, result: RoundResult) -> None:
        self.runtime.history.add_series("virtual_time", self.now)
        self.runtime.history.add_series("virtual_round_time", result.virtual_seconds)

    @classmethod
    def summarize_series(cls, history: RunHistory, target_acc: float | None) -> dict[str, Any]:
        """With ``--target_acc``: ``virtual_time_to_target``, the clock's reading after the training
        rounds before the evaluation that reached the target (0 for the untrained model; None when no
        evaluation reached it)."""
        clock = history.extra_series.get("virtual_time")  # the clock after each training round
        if target_acc is None or clock is None:
            return {}
        reached = rounds_to_target(history, target_acc)
        if reached is None:
            return {"virtual_time_to_target": None}
        rounds = reached[0]
        if rounds > len(clock):
            return {}
        return {"virtual_time_to_target": float(clock[rounds - 1]) if rounds else 0.0}

    def lines(self, results: dict[str, Any]) -> list[str]:
        seconds = results.get("virtual_time_to_target")
        return [] if seconds is None else [f"  target reached after {seconds:.1f} virtual s"]

    # ------------------------------------------------------------------- selection
    def selectable(self, rnd: int) -> np.ndarray | None:
        """Which clients may be selected now (the round's virtual start); None when nothing
        restricts it."""
        if not self.restricts_selection:
            return None
        return self.fast_enough & self._profiles.available(self.now)

    def wait_for_clients(self, now: float) -> float:
        """The round's start: ``now``, or the first later time a selectable client is available."""
        if not self.restricts_selection or (self.fast_enough & self._profiles.available(now)).any():
            return now
        start = self._profiles.next_available(now, self.fast_enough)
        if start is None or math.isinf(start):
            raise FLError(
                f"no client is available at or after virtual time {now:.6g} s (their availability windows "
                f"end before it); lengthen the windows of --client_trace or lower -gr"
            )
        return start

    # ---------------------------------------------------------------------- rounds
    def drop_uploads(self, rnd: int, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        """``-cdr``: the uploads that arrive, of ``updates``; a random fraction never does (drawn per round)."""
        if self.drop_rate <= 0 or not updates:
            return updates
        keep = numpy_rng(self.args.seed, "drop", rnd).random(len(updates)) >= self.drop_rate
        return [u for u, k in zip(updates, keep) if k]

    def finish_round(self, package: RoundPackage, trained: list[ClientUpdate],
                     arrived: list[ClientUpdate]) -> tuple[list[ClientUpdate], float]:
        """Time the round's clients, charge each its time cost, and drop the uploads -tth rejects.

        ``trained``: every upload the engine produced; ``arrived``: those that reached the server
        (-cdr's drop-outs are not among them). Returns the
        uploads the server aggregates and the round's duration (without the start wait)."""
        reached = {id(u) for u in arrived}
        duration = 0.0
        kept = []
        self.upload_seconds = {}
        speeds = self.effective_speeds(np.fromiter((u.index for u in trained), dtype=np.int64, count=len(trained)))
        for update, (compute, down, up) in zip(trained, speeds.T.tolist()):
            i = int(update.index)
            down_and_train = float(package.nbytes(i) / down + update.samples_processed / compute)
            seconds = down_and_train + float(update.nbytes() / up)
            self.upload_seconds[i] = seconds
            self.client_seconds[i] = self.client_seconds.get(i, 0.0) + seconds
            self.client_rounds[i] = self.client_rounds.get(i, 0) + 1
            if id(update) not in reached:  # a drop-out: noticed when its upload should begin
                duration = max(duration, down_and_train)
                continue
            duration = max(duration, seconds)
            if self.drops_late and self.client_seconds[i] / self.client_rounds[i] > self.threshold:
                continue
            kept.append(update)
        return kept, duration
