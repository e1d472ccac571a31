"""Matched averaging of one layer's units across clients (Wang et al., ICLR 2020, FedMA §2.1, with
the BBP-MAP solver of Yurochkin et al., ICML 2019, PFNM).

FedMA's matched average of a layer is

    min over permutations π_j:  Σ_i Σ_j Σ_l π_j[l, i] · c(w_jl, θ_i),   θ_i = the mean of the units matched to i,

where w_jl is unit l of client j (its weight row in the global input order and its bias) and global
unit i either matches one unit of each client or is new. BBP-MAP solves it one client at a time with
the Hungarian algorithm (``scipy.optimize.linear_sum_assignment``) on the negative log posterior of
a Beta-Bernoulli process with Gaussian units (prior N(μ0 = 0, σ0² I), noise σ² I, IBP mass γ0), J
clients, m_i the clients other than j already matched to unit i and S_i = Σ of their units:

    matching an existing unit i:  C[l, i] = −( ‖(S_i + w_l)/σ²‖² / (1/σ0² + (m_i + 1)/σ²)
                                              − ‖S_i/σ²‖² / (1/σ0² + m_i/σ²) ) − 2 log( m_i / (J − m_i) )
    opening the k-th new unit:    C[l, L + k] = −‖w_l/σ²‖² / (1/σ0² + 1/σ²) − 2 log( γ0 / (J · k) ),  k = 1, 2, ...

(the first term is the gain in log posterior of adding w_l to the unit; the second the prior of
the unit's popularity, or the Indian buffet's new dish, the k-th new dish of one client costing
log k more). The global layer grows by the units that open new ones, at most to ``max_width``
(beyond it only existing units can be matched). Clients are matched in a seeded order; each of the
further ``iterations`` removes one client at a time and matches it again against all the others
(units left with no client are dropped).

The matched unit is the plain mean of its clients' units: the θ_i that minimises the squared cost
of the objective above (PFNM's posterior mean would shrink it towards μ0).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment


def bbp_map_cost(units: np.ndarray, sums: np.ndarray, counts: np.ndarray, num_clients: int, sigma2: float,
                 sigma0_2: float, gamma: float, new_units: int) -> np.ndarray:
    """The cost of giving client j's units (rows of ``units``) each a global unit: columns 0..L−1
    the existing units (``sums`` of the other clients' matched units, ``counts`` of them), then
    ``new_units`` new ones; see the module docstring."""
    units = np.asarray(units, dtype=np.float64)
    sums = np.asarray(sums, dtype=np.float64).reshape(len(counts), units.shape[1])
    counts = np.asarray(counts, dtype=np.float64)
    prior = 1.0 / sigma0_2
    # ‖(S_i + w_l)/σ²‖² expanded, so no L x n x D tensor is formed
    joint = ((sums ** 2).sum(1)[None, :] + 2 * units @ sums.T + (units ** 2).sum(1)[:, None]) / sigma2 ** 2
    alone = (sums ** 2).sum(1) / sigma2 ** 2
    gain = joint / (prior + (counts + 1) / sigma2)[None, :] - (alone / (prior + counts / sigma2))[None, :]
    existing = -gain - 2 * np.log(counts / (num_clients - counts))[None, :]
    opening = (units ** 2).sum(1) / sigma2 ** 2 / (prior + 1 / sigma2)
    k = np.arange(1, new_units + 1, dtype=np.float64)
    new = -opening[:, None] - 2 * np.log(gamma / (num_clients * k))[None, :]
    return np.hstack([existing, new])


def match_units(units: Sequence[np.ndarray], sigma2: float, sigma0_2: float, gamma: float, max_width: int,
                iterations: int, rng: np.random.Generator) -> tuple[list[np.ndarray], int]:
    """BBP-MAP over the clients' units (``units[j]``: client j's units, one row each): returns each
    client's assignment (its unit l -> global unit) and the global width."""
    clients = len(units)
    units = [np.asarray(u, dtype=np.float64) for u in units]
    if any(len(u) > max_width for u in units):
        raise ValueError(f"a client has more than max_width = {max_width} units")
    assigned: list[np.ndarray | None] = [None] * clients

    # a client's units go to distinct global units (no repeated index), so plain fancy-index adds
    def join(j: int) -> None:
        sums[assigned[j]] += units[j]
        counts[assigned[j]] += 1.0

    def leave(j: int) -> None:
        sums[assigned[j]] -= units[j]
        counts[assigned[j]] -= 1.0
        assigned[j] = None

    def match(j: int) -> np.ndarray:
        nonlocal sums, counts
        used = _compact(assigned)
        width = len(used)
        if width < len(counts):  # units no client holds any more are dropped
            sums, counts = sums[used], counts[used]
        new_units = min(len(units[j]), max_width - width)
        cost = bbp_map_cost(units[j], sums, counts, clients, sigma2, sigma0_2, gamma, new_units)
        rows, cols = linear_sum_assignment(cost)
        chosen = np.empty(len(units[j]), dtype=np.int64)
        chosen[rows] = cols
        # New units are numbered in the order of the client's units that open them. Which of those
        # units takes which new column is a tie (a new column's cost is the unit's term plus the
        # column's: every pairing of the same units with the same columns costs the same), broken by
        # rounding; numbering by column let one ulp of the cost (another BLAS, thread count or
        # summation order) permute the global units.
        opens = chosen >= width
        opened = int(opens.sum())
        chosen[opens] = width + np.arange(opened)
        if opened:
            sums = np.vstack([sums, np.zeros((opened, sums.shape[1]))])
            counts = np.concatenate([counts, np.zeros(opened)])
        return chosen

    order = rng.permutation(clients)
    first = int(order[0])
    assigned[first] = np.arange(len(units[first]), dtype=np.int64)
    # Σ and count of the units matched to each global unit over the clients now assigned, kept up to
    # date as one client at a time leaves and is matched again (rebuilding them from all the others at
    # every match was a third of FedMA's matching time)
    sums, counts = units[first].copy(), np.ones(len(units[first]))
    for j in order[1:]:
        assigned[j] = match(int(j))
        join(int(j))
    for _ in range(iterations - 1):
        for j in rng.permutation(clients):
            leave(int(j))
            assigned[j] = match(int(j))
            join(int(j))
    return [a for a in assigned if a is not None], len(_compact(assigned))


