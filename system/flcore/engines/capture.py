"""How the batched engine runs its cohort step: eagerly, replayed from a CUDA graph, or compiled.

The batched engine's step (``batched.py``: gather the minibatches, vmapped forward and loss hook,
gradients, ``adjust_grad``, the SGD update, the masks of retired clients) is one Python function
``fn(state, inputs, consts)`` that updates ``state`` in place. A :class:`StepRunner` decides how
it runs:

* :class:`EagerStepRunner` calls it directly on the engine's tensors (``--step_runner eager``,
  and ``auto`` on a CPU). It trains exactly the clients that still have a batch (``rows_for``
  returns the active count), so no FLOPs are spent on retired clients.
* :class:`StaticStepRunner` keeps *static* buffers: the state of the chunk, its constants
  (learning rates, context) and the per-step inputs (batch rows, masks). A chunk copies the
  state in once (``open``), each step copies its few inputs in and replays, and ``close``
  copies the state back; the step function trains the first n rows of the buffers, so one set
  of buffers serves every row count. On CUDA (``graph``, ``auto`` on a GPU) the replay
  is a CUDA graph captured on first use per (function, shapes): one launch instead of hundreds
  of kernel launches and the Python of vmap, which dominate a batch-10 step. ``compiled`` replays a
  ``torch.compile`` of the function on the same buffers. On a CPU, or after a capture failed,
  the replay is the eager function on the static buffers: the same code path, which is what the
  CPU tests exercise.
* **Shapes.** A graph has fixed shapes, and in a ragged cohort the number of clients that still
  have a batch shrinks. The static runner therefore trains a *bucket* of rows: the active count
  rounded up to a power of two (at most the chunk), with a per-row ``active`` mask that keeps the
  retired clients' rows exactly as they are (``torch.where``). So a chunk of K clients needs
  about 2 log2(K) graphs (with and without retired rows), reused across rounds while K and the
  batch size stay; they share the chunk's buffers and one memory pool.
* **Fallback.** A step that cannot be captured (data-dependent control flow, a host sync such as
  ``.item()`` in a loss hook) is run eagerly from then on, with one notice. DP-SGD's clients
  (Poisson batches, per-sample clipping) never reach the batched step: the engine trains them
  sequentially.

``auto`` takes the graph: on the GPU it measured nearly as fast as ``compiled`` without a compile
per bucket shape; the graphs' pool costs GPU memory beyond the eager step's. The figures are in
``docs/results/performance.md`` ("How fast against PFLlib on a GPU").

Graphs share one memory pool (they are replayed one after another on one stream), and capture
happens inside the engine's ``no_grad`` and layout contexts, so replays see the same settings.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

#: ``--step_runner`` values; ``auto`` is ``graph`` on CUDA and ``eager`` elsewhere
STEP_RUNNERS = ("auto", "eager", "graph", "compiled")

StepFn = Callable[[dict, dict, dict], None]


def bucket(active: int, total: int) -> int:
    """The rows a static step trains for ``active`` clients of ``total``: the next power of two."""
    if active >= total:
        return total
    size = 1
    while size < active:
        size *= 2
    return min(size, total)


def _signature(tree: Any) -> tuple:
    """Hashable structure of a tree: tensors by (shape, dtype, device), other leaves by value."""
    leaves, spec = tree_flatten(tree)
    sig = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            sig.append(("T", tuple(leaf.shape), leaf.dtype, leaf.device))
        else:
            try:
                hash(leaf)
                sig.append(("V", leaf))
            except TypeError:
                sig.append(("R", repr(leaf)))
    return (str(spec), tuple(sig))


def _static_copy(tree: Any) -> Any:
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec)


def _copy_into(dest: Any, src: Any) -> None:
    for d, s in zip(tree_flatten(dest)[0], tree_flatten(src)[0]):
        if isinstance(d, torch.Tensor):
            d.copy_(s, non_blocking=True)


class Segment:
    """The steps of one chunk: ``step(fn, inputs)`` each, then ``close()``."""

    def step(self, fn: StepFn, inputs: dict) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Leave the trained state in the tensors given to ``open``."""


class StepRunner:
    """Runs the cohort step; ``rows_for`` says how many rows a step over ``active`` clients trains."""

    name = "eager"

    def rows_for(self, active: int, total: int) -> int:
        return active

    def open(self, state: dict, consts: dict) -> Segment:
        raise NotImplementedError


class _EagerSegment(Segment):
    def __init__(self, state: dict, consts: dict):
        self.state, self.consts = state, consts

    def step(self, fn: StepFn, inputs: dict) -> None:
        fn(self.state, inputs, self.consts)


