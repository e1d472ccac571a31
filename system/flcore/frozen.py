"""A frozen inference copy of a model, for evaluation on a CPU (``--eval_frozen``, off by default).

``torch.jit.trace`` records the model's forward pass on two example rows, ``torch.jit.freeze``
turns its current parameters into constants and ``torch.jit.optimize_for_inference`` rewrites the
graph for oneDNN: convolution weights prepacked once instead of reordered at every batch,
convolution + ReLU fused, activations kept in oneDNN's blocked layout between layers. Logits equal
the eager module's up to float rounding (about 1e-7 for the CNNs).

On a CPU a frozen copy evaluates faster than the eager module with the same accuracy, AUC and loss (figures
and their command: docs/results/performance.md, "Evaluation: group size, threads and frozen copies"). A copy
costs about 25 ms of CPU (trace about 20, freeze and optimise about 5), so only passes of at least
``MIN_ROWS`` rows use one (one batch saves about 12 ms). It is rebuilt for every pass: it holds the
parameters of the pass as constants (that is what lets oneDNN prepack them), and tracing afresh also picks
up any Python attribute of the model that changed since (a traced graph keeps such values as constants).

**Memory.** TorchScript registers every traced module's types and methods (graphs, optimised plans) in its
global compilation unit, ``torch.jit._state._python_cu``, and never removes them (pytorch#35600, #96726): a
copy per pass kept 18-25 MB of P1's CNN when traced on 128 rows, ~3 MB on the 2 rows used here. So each copy
is built into a compilation unit of its own (the global one is swapped out while tracing, freezing and
optimising; TorchScript's C++ side reads it from there), and :meth:`FrozenCopy.release` drops that unit's
functions when the pass is done, then hands the heap's free pages back (:func:`return_free_heap_pages`).
With both, RSS stays level over evaluations where the global unit grew it by megabytes each time
(``experiments/frozen_eval_memory.py``; figures in docs/results/performance.md, "Evaluation: group size,
threads and frozen copies"). What stays: 12 small Python classes per copy (TorchScript's
``QualnameWrapper``, held from C++) and the heap's address space (its free holes, not resident); over many
evaluations RSS still grows slowly where the eager run stays flat (docs/results/performance.md, "Frozen
evaluation copies over 200 evaluations, against eager"): that is why ``--eval_frozen`` stays off by default.
Ways that do not help: one traced copy per model object reused across passes (it shares the parameters, so
it sees the loaded weights, and does not grow), traced and frozen without ``optimize_for_inference`` (its
constants alias the parameters here), or a trace with the weights as graph inputs: all run at the eager
speed, because the gain is all in oneDNN's prepacked constant weights.

Not used (the eager module runs, and the evaluator says so once) when the model has forward hooks
(tracing would run them once, on the example rows, and the frozen copy never), when tracing
warns that the graph may not generalise (data-dependent Python control flow), or when tracing or
freezing fails (also where a PyTorch release lacks the private compilation-unit hook). The evaluator
also compares the copy's first batch with the eager module's and falls back when they differ beyond
float rounding. Other ways to the same end, ``torch.compile`` of the forward pass (its own kernels
for max-pooling) and oneDNN tensors through ``torch.utils.mkldnn`` (layout conversions at every
layer), were slower than eager (``docs/results/performance.md``, "Tried, not kept"). TorchScript is deprecated in PyTorch; if a release drops it, the fallback keeps
evaluation correct.
"""
from __future__ import annotations

import ctypes
import threading
import warnings

import torch
from torch import nn

from utils.allocator import glibc_version

#: passes with fewer rows run the eager module (a frozen copy costs about as much as 2 batches)
MIN_ROWS = 512
#: how far the frozen copy's logits may be from the eager module's (relative to their largest magnitude)
TOLERANCE = 1e-4


def unfreezable_reason(module: nn.Module) -> str | None:
    """Why ``module`` must run eagerly (None when a frozen copy may be built)."""
    from torch.nn.modules import module as module_globals

    for name in ("_global_forward_hooks", "_global_forward_pre_hooks"):
        if getattr(module_globals, name, None):
            return "global forward hooks are registered"
    for sub in module.modules():
        if sub._forward_hooks or sub._forward_pre_hooks:
            return f"{type(sub).__name__} has forward hooks"
    return None


class FrozenCopy:
    """A frozen copy of a module for one evaluation pass: call it like the module, then :meth:`release` it."""

    def __init__(self, script: torch.jit.ScriptModule, unit):
        self._script, self._unit = script, unit

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._script is None:  # its methods are gone: running it would read freed memory
            raise RuntimeError("this frozen copy was released")
        return self._script(x)

    def release(self) -> None:
        """Free the copy's graphs and constants (its compilation unit's functions) and give the heap's
        free pages back to the system; it cannot run after."""
        if self._script is not None:
            self._script = None
            self._unit.drop_all_functions()
            return_free_heap_pages()


def return_free_heap_pages() -> None:
    """glibc's ``malloc_trim(0)``: the heap's free pages go back to the system. Building and freeing a
    copy leaves holes in the heap that later blocks do not fill (malloc's live bytes stay flat while
    its free bytes grow by megabytes per evaluation); without this they stay resident. It also returns what
    ``--malloc_keep_freed`` keeps, which training then faults in again once a pass (a few ms)."""
    if glibc_version() is not None:
        ctypes.CDLL(None).malloc_trim(0)


#: the global compilation unit is swapped while a copy is built: one build at a time (TorchScript code
#: compiled by another thread meanwhile would land in the copy's unit; nothing in the platform does that)
_BUILDING = threading.Lock()


@torch.no_grad()
def frozen_copy(module: nn.Module, example: torch.Tensor) -> FrozenCopy:
    """A frozen, oneDNN-optimised copy of ``module`` (in eval mode) with its current parameters, in a
    compilation unit of its own; the caller releases it when the pass is done.

    Raises ``RuntimeError`` (with the reason) where the copy cannot be trusted or built."""
    reason = unfreezable_reason(module)
    if reason is not None:
        raise RuntimeError(reason)
    state = torch.jit._state
    if not (hasattr(state, "_python_cu") and hasattr(torch._C.CompilationUnit, "drop_all_functions")):
        raise RuntimeError("this PyTorch has no compilation unit a copy could be freed from")
    with warnings.catch_warnings(), _BUILDING:
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript's own deprecation notices
        warnings.simplefilter("error", torch.jit.TracerWarning)  # the trace may not hold for other inputs
        unit, shared = torch._C.CompilationUnit(), state._python_cu
        state._python_cu = unit  # where the C++ side registers the traced, frozen and optimised types
        try:
            traced = torch.jit.trace(module, example, check_trace=False)
            return FrozenCopy(torch.jit.optimize_for_inference(torch.jit.freeze(traced)), unit)
        except torch.jit.TracerWarning as warning:
            raise RuntimeError(f"tracing warned: {str(warning).splitlines()[0][:200]}") from None
        except Exception as exc:  # noqa: BLE001  (any failure means: run the eager module)
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            raise RuntimeError(f"{type(exc).__name__}: {first}") from exc
        finally:
            state._python_cu = shared


def close_enough(frozen: torch.Tensor, eager: torch.Tensor) -> bool:
    """Whether the frozen copy's logits equal the eager module's up to float rounding."""
    if frozen.shape != eager.shape:
        return False
    if not eager.numel():
        return True
    finite = eager[torch.isfinite(eager)]
    scale = max(float(finite.abs().max()) if finite.numel() else 0.0, 1.0)
    return torch.allclose(frozen, eager, rtol=0.0, atol=TOLERANCE * scale, equal_nan=True)