def _compact(assigned: list[np.ndarray | None]) -> np.ndarray:
    """Renumber the global units that some client holds as 0..W−1 (in order), in place; returns their
    former numbers (W of them)."""
    present = [a for a in assigned if a is not None]
    if not present:
        return np.zeros(0, dtype=np.int64)
    used = np.unique(np.concatenate(present))
    lookup = np.full(int(used.max()) + 1, -1, dtype=np.int64)
    lookup[used] = np.arange(len(used))
    for index, chosen in enumerate(assigned):
        if chosen is not None:
            assigned[index] = lookup[chosen]
    return used


def matched_average(tensors: Sequence[torch.Tensor], assignments: Sequence[np.ndarray], width: int) -> torch.Tensor:
    """Global unit i = the mean of the clients' units assigned to it (``tensors[j]``: client j's
    units along the first axis, in the global input order)."""
    first = tensors[0]
    total = first.new_zeros((width, *first.shape[1:]), dtype=torch.float64)
    count = torch.zeros(width, dtype=torch.float64, device=first.device)
    for tensor, chosen in zip(tensors, assignments):
        index = torch.as_tensor(chosen, device=first.device)
        total.index_add_(0, index, tensor.to(torch.float64))
        count.index_add_(0, index, torch.ones(len(chosen), dtype=torch.float64, device=first.device))
    shape = (width,) + (1,) * (first.dim() - 1)
    return (total / count.clamp(min=1).reshape(shape)).to(first.dtype)
