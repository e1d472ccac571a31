"""Evaluation of the model each client is evaluated with (``Server.evaluate_models``).

PFLlib's metrics (see :mod:`utils.metrics`): per client the correct test predictions, the number
of test samples and the micro-AUC of the softmax outputs; over all clients the summed train loss.
The result equals evaluating every client's model on its own data one by one; this module only
decides how many forward passes that takes.

* **One model for many clients** (the global model, or a personalised algorithm's initial model
  for clients not trained yet): ``params_for`` returns *the same tensor object* for them, and
  they are evaluated in one pass over their concatenated data (the dataset's merged tensors
  when it is every client), in batches of ``--eval_batch_size``.
* **One model per client** (personalised algorithms): clients are evaluated in groups of
  ``--eval_group`` clients. A group of one runs the working module client by client, each on
  its own rows of the merged data; a larger group stacks the clients' flat vectors into one
  ``[G, D]`` tensor and runs ``torch.func.vmap`` of ``functional_call`` over it, each client on
  up to ``--eval_batch_size`` of its own rows per step. Float buffers (BatchNorm's running
  statistics, used in eval mode) are part of each client's vector and are passed per client with
  the parameters; dropout is off in eval mode. Clients are ordered by their number of rows, so
  at each step the clients that still have rows are a prefix of the stack: no client is padded
  beyond its own last, partial step.
* **Group size.** ``--eval_group 0`` (auto) evaluates client by client on a CPU, where that is
  fastest: a client's test and train rows go through its model in one pass, in batches of equal
  size (225 rows: 113 + 112), so a personal model is loaded once and its batches are nearly
  full. vmap does not pay off there: its batched convolution is a grouped convolution without
  oneDNN's channels-last kernels. On a GPU, where one client's batch leaves most of the device
  idle, auto takes as many clients as fit a quarter of the memory still available, counting each
  client's stacked vector and its activations (measured once, with forward hooks on one sample).
  When the device runs out of memory anyway, the group is halved and retried (one
  warning). A model whose forward fails under vmap is evaluated client by client, with one
  notice.
* **Threads (CPU).** A pass's batches are spread over as many worker threads as the process has
  intra-op threads (``--num_threads``; PyTorch's default is one per core), each computing whole
  batches on one intra-op thread, rather than computed one after another with every thread
  working on each batch. The logits are those of ``--num_threads 1`` bit for bit, whatever the
  thread count. On a loaded machine this avoids OpenMP's team waiting at every operation for
  whichever of its threads was descheduled. What runs on the calling thread (a pass of one batch,
  as a personal model's few rows are, and the metrics) runs on one intra-op thread for the same
  reason. A GPU computes batch after batch as before.
* **Frozen copies (CPU).** A pass of at least 512 rows on a CPU runs a frozen TorchScript copy
  of the model with the pass's parameters (``flcore/frozen.py``: oneDNN's prepacked, fused
  convolutions), with logits equal to the eager module's up
  to float rounding; its first batch is checked against the eager module. Where a copy cannot
  be built or trusted, the eager module runs from then on (one notice). Each copy is built into a
  TorchScript compilation unit of its own and released after its pass: PyTorch otherwise keeps every
  traced copy's graphs for the life of the process (pytorch#35600, #96726); the heap's free pages
  are then returned. A slow growth of the process's memory remains (``flcore/frozen.py``), so it is
  opt-in (``--eval_frozen True``).

The measurements behind the group size, the threads and the frozen copies, with their commands:
``docs/results/performance.md``, "Evaluation: group size, threads and frozen copies".
* **Metrics.** Correct counts, train-loss sums and the micro-AUC (:mod:`utils.auc`: every
  client of a pass at once, equal to scikit-learn's) are computed where the logits are and kept
  there until the end of the evaluation, which copies them to the host in one transfer.
* **A sample of clients.** ``--eval_clients K`` evaluates K clients each evaluation instead of
  every client (PFLlib's; ``--eval_clients 0``). Left unset, a population of up to
  ``ALL_CLIENTS_UP_TO`` (10,000) clients is evaluated whole, as PFLlib does, and a larger one on a
  sample of ``DEFAULT_SAMPLE`` (1,000: the standard error of an accuracy near 0.5 is then about
  1.6 points), so that an evaluation's cost follows the sample, not the population. The sample is
  drawn without replacement from
  ``(seed, "eval_clients", round)`` (``Server.evaluate`` names the round with :meth:`Evaluator.at_round`;
  every evaluation of that round, the global model's included, takes the same sample), recorded
  once per evaluation as the series ``eval_clients`` (``rs_eval_clients`` in the h5, one row of
  client numbers per evaluation). The metrics are then those of the sampled clients, and an
  evaluation costs what K clients cost, whatever the population.
* **Other uses of a model.** :meth:`Evaluator.map_batches` runs any function of the model on the
  batches of any rows (Sageflow's entropy on its public data, the backdoor's success rate on
  stamped test images), and :meth:`Evaluator.test_accuracy` scores any classifier of each
  client's representation on its test rows (FedProto's nearest global prototype): one batching,
  eval mode and ``--eval_batch_size`` for every evaluation of a run.
* **Memory.** Models are fetched from ``params_for`` as the clients are walked, so at most
  ``G + 1`` personal vectors are alive at a time (with ``--state_device disk`` the others stay in
  their files); a tensor is recognised as shared by identity (``is``), with weak references to
  those already evaluated, so a shared tensor first seen alone costs one extra small pass, never
  a wrong result.
"""
from __future__ import annotations