class EagerStepRunner(StepRunner):
    """The step as plain PyTorch calls on the engine's own tensors (no copies)."""

    name = "eager"

    def open(self, state: dict, consts: dict) -> Segment:
        return _EagerSegment(state, consts)


class _Slot:
    """Static state and constants of one chunk shape, with the replays captured on them."""

    def __init__(self, state: dict, consts: dict):
        self.state = _static_copy(state)
        self.consts = _static_copy(consts)
        self.replays: dict[tuple, tuple[dict, Callable[[], None]]] = {}


class _StaticSegment(Segment):
    def __init__(self, runner: "StaticStepRunner", slot: _Slot, origin: dict):
        self.runner, self.slot, self.origin = runner, slot, origin

    def step(self, fn: StepFn, inputs: dict) -> None:
        slot = self.slot
        key = (id(fn), _signature(inputs))
        entry = slot.replays.get(key)
        if entry is None:
            entry = self.runner.prepare(fn, slot, inputs)
            slot.replays[key] = entry
        static_inputs, replay = entry
        _copy_into(static_inputs, inputs)
        replay()

    def close(self) -> None:
        _copy_into(self.origin, self.slot.state)


class StaticStepRunner(StepRunner):
    """Static buffers per row count; the step replayed from a CUDA graph (``mode="graph"``), a
    ``torch.compile`` of it (``"compiled"``), or run eagerly on the buffers (``"replay"``).

    ``notice(message)`` reports a fallback (once per message, by the engine)."""

    def __init__(self, mode: str, device: torch.device, notice: Callable[[str], None] = lambda _m: None):
        if mode not in ("graph", "compiled", "replay"):
            raise ValueError(mode)
        self.mode, self.device, self.notice = mode, device, notice
        self.name = mode
        self.slots: dict[tuple, _Slot] = {}
        self.captured = 0  # graphs captured (for tests and the benchmark)
        self._capture_ok = mode in ("graph", "compiled") and device.type == "cuda"
        self._pool = torch.cuda.graph_pool_handle() if self._capture_ok else None
        self._compiled: dict[int, Callable] = {}

    def rows_for(self, active: int, total: int) -> int:
        return bucket(active, total)

    def open(self, state: dict, consts: dict) -> Segment:
        key = (_signature(state), _signature(consts))
        slot = self.slots.get(key)
        if slot is None:
            slot = self.slots[key] = _Slot(state, consts)
        else:
            _copy_into(slot.state, state)
            _copy_into(slot.consts, consts)
        return _StaticSegment(self, slot, state)

    # ------------------------------------------------------------ replays
    def prepare(self, fn: StepFn, slot: _Slot, inputs: dict) -> tuple[dict, Callable[[], None]]:
        """Static inputs and the replay of ``fn`` on the slot's buffers (captured when possible)."""
        static_inputs = _static_copy(inputs)
        run = fn
        saved = _static_copy(slot.state)  # trial and warm-up steps update the state: undone below
        try:
            if self.mode == "compiled":
                run = self._compiled.get(id(fn))
                if run is None:
                    run = self._compiled[id(fn)] = torch.compile(fn, dynamic=False)
                run(slot.state, static_inputs, slot.consts)  # compiles now, so a failure is a fallback
            if not self._capture_ok:
                return static_inputs, lambda: run(slot.state, static_inputs, slot.consts)
            graph = self._capture(run, slot, static_inputs)
        except Exception as exc:  # noqa: BLE001 - uncapturable or uncompilable: eager from now on, one notice
            what = "torch.compile failed" if self.mode == "compiled" else "the step cannot be captured in a CUDA graph"
            self.notice(f"step runner {self.mode}: {what} ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); running the step eagerly")
            self.mode, self._capture_ok = "replay", False
            return static_inputs, lambda: fn(slot.state, static_inputs, slot.consts)
        finally:
            _copy_into(slot.state, saved)
        self.captured += 1
        return static_inputs, graph.replay

    def _capture(self, run: StepFn, slot: _Slot, static_inputs: dict) -> "torch.cuda.CUDAGraph":
        # warm up on a side stream (lazy initialisations must not happen during capture)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                run(slot.state, static_inputs, slot.consts)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            run(slot.state, static_inputs, slot.consts)
        return graph


def make_step_runner(name: str, device: torch.device, notice: Callable[[str], None]) -> StepRunner:
    """The runner ``--step_runner name`` gives on ``device`` (one notice where it must fall back)."""
    if name == "auto":
        name = "graph" if device.type == "cuda" else "eager"
    if name == "eager":
        return EagerStepRunner()
    if name == "graph" and device.type != "cuda":
        notice(f"step runner graph: CUDA graphs need a GPU, not {device.type}; replaying the step eagerly")
        return StaticStepRunner("replay", device, notice)
    return StaticStepRunner(name, device, notice)
