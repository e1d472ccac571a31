"""Hermes client (Li, Sun, Li, Pu, Li, Chen, MobiCom 2021, doi:10.1145/3447993.3483278).

LotteryFL's loop (``clientlotteryfl.py``: same authors, same accuracy-triggered pruning towards a
target) with *structured* pruning: a client drops whole output channels (a convolution's filters,
a linear layer's output units) instead of single weights, so its personal model is a smaller dense
network that runs fast on the device. A pruning step removes, in every layer but the classifier
(whose outputs are the classes), the ``--prune_rate`` of the still-kept channels with the smallest
L1 norm, never leaving fewer than ⌈kf · channels⌉; a removed channel loses its weights, its bias
and the next layer's weights that read it. Hermes keeps training the pruned network from its current weights (no rewind to the initial
model). Only the kept parameters travel, and the server averages each entry over the clients that
kept it (the "overlapping parts", ``serverhermes.py``).

Deliberate choices (the paper's full text was not available to us; its abstract fixes structured
pruning, personal subnetworks and averaging over overlaps): the L1-norm channel score, the
LotteryFL trigger and schedule, and normalisation layers kept whole (a pruned channel followed by
BatchNorm still carries the norm's shift).
"""
from __future__ import annotations

import math
from typing import ClassVar

import torch

from flcore.clients.clientlotteryfl import LotteryFLClient
from flcore.common.sparsemask import kept_count, keep_largest
from flcore.flat import Segment


class HermesClient(LotteryFLClient):
    """LotteryFL's loop with channel pruning and no rewind."""

    rewind: ClassVar[bool] = False

    def channel_layers(self) -> list[tuple[Segment, Segment | None, Segment]]:
        """(weight, its bias or None, the next layer's weight) of every layer whose output channels
        may be pruned: every weight tensor but the classifier's (the last one)."""
        params = [seg for seg in self.segments if seg.is_param]
        weights = [seg for seg in params if len(seg.shape) >= 2]
        by_name = {seg.name: seg for seg in params}
        out = []
        for seg, following in zip(weights[:-1], weights[1:]):
            bias = by_name.get(seg.name.rsplit(".", 1)[0] + ".bias") if seg.name.endswith("weight") else None
            out.append((seg, bias if bias is not None and bias.shape == seg.shape[:1] else None, following))
        return out

    def may_prune(self, mask: torch.Tensor) -> bool:
        for weight, _, _ in self.channel_layers():
            channels, width = weight.shape[0], math.prod(weight.shape[1:])
            alive = int(mask[weight.start : weight.stop].view(channels, width).any(dim=1).sum())
            if alive > kept_count(channels, self.hp.kept_fraction):
                return True
        return False

    def pruned(self, theta: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The mask after one structured step: per layer, the r_p kept channels of smallest L1 norm
        dropped, never leaving fewer than ⌈kf · channels⌉. A dropped channel takes its weights, its
        bias and the next layer's weights that read it: input channel c of a convolution or linear
        layer, or the c-th block of a linear layer reading the flattened (channel-major) feature map.
        That reading assumes a feed-forward stack (MLPs, the CNN/LeNet family); a next layer whose
        input width is no multiple of the channels keeps those weights."""
        mask = mask.clone()
        for weight, bias, following in self.channel_layers():
            channels, width = weight.shape[0], math.prod(weight.shape[1:])
            rows = mask[weight.start : weight.stop].view(channels, width)
            alive = rows.any(dim=1)
            norms = (theta[weight.start : weight.stop].view(channels, width).abs() * rows).sum(dim=1)
            count = int(alive.sum())
            target = max(min(count, kept_count(channels, self.hp.kept_fraction)),
                         count - round(self.hp.prune_rate * count))
            keep = keep_largest(norms, [(0, channels)], 1.0, eligible=alive, counts=[target])
            rows &= keep[:, None]
            if bias is not None:
                mask[bias.start : bias.stop] &= keep
            if following.shape[1] % channels == 0:
                readers = mask[following.start : following.stop].view(following.shape[0], channels, -1)
                readers &= keep[None, :, None]
        return mask
