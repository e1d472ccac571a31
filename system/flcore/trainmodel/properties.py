"""What engines and privacy need to know of a model's layers, next to the model code.

* :func:`has_dropout`: a dropout layer with ``p > 0`` (masks drawn from the global RNG per batch).
* :func:`has_batchnorm`: a BatchNorm layer (outputs depend on the whole batch).
"""
from __future__ import annotations

from torch import nn


def has_dropout(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and float(m.p) > 0 for m in module.modules())


def has_batchnorm(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())