import logging
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, TypeVar

import numpy as np
import torch
from torch.func import functional_call, vmap

from flcore.frozen import MIN_ROWS as FROZEN_MIN_ROWS
from flcore.frozen import FrozenCopy, close_enough, frozen_copy
from flcore.trainmodel.layout import plain_convolutions
from fldata.loading import decode_inputs
from utils.errors import FLError
from utils.seeding import numpy_rng
from utils.mem_utils import OUT_OF_MEMORY, device_room
from utils.auc import segment_micro_auc
from utils.metrics import EvalResult, combine

if TYPE_CHECKING:
    from flcore.flat import Net
    from flcore.protocol import Runtime

T = TypeVar("T")

log = logging.getLogger("fl")

#: share of a GPU's available memory that auto-sized vmap groups may take
GPU_MEMORY_SHARE = 0.25
#: activations counted per sample are the sum of every leaf module's output, times this margin
#: (vmap's batched convolution copies its input and output to and from a grouped layout)
ACTIVATION_MARGIN = 2.0


@dataclass
class _Totals:
    """PFLlib's per-client sums, filled pass by pass. The passes' results stay on the device
    (``pending``) until ``resolve`` copies them to the host in one transfer per evaluation."""

    correct: np.ndarray
    test_n: np.ndarray
    auc: np.ndarray
    loss_sum: float = 0.0
    train_n: int = 0
    pending: list = field(default_factory=list)  # (kind, clients, device tensor)

    @classmethod
    def empty(cls, n: int) -> "_Totals":
        return cls(np.zeros(n), np.zeros(n), np.full(n, np.nan))

    def resolve(self) -> None:
        """Add the pending device results to the host arrays (one device-to-host copy)."""
        if not self.pending:
            return
        values = torch.cat([t.reshape(-1).to(torch.float64) for _, _, t in self.pending]).cpu().numpy()
        start = 0
        for kind, clients, tensor in self.pending:
            part = values[start : start + tensor.numel()]
            start += tensor.numel()
            if kind == "correct":
                np.add.at(self.correct, clients, part)
            elif kind == "units":
                np.add.at(self.test_n, clients, part)
            elif kind == "auc":
                self.auc[clients] = part
            else:
                self.loss_sum += float(part.sum())
        self.pending = []


