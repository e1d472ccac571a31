"""Masks and sparse messages shared by the mask-based algorithms (pFedEff, LotteryFL, Hermes).

* :func:`encode` / :func:`decode`: a sparse message, as it travels: the values sent and where they
  go. What says *where* is the cheapest of three encodings, so the bytes counted
  (``ClientUpdate.nbytes``, ``RoundPackage.nbytes``) are those an honest sender would send:
  nothing (every entry is sent: a dense vector), int32 indices (4 bytes an entry sent) or a
  bitmap (one bit an entry of the vector).
* :func:`keep_largest`: the magnitude (or importance) rule, ``⌈fraction · size⌉`` largest scores
  kept in each group (a layer's tensor), ties broken towards the lower position.
* :func:`masked_average`: the aggregation over the entries each client sent.

The client the mask-based algorithms share (``SparseClient``) is ``flcore/clients/clientsparse.py``.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch

from flcore.protocol import sample_weights
from flcore.flat import Segment

INDEX_DTYPE = torch.int32
_BIT_WEIGHTS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


# ------------------------------------------------------------------ the sparse message
def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """A boolean vector as ⌈n/8⌉ bytes, bit b of byte k holding entry 8k + b."""
    padded = torch.zeros(math.ceil(mask.numel() / 8) * 8, dtype=torch.uint8, device=mask.device)
    padded[: mask.numel()] = mask.to(torch.uint8)
    return (padded.view(-1, 8) * _BIT_WEIGHTS.to(mask.device)).sum(dim=1, dtype=torch.uint8)


def unpack_bits(bits: torch.Tensor, n: int) -> torch.Tensor:
    return (bits[:, None] & _BIT_WEIGHTS.to(bits.device)).ne(0).view(-1)[:n]


def encode(vector: torch.Tensor, keep: torch.Tensor) -> dict[str, torch.Tensor]:
    """The message sending ``vector``'s entries where ``keep`` holds: their values, and the int32
    indices or the bitmap of ``keep``, whichever is smaller (neither when every entry is sent)."""
    values = vector[keep]
    n, k = keep.numel(), values.numel()
    if k == n:
        return {"values": values}
    if k * torch.iinfo(INDEX_DTYPE).bits // 8 <= math.ceil(n / 8):
        return {"values": values, "indices": keep.nonzero().view(-1).to(INDEX_DTYPE)}
    return {"values": values, "bitmap": pack_bits(keep)}


def decode(message: dict[str, torch.Tensor], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(a length-``n`` vector with the values sent and zeros elsewhere, the mask of what was sent)."""
    values = message["values"]
    if "indices" in message:
        keep = torch.zeros(n, dtype=torch.bool, device=values.device)
        keep[message["indices"].long()] = True
    elif "bitmap" in message:
        keep = unpack_bits(message["bitmap"], n)
    else:
        keep = torch.ones(n, dtype=torch.bool, device=values.device)
    dense = torch.zeros(n, dtype=values.dtype, device=values.device)
    dense[keep] = values
    return dense, keep


def message_nbytes(message: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in message.values())


# ------------------------------------------------------------------ mask rules
def kept_count(size: int, fraction: float) -> int:
    """How many of ``size`` entries a fraction keeps: ⌈fraction · size⌉ (so at least one)."""
    return min(size, max(1, math.ceil(fraction * size - 1e-9)))


def largest_mask(values: torch.Tensor, count: int) -> torch.Tensor:
    """True on the ``count`` largest ``values``, ties going to the lower position: a stable
    descending sort's first ``count`` positions. Found by selection (the count-th largest value, the
    entries above it and the first entries equal to it), not by sorting: sorting every layer's
    scores several times a client and round was most of pFedEff's cost. A tensor holding NaN (which
    sorts above everything) keeps the sort."""
    n = values.numel()
    keep = torch.zeros(n, dtype=torch.bool, device=values.device)
    if count >= n:
        return keep.fill_(True)
    if count <= 0:
        return keep
    if bool(torch.isnan(values).any()):
        keep[torch.argsort(values, descending=True, stable=True)[:count]] = True
        return keep
    threshold = torch.kthvalue(values, n - count + 1).values  # the count-th largest
    above = values > threshold
    ties = values == threshold
    wanted = count - int(above.sum())
    return above | (ties & (torch.cumsum(ties, 0) <= wanted))


def keep_largest(scores: torch.Tensor, groups: Iterable[tuple[int, int]], fraction: float,
                 eligible: torch.Tensor | None = None, counts: Sequence[int] | None = None) -> torch.Tensor:
    """True on the ``⌈fraction · m⌉`` largest ``scores`` of each group ``[start, stop)`` (m: the
    group's eligible entries; ``counts`` gives the number per group instead); entries outside every
    group are True, ineligible ones False. Ties go to the lower position (as a stable sort's)."""
    keep = torch.ones(scores.numel(), dtype=torch.bool, device=scores.device)
    for g, (start, stop) in enumerate(groups):
        part = scores[start:stop]
        if eligible is None:
            count = kept_count(part.numel(), fraction) if counts is None else min(counts[g], part.numel())
            keep[start:stop] = largest_mask(part, count)
            continue
        keep[start:stop] = False
        candidates = eligible[start:stop].nonzero().view(-1)
        if candidates.numel() == 0:
            continue
        count = kept_count(candidates.numel(), fraction) if counts is None else min(counts[g], candidates.numel())
        keep[start + candidates[largest_mask(part[candidates], count)]] = True
    return keep


def param_groups(segments: Sequence[Segment]) -> list[tuple[int, int]]:
    """One group per trainable tensor (layer-wise masks; float buffers are never masked)."""
    return [(seg.start, seg.stop) for seg in segments if seg.is_param]


def weight_groups(segments: Sequence[Segment]) -> list[tuple[int, int]]:
    """One group per weight tensor (two or more dimensions: biases and norm scales are kept)."""
    return [(seg.start, seg.stop) for seg in segments if seg.is_param and len(seg.shape) >= 2]


def masked_average(messages: list[tuple[torch.Tensor, torch.Tensor]], num_samples: Sequence[int],
                   previous: torch.Tensor) -> torch.Tensor:
    """Per entry, the sample-weighted mean of the values the clients sent there (``messages``: one
    (dense values, sent mask) per upload); an entry nobody sent keeps ``previous``.

    The numerator is accumulated exactly as ``weighted_average`` does (weights n_k / Σ n_k, in
    update order); where every upload sent the entry that is the answer (its coverage is 1 in exact
    arithmetic and is not divided by), so dense uploads give FedAvg's model bit for bit."""
    weights = sample_weights(num_samples)
    total = torch.zeros_like(previous)
    coverage = torch.zeros_like(previous)
    everyone = torch.ones_like(previous, dtype=torch.bool)
    for (dense, sent), weight in zip(messages, weights):
        total.add_(dense, alpha=float(weight))
        coverage.add_(sent.to(previous.dtype), alpha=float(weight))
        everyone &= sent
    partial = torch.where(coverage > 0, total / coverage.clamp_min(torch.finfo(previous.dtype).tiny), previous)
    return torch.where(everyone, total, partial)
