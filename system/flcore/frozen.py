"""A frozen inference copy of a model, for evaluation on a CPU (``--eval_frozen``, on by default).

``torch.jit.trace`` records the model's forward pass on two example rows, ``torch.jit.freeze``
turns its current parameters into constants and ``torch.jit.optimize_for_inference`` rewrites the
graph for oneDNN: convolution weights prepacked once instead of reordered at every batch,
convolution + ReLU fused, activations kept in oneDNN's blocked layout between layers. Logits equal
the eager module's up to float rounding (about 1e-7 for the CNNs).

Measured on the project's 2-core EPYC (torch 2.13, P1's MNIST CNN, batch 128, one intra-op thread,
CPU time, eager and frozen interleaved in one process at a load of 6-9;
``experiments/issue28_step_variants.py --part eval|evaluation``): on real MNIST rows 8,357 rows per
CPU second eager, 10,618 frozen (1.27x; 1.6-1.9x on random inputs at a higher load); a whole P1
evaluation (70,000 rows) 8.59 -> 7.09 CPU s with the same accuracy, AUC and loss to 8 digits.
A copy costs about 25 ms of CPU (trace about 20, freeze and optimise about 5), so only passes of at
least ``MIN_ROWS`` rows use one (one batch saves about 12 ms). It is rebuilt for every pass: it holds the
parameters of the pass, and tracing afresh also picks up any Python attribute of the model that
changed since (a traced graph keeps such values as constants).

Not used (the eager module runs, and the evaluator says so once) when the model has forward hooks
(tracing would run them once, on the example rows, and the frozen copy never), when tracing
warns that the graph may not generalise (data-dependent Python control flow), or when tracing or
freezing fails. The evaluator also compares the copy's first batch with the eager module's and
falls back when they differ beyond float rounding. Other ways to the same end were measured slower on this CPU
(same script): ``torch.compile`` of the forward pass 0.73x the eager time per batch (its own
kernels for max-pooling), oneDNN tensors through ``torch.utils.mkldnn`` 0.77x (layout conversions
at every layer). TorchScript is deprecated in PyTorch; if a release drops it, the fallback keeps
evaluation correct.
"""
from __future__ import annotations

import warnings

import torch
from torch import nn

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


@torch.no_grad()
def frozen_copy(module: nn.Module, example: torch.Tensor) -> torch.jit.ScriptModule:
    """A frozen, oneDNN-optimised copy of ``module`` (in eval mode) with its current parameters.

    Raises ``RuntimeError`` (with the reason) where the copy cannot be trusted or built."""
    reason = unfreezable_reason(module)
    if reason is not None:
        raise RuntimeError(reason)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript's own deprecation notices
        warnings.simplefilter("error", torch.jit.TracerWarning)  # the trace may not hold for other inputs
        try:
            traced = torch.jit.trace(module, example, check_trace=False)
            return torch.jit.optimize_for_inference(torch.jit.freeze(traced))
        except torch.jit.TracerWarning as warning:
            raise RuntimeError(f"tracing warned: {str(warning).splitlines()[0][:200]}") from None
        except Exception as exc:  # noqa: BLE001  (any failure means: run the eager module)
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            raise RuntimeError(f"{type(exc).__name__}: {first}") from exc


def close_enough(frozen: torch.Tensor, eager: torch.Tensor) -> bool:
    """Whether the frozen copy's logits equal the eager module's up to float rounding."""
    if frozen.shape != eager.shape:
        return False
    if not eager.numel():
        return True
    finite = eager[torch.isfinite(eager)]
    scale = max(float(finite.abs().max()) if finite.numel() else 0.0, 1.0)
    return torch.allclose(frozen, eager, rtol=0.0, atol=TOLERANCE * scale, equal_nan=True)