@dataclass
class _Rows:
    """Rows of one split for a list of clients: client ``clients[k]`` owns ``lens[k]`` rows
    starting at row ``starts[k]`` of the split's merged tensors."""

    clients: list[int]
    starts: list[int]
    lens: list[int]
    #: where each client's metrics go in the evaluation's totals (its position among the evaluated)
    slots: list[int]
    total: int = field(init=False)

    def __post_init__(self) -> None:
        self.total = int(sum(self.lens))


#: ``--eval_batch_size 0`` (auto) by device type: 128 on a CPU (where the batch did not matter);
#: on a GPU P1's evaluation at 128 rows a batch is ~550 batches of a few tiny kernels each, bound
#: by launches, so GPUs take 2048 (the figures: docs/results/performance.md, the GPU section)
AUTO_EVAL_BATCH = {"cpu": 128}
AUTO_EVAL_BATCH_GPU = 2048


#: left unset, --eval_clients evaluates every client of a population up to this size (PFLlib's) ...
ALL_CLIENTS_UP_TO = 10_000
#: ... and a seeded sample of this many clients of a larger one (module docstring)
DEFAULT_SAMPLE = 1_000


def default_sample(population: int) -> int:
    """The clients an evaluation takes when ``--eval_clients`` is not given (0: every client)."""
    return 0 if population <= ALL_CLIENTS_UP_TO else DEFAULT_SAMPLE


def resolve_eval_batch(requested: int, device: torch.device) -> int:
    """The evaluation batch size ``--eval_batch_size requested`` means on ``device`` (0 = auto)."""
    if requested < 0:
        raise FLError(f"--eval_batch_size must be >= 0 (0 = auto), got {requested}")
    return requested or AUTO_EVAL_BATCH.get(device.type, AUTO_EVAL_BATCH_GPU)


