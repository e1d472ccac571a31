"""Normalisation layers shared by the convolutional models and their GroupNorm (``-GN``) variants.

A model with BatchNorm keeps running statistics as float buffers (they travel in the flat vector
and are averaged with the model) and normalises with batch statistics in training; both keep it
out of the batched engine (``torch.func`` cannot update buffers per client). GroupNorm (Wu & He,
ECCV 2018) normalises each sample over groups of channels: no buffers, the same affine parameters
as BatchNorm (so the same parameter count), and the same result in training and evaluation.
"""
from __future__ import annotations

import math
from argparse import Namespace
from typing import Callable, Sequence

from torch import nn

from flcore.registry import register_model

#: Wu & He's default group count; layers whose channel count it does not divide use the largest
#: common divisor (e.g. 8 groups for MobileNetV2's 24 channels, 16 for its 16 and 144 channels)
GROUPS = 32

#: ``norm`` argument of the model builders
NORM_KINDS = ("bn", "bn-batchstats", "gn")


def group_count(channels: int) -> int:
    return math.gcd(GROUPS, channels)


def norm_layer(kind: str, channels: int, eps: float = 1e-5) -> nn.Module:
    """A normalisation layer over the ``channels`` feature maps of [N, C, H, W] inputs.

    ``bn``: BatchNorm with running statistics. ``bn-batchstats``: BatchNorm without running
    statistics, normalising with the batch's statistics in evaluation too (PFLlib's ResNet10).
    ``gn``: GroupNorm with :func:`group_count` groups."""
    if kind == "bn":
        return nn.BatchNorm2d(channels, eps=eps)
    if kind == "bn-batchstats":
        return nn.BatchNorm2d(channels, eps=eps, track_running_stats=False)
    if kind == "gn":
        return nn.GroupNorm(group_count(channels), channels, eps=eps)
    raise ValueError(f"unknown normalisation {kind!r}; known: {', '.join(NORM_KINDS)}")


def norm_layer_1d(kind: str, features: int) -> nn.Module:
    """:func:`norm_layer` for [N, features] inputs (after a linear layer)."""
    if kind == "bn":
        return nn.BatchNorm1d(features)
    if kind == "bn-batchstats":
        return nn.BatchNorm1d(features, track_running_stats=False)
    return norm_layer(kind, features)


def dropout(p: float, norm: str) -> nn.Module:
    """``nn.Dropout(p)`` in the BatchNorm models; none in the ``-GN`` variants, which exist to run
    in the batched engine, and vmap cannot reproduce the sequential engine's per-client masks."""
    return nn.Identity() if norm == "gn" else nn.Dropout(p)


def register_with_groupnorm_variant(name: str, build: Callable[[Sequence[int], int, str], nn.Module],
                                    norm: str = "bn", aliases: Sequence[str] = ()) -> None:
    """Register ``build(input_shape, num_classes, norm)`` as ``-m name`` (with ``norm``) and as
    ``-m name-GN`` (GroupNorm and no dropout, for the batched engine)."""
    for registered, kind, names in ((name, norm, aliases), (f"{name}-GN", "gn", ())):
        def factory(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None,
                    kind: str = kind) -> nn.Module:
            return build(input_shape, num_classes, kind)

        factory.__name__ = registered.replace("-", "_")
        factory.__doc__ = f"{build.__doc__ or name} Normalisation: {kind}."
        register_model(registered, *names)(factory)