class Evaluator:
    """Evaluates ``params_for(i)`` on client ``i``'s data for every client (one per server)."""

    def __init__(self, runtime: "Runtime"):
        """``runtime``: the model, data, device, flags and clients it evaluates (flcore/protocol.py)."""
        args = runtime.args
        self.runtime = runtime
        self.batch_size = resolve_eval_batch(int(args.eval_batch_size), runtime.device)
        self.requested_group = int(args.eval_group)
        if self.requested_group < 0:
            raise FLError(f"--eval_group must be >= 0 (0 = auto), got {args.eval_group}")
        self._auto_group: int | None = None  # measured on first use (a GPU only)
        self._vmap_ok = True  # False once a forward failed under vmap
        self._frozen_ok = bool(args.eval_frozen)  # False once a frozen copy failed
        self.sample_size = default_sample(len(runtime.clients)) if args.eval_clients is None else int(args.eval_clients)
        self._round: int | None = None  # the round being evaluated (at_round), for the sample
        self._sample: np.ndarray | None = None
        self._position: dict[int, int] | None = None  # client -> slot in the totals, for a sample
        self._pool: ThreadPoolExecutor | None = None  # CPU batch workers, made on first use
        self._pool_workers = 0
        self._threads: int | None = None  # the process's intra-op threads while an evaluation runs (CPU)

    # ------------------------------------------------------------ public
    def at_round(self, rnd: int, record: bool = True) -> None:
        """The evaluations that follow are round ``rnd``'s: with ``--eval_clients`` they take its
        sample, which is recorded in the run's history once (``record`` False: a second evaluator of
        the same run, FedMA's at the matched widths, whose sample the server's evaluator records)."""
        if rnd == self._round:
            return
        self._round, self._sample = rnd, None
        population = len(self.runtime.clients)
        if 0 < self.sample_size < population:
            rng = numpy_rng(int(self.runtime.args.seed), "eval_clients", int(rnd))
            self._sample = np.sort(rng.choice(population, self.sample_size, replace=False))
            if record:
                self.runtime.history.add_series("eval_clients", self._sample.copy())

    def evaluated_clients(self) -> np.ndarray | None:
        """The clients the current round's evaluations take (None: every client)."""
        return self._sample

    def evaluate(self, params_for: Callable[[int], torch.Tensor], train_loss: bool = True) -> EvalResult:
        """Test accuracy/AUC on every client's test split and train loss on every train split (or on
        the current round's sample of clients, see :meth:`at_round`).

        On a CPU the batch workers are as many as the process's intra-op threads, and the rest (a
        pass of one batch, the metrics) runs on this thread with one intra-op thread: a personal
        model's pass is one small batch, and OpenMP's team stalled at each of its operations on a
        busy machine (``docs/results/performance.md``, the soak section)."""
        if self.runtime.device.type != "cpu" or self._threads is not None:
            return self._evaluate(params_for, train_loss)
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._evaluate(params_for, train_loss)
        finally:
            torch.set_num_threads(self._threads)
            self._threads = None

    def _evaluate(self, params_for: Callable[[int], torch.Tensor], train_loss: bool) -> EvalResult:
        runtime = self.runtime
        sample = self._sample
        members = range(len(runtime.clients)) if sample is None else sample.tolist()
        n = len(members)
        splits = ("test", "train") if train_loss and runtime.args.eval_train_loss else ("test",)
        totals = _Totals.empty(n)
        #: the metrics are indexed by position in ``members``; the passes see client numbers
        self._position = None if sample is None else {client: k for k, client in enumerate(members)}
        group = self.group_size(n)
        shared: dict[int, tuple[torch.Tensor, list[int]]] = {}  # id -> (tensor, clients)
        pending: dict[int, tuple[torch.Tensor, int]] = {}  # id -> (personal tensor, client), in order
        seen: dict[int, weakref.ref] = {}  # id -> tensors already evaluated for one client
        for i in members:
            params = params_for(i)
            key = id(params)
            if key in shared:  # held alive in ``shared``, so the id is this very tensor
                shared[key][1].append(i)
                continue
            if key in pending:
                first = pending.pop(key)[1]
                shared[key] = (params, [first, i])
                continue
            earlier = seen.get(key)
            if earlier is not None and earlier() is params:
                shared[key] = (params, [i])
                continue
            pending[key] = (params, i)
            # Keep one more than a group, so that a tensor the next client shares is not yet gone.
            if len(pending) > group:
                self._flush(pending, group, seen, splits, totals)
        while pending:
            self._flush(pending, group, seen, splits, totals)
        for params, clients in shared.values():
            self._evaluate_shared(params, sorted(clients), splits, totals)
        totals.resolve()
        return combine(totals.correct, totals.test_n, totals.auc, totals.loss_sum, totals.train_n)

    @torch.no_grad()
    def map_batches(self, params: torch.Tensor, x: torch.Tensor, fn: Callable[[Net, torch.Tensor], T],
                    table: torch.Tensor | None = None, rows: torch.Tensor | None = None,
                    batch_size: int = 0) -> list[T]:
        """``fn(net, inputs)`` on each batch of the rows ``rows`` of ``x`` (every row by default),
        decoded with ``table`` (``decode_inputs``), ``net`` the model ``params`` in eval mode
        (``Net.at``: the working model's vector is left as it is); the results in batch order, of
        ``batch_size`` rows each (0: ``--eval_batch_size``)."""
        module = self.runtime.model.module
        was_training = module.training
        module.eval()
        net = self.runtime.model.net.at(params)
        step = batch_size or self.batch_size
        count = len(x) if rows is None else len(rows)
        try:
            return [fn(net, decode_inputs(x[i: i + step] if rows is None else x[rows[i: i + step]], table))
                    for i in range(0, count, step)]
        finally:
            module.train(was_training)

    def test_accuracy(self, params_for: Callable[[int], torch.Tensor],
                      predict: Callable[[Net, torch.Tensor], torch.Tensor]) -> float:
        """The share of all clients' test rows whose class ``predict(net, inputs)`` gives (class
        indices, one per row) under client ``i``'s model ``params_for(i)`` is their label (NaN
        without test rows)."""
        dataset = self.runtime.dataset
        x, y = dataset.split("test")
        correct = 0
        for i in range(len(self.runtime.clients)):
            rows = self._rows("test", [i])
            start, stop = rows.starts[0], rows.starts[0] + rows.total
            if rows.total:
                predicted = self.map_batches(params_for(i), x[start:stop], predict, dataset.input_table)
                correct += int((torch.cat(predicted) == y[start:stop]).sum())
        return correct / len(y) if len(y) else float("nan")

    def group_size(self, n: int) -> int:
        """Personal models evaluated at once: ``--eval_group``, or auto (see the module docstring)."""
        if self.requested_group > 0:
            return max(1, min(self.requested_group, n))
        if self.runtime.device.type != "cuda":
            return 1
        if self._auto_group is None:
            self._auto_group = self._group_for_memory()
        return max(1, min(self._auto_group, n))

    # ------------------------------------------------------------ passes
    def _flush(self, pending: dict, group: int, seen: dict, splits: tuple[str, ...], totals: _Totals) -> None:
        """Evaluate the oldest ``group`` pending personal models and forget them."""
        keys = list(pending)[:group]
        batch = [pending.pop(k) for k in keys]
        for key, (params, _) in zip(keys, batch):
            seen[key] = weakref.ref(params)
        clients = [client for _, client in batch]
        vectors = [params for params, _ in batch]
        if len(batch) == 1 or not self._vmap_ok:
            for client, params in zip(clients, vectors):
                self._evaluate_one(params, client, splits, totals)
            return
        self._evaluate_stacked(clients, vectors, splits, totals)

    def _evaluate_shared(self, params: torch.Tensor, clients: list[int], splits: tuple[str, ...], totals: _Totals) -> None:
        """One model on the concatenated rows of ``clients`` (ascending), in the working module."""
        for split in splits:
            x, y = self.runtime.dataset.split(split)
            rows = self._rows(split, clients)
            if rows.total == len(y):  # every row: the merged tensors themselves, no copy
                xs, ys = x, y
            elif len(clients) == 1:
                xs, ys = x[rows.starts[0] : rows.starts[0] + rows.total], y[rows.starts[0] : rows.starts[0] + rows.total]
            else:
                index = self._row_index(rows, y.device)
                xs, ys = x[index], y[index]
            logits = self._forward(params, xs)
            self._accumulate(split, logits, ys, rows, totals)

    def _evaluate_one(self, params: torch.Tensor, client: int, splits: tuple[str, ...], totals: _Totals) -> None:
        """One client's own model on its test and train rows, in one pass: a personal model is
        loaded once and its few rows make fewer, fuller batches than split by split."""
        parts = []
        for split in splits:
            x, y = self.runtime.dataset.split(split)
            rows = self._rows(split, [client])
            start, stop = rows.starts[0], rows.starts[0] + rows.total
            parts.append((split, rows, x[start:stop], y[start:stop]))
        xs = parts[0][2] if len(parts) == 1 else torch.cat([part[2] for part in parts])
        logits = self._forward(params, xs)
        offset = 0
        for split, rows, _, ys in parts:
            self._accumulate(split, logits[offset : offset + rows.total], ys, rows, totals)
            offset += rows.total

    def _evaluate_stacked(self, clients: list[int], vectors: list[torch.Tensor], splits: tuple[str, ...], totals: _Totals) -> None:
        """Several personal models at once under vmap; halves the group when memory runs out.

        All logits are computed before any metric is added, so a retry never counts a client twice."""
        try:
            stacked = torch.stack([v.to(self.runtime.device, self._dtype) for v in vectors])
            passes = [(split, self._rows(split, clients)) for split in splits]
            logits = [self._forward_stacked(stacked, split, rows) for split, rows in passes]
        except OUT_OF_MEMORY:
            if len(clients) == 1:
                raise
            half = len(clients) // 2
            log.warning("evaluation: out of memory with %d models at once; trying %d", len(clients), half)
            if self.requested_group == 0 and self._auto_group is not None:
                self._auto_group = min(self._auto_group, half)
            self._evaluate_stacked(clients[:half], vectors[:half], splits, totals)
            self._evaluate_stacked(clients[half:], vectors[half:], splits, totals)
            return
        except _VmapUnsupported:
            for client, params in zip(clients, vectors):
                self._evaluate_one(params, client, splits, totals)
            return
        for (split, rows), split_logits in zip(passes, logits):
            y = self.runtime.dataset.split(split)[1]
            self._accumulate(split, split_logits, y[self._row_index(rows, y.device)], rows, totals)

    # ------------------------------------------------------------ forward passes
    @property
    def _dtype(self) -> torch.dtype:
        return self.runtime.model.vector.dtype

    @torch.no_grad()  # only the passes: ``params_for`` may train (PerAvg adapts with a gradient step)
    def _forward(self, params: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Logits of the model ``params`` on ``x`` in batches (eval mode), in the working module."""
        runtime = self.runtime
        runtime.model.load(params)
        runtime.model.module.eval()
        bs = self.balanced_batch(len(x))
        table = runtime.dataset.input_table  # uint8 input codes are decoded batch by batch
        logits = torch.zeros(len(x), runtime.num_classes, dtype=self._dtype, device=runtime.device)
        # Written into one tensor allocated up front: keeping a small output per batch alive between
        # the batches' large activations fragmented glibc's heap, which then grew by up to 1.5 GB
        # over one P1 evaluation (freed but never reused; measured with mallinfo2).
        module = runtime.model.module
        copy = self._frozen_module(module, x, table)
        forward = copy or module

        def one_batch(start: int) -> None:  # disjoint rows of ``logits``: workers never overlap
            logits[start : start + bs] = forward(decode_inputs(x[start : start + bs], table))

        starts = range(0, len(x), bs)
        workers = self.batch_workers() if len(starts) > 1 else 1
        try:
            if workers <= 1:
                for start in starts:
                    one_batch(start)
            else:
                list(self._executor(workers).map(_on_one_thread, [one_batch] * len(starts), starts))
        finally:
            if copy is not None:
                copy.release()  # PyTorch would keep its graphs for the life of the process (flcore/frozen.py)
        if not runtime.dataset.inputs_checked and x.is_floating_point() and not bool(torch.isfinite(logits).all()):
            bad = int(x.numel() - torch.isfinite(x).sum())  # inputs not checked at start-up (a packed folder)
            if bad:
                raise FLError(f"the evaluated rows of dataset {runtime.dataset.name} hold {bad} NaN or infinite input "
                              f"values; find them with dataset/convert_layout.py {runtime.dataset.path} --check")
        if copy is not None and not close_enough(logits[:bs], module(decode_inputs(x[:bs], table))):
            self._no_frozen("its logits differed from the eager model's beyond float rounding")
            return self._forward(params, x)
        return logits

    def _frozen_module(self, module: torch.nn.Module, x: torch.Tensor, table) -> FrozenCopy | None:
        """A frozen copy of the working module for this pass (``flcore/frozen.py``; released by the
        caller when the pass is done), or None: off
        (``--eval_frozen False``), not a CPU, a pass too short to pay for the copy, or a model it
        failed for before."""
        if not self._frozen_ok or self.runtime.device.type != "cpu" or len(x) < FROZEN_MIN_ROWS:
            return None
        try:
            return frozen_copy(module, decode_inputs(x[:2], table))
        except RuntimeError as exc:
            self._no_frozen(str(exc))
            return None

    def _no_frozen(self, why: str) -> None:
        """Evaluate eagerly from now on, and say so once."""
        self._frozen_ok = False
        log.info("evaluation: no frozen copy of the model (%s); evaluating it eagerly", why)

    def batch_workers(self) -> int:
        """Threads the batches of a CPU pass are spread over: the process's intra-op thread count
        (1 inside an engine's worker thread, which trains on one); a GPU takes batch after batch."""
        if self.runtime.device.type != "cpu":
            return 1
        return torch.get_num_threads() if self._threads is None else self._threads

    def _executor(self, workers: int) -> ThreadPoolExecutor:
        if self._pool is None or self._pool_workers != workers:
            self.close()
            self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fl-eval")
            self._pool_workers = workers
        return self._pool

    def close(self) -> None:
        """Release the batch workers (the run is over)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def balanced_batch(self, rows: int) -> int:
        """The batch size that covers ``rows`` in as many batches as ``--eval_batch_size`` does,
        with sizes as equal as possible (225 rows: 113 + 112, not 128 + 97)."""
        if rows <= 0:
            return self.batch_size
        batches = -(-rows // self.batch_size)
        return -(-rows // batches)

    @torch.no_grad()
    def _forward_stacked(self, stacked: torch.Tensor, split: str, rows: _Rows) -> torch.Tensor:
        """Logits of model ``stacked[k]`` on client ``rows.clients[k]``'s rows, concatenated in
        client order. Step ``s`` runs rows ``s*B .. s*B+B-1`` of every client that still has some."""
        runtime = self.runtime
        device = runtime.device
        x, _ = runtime.dataset.split(split)
        table = runtime.dataset.input_table
        lens = torch.tensor(rows.lens, dtype=torch.long, device=device)
        starts = torch.tensor(rows.starts, dtype=torch.long, device=device)
        order = torch.argsort(lens, descending=True, stable=True)  # active clients form a prefix
        lens, starts, stacked = lens[order], starts[order], stacked[order.to(stacked.device)]
        out_start = torch.tensor([0, *np.cumsum(rows.lens)[:-1].tolist()], dtype=torch.long, device=device)[order]
        logits = torch.zeros(rows.total, runtime.num_classes, dtype=self._dtype, device=device)
        module = runtime.model.module
        module.eval()
        bs = self.batch_size
        longest = int(lens[0]) if len(rows.lens) else 0
        sorted_lens = lens.tolist()

        def one_model(named: dict[str, torch.Tensor], xb: torch.Tensor) -> torch.Tensor:
            return functional_call(module, named, (xb,))

        for step in range(0, longest, bs):
            active = sum(1 for length in sorted_lens if length > step)
            pos = step + torch.arange(min(bs, longest - step), device=device)
            valid = pos.unsqueeze(0) < lens[:active].unsqueeze(1)
            # rows past a client's end repeat its last row (computed, then dropped)
            src = starts[:active].unsqueeze(1) + torch.minimum(pos.unsqueeze(0), (lens[:active] - 1).unsqueeze(1))
            xb = decode_inputs(x[src], table)
            named = runtime.model.unflatten(stacked[:active], params_only=False)
            try:
                with plain_convolutions():
                    out = vmap(one_model)(named, xb)
            except OUT_OF_MEMORY:
                raise
            except (RuntimeError, NotImplementedError) as exc:
                # a model vmap cannot run (an op without a batching rule): client by client from now on
                self._vmap_ok = False
                log.info("evaluation: the model cannot run under torch.func.vmap (%s); evaluating client by client",
                         str(exc).splitlines()[0][:200])
                raise _VmapUnsupported from exc
            dest = out_start[:active].unsqueeze(1) + pos.unsqueeze(0)
            logits[dest[valid]] = out[valid].to(self._dtype)
        return logits

    # ------------------------------------------------------------ bookkeeping
    def _rows(self, split: str, clients: list[int]) -> _Rows:
        bounds = self.runtime.dataset.bounds(split)  # client c: rows bounds[c]:bounds[c + 1]
        index = np.asarray(clients, dtype=np.int64)
        starts = bounds[index]
        slots = clients if self._position is None else [self._position[c] for c in clients]
        return _Rows(clients, starts.tolist(), (bounds[index + 1] - starts).tolist(), slots)

    @staticmethod
    def _row_index(rows: _Rows, device: torch.device) -> torch.Tensor:
        """Row numbers of ``rows`` in client order (one index tensor for one gather)."""
        lens = torch.tensor(rows.lens, dtype=torch.long)
        starts = torch.tensor(rows.starts, dtype=torch.long)
        first_out = torch.cumsum(lens, 0) - lens
        within = torch.arange(rows.total) - torch.repeat_interleave(first_out, lens)
        return (torch.repeat_interleave(starts, lens) + within).to(device)

    def _accumulate(self, split: str, logits: torch.Tensor, y: torch.Tensor, rows: _Rows, totals: _Totals) -> None:
        """Add the metrics of ``logits`` (rows of ``rows.clients`` in order, labels ``y``)."""
        objective = self.runtime.objective  # the label type's loss and metrics (flcore/objectives.py)
        if split == "train":
            totals.pending.append(("loss", rows.slots, objective.loss(logits, y, reduction="sum")))
            totals.train_n += len(y)
            return
        lens = torch.tensor(rows.lens, dtype=torch.long, device=y.device)
        block = torch.repeat_interleave(torch.arange(len(rows.clients), device=y.device), lens)

        def per_client(values: torch.Tensor) -> torch.Tensor:
            return torch.zeros(len(rows.clients), dtype=torch.float64, device=y.device).index_add_(0, block, values)

        totals.pending.append(("correct", rows.slots, per_client(objective.hits(logits, y))))
        units = objective.units(y)  # what the hits are out of: a sample each, or (multi-label) its labels
        if units is None:
            totals.test_n[rows.slots] += np.asarray(rows.lens, dtype=np.float64)
        else:
            totals.pending.append(("units", rows.slots, per_client(units)))
        if self.runtime.args.eval_auc:  # every client's micro-AUC at once, on the device (utils/auc.py)
            positives = objective.positives(y, logits.shape[1])
            totals.pending.append(("auc", rows.slots, segment_micro_auc(objective.scores(logits), y, lens, positives)))

    # ------------------------------------------------------------ memory
    def _group_for_memory(self) -> int:
        """Clients whose stacked vectors and activations at one step fit the memory share."""
        runtime = self.runtime
        room = device_room(runtime.device)
        if room is None:
            return 1
        per_client = runtime.model.vector.numel() * runtime.model.vector.element_size()
        per_client += self.batch_size * self._activation_bytes_per_sample()
        return max(1, int(room[0] * GPU_MEMORY_SHARE // max(per_client, 1)))

    @torch.no_grad()
    def _activation_bytes_per_sample(self) -> int:
        """Bytes of every leaf module's output for one sample (eval mode), with a margin."""
        runtime = self.runtime
        for split in ("test", "train"):
            x, _ = runtime.dataset.split(split)
            if len(x):
                break
        else:
            return 0
        sample = decode_inputs(x[:1], runtime.dataset.input_table)
        total = [sample.numel() * sample.element_size()]

        def count(_module, _inputs, output) -> None:
            if isinstance(output, torch.Tensor):
                total[0] += output.numel() * output.element_size()

        module = runtime.model.module
        module.eval()
        leaves = [m for m in module.modules() if not list(m.children())]
        handles = [m.register_forward_hook(count) for m in leaves]
        try:
            module(sample)
        finally:
            for handle in handles:
                handle.remove()
        return int(total[0] * ACTIVATION_MARGIN)


_batch_thread = threading.local()


def _on_one_thread(work, *args) -> None:
    """``work(*args)`` in an evaluation worker: one intra-op thread (OpenMP's count is per thread,
    set once per worker) and no autograd graph (grad mode is per thread too)."""
    if not getattr(_batch_thread, "single", False):
        torch.set_num_threads(1)
        _batch_thread.single = True
    with torch.no_grad():
        work(*args)


class _VmapUnsupported(Exception):
    """Raised inside a vmap group when the model cannot run under vmap (handled by the caller)."""
