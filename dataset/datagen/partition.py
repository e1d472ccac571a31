"""Client partitions of a labelled dataset (PFLlib semantics plus McMahan shards).

Every function takes the label array and a ``numpy.random.Generator`` and
returns one index array per client; a sample goes to at most one client (to
exactly one, unless :func:`cap_samples` drops some later). The same generator
state always gives the same split, so a seed fully determines a partition.

Strategies:

* :func:`iid` and :func:`pat`: PFLlib's ``pat`` (``iid`` is ``pat`` with every
  class on every client). Unbalanced sizes are drawn as PFLlib does.
* :func:`dirichlet`: PFLlib's ``dir``.
* :func:`exdir`: PFLlib's extended Dirichlet (arXiv:2311.03154).
* :func:`shard`: McMahan et al. 2017 sort-and-partition.

Deliberate differences from PFLlib, all of which keep its distributions:

* Samples of a class are shuffled before being handed out (PFLlib takes them in
  file order), so the result does not depend on how the raw files are sorted.
* ``pat`` gives client ``c`` the labels ``(c*C + j) mod K`` and then numbers the
  clients so that clients sharing a label set are consecutive. Whenever PFLlib's
  greedy rule assigns every class this is the same grouping (20 clients, 10
  classes, C=2: clients 0-3 hold {0,1}, 4-7 {2,3}, ...); where PFLlib would leave
  whole classes unassigned (e.g. 12 clients) every class still gets clients and
  every client exactly C labels.
* Balanced ``pat``/``iid`` spread the remainder of each class one sample at a
  time over the clients instead of giving it all to the last client, so balanced
  IID client sizes differ by at most one sample.
* When cumulative proportions leave a remainder, it goes to the last client
  with a non-zero share (PFLlib: the last client, even if it is already full).
* Rejection loops (``dir``, ``exdir``) stop after ``max_tries`` with a
  :class:`PartitionError` instead of looping forever. PFLlib's ``dir`` redraws
  until every client holds ``least`` samples, which never happens for many
  clients or a small alpha (PFLlib issues #120, #130); ours redraws at most
  ``max_tries`` times and then, by default (``fallback="repair"``), tops up the
  clients still short of ``least`` from the largest clients (see
  :func:`_top_up`), so it always finishes; ``fallback="error"`` keeps the
  rejection-only behaviour and fails with one line instead.

Strategies not in PFLlib (Li et al., "Federated Learning on Non-IID Data Silos:
An Experimental Study", ICDE 2022, NIID-Bench):

* :func:`label_quantity` (``classes``): label-quantity skew ``#C=k``, every
  client holds exactly ``k`` classes, and each class is split equally at random
  among its holders; which classes, ``--label-sets``: ``cover`` (clients in random
  order take classes nobody holds yet first) or ``niid-bench`` (NIID-Bench's rule:
  client ``i`` holds class ``i mod K`` and ``k - 1`` others drawn at random).
* :func:`quantity_skew` (``quantity``): client sizes from Dir(alpha), labels IID.

:func:`few_shot` is PFLlib's ``-fs``: at most N training samples per label and client.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .errors import PartitionError

PARTITIONS = ("pat", "dir", "exdir", "shard", "classes", "quantity")
#: how ``classes`` (#C=k) chooses each client's classes (:func:`label_quantity`)
LABEL_SETS = ("cover", "niid-bench")
"""Partition names accepted as the third positional argument of the generators."""

DIR_MAX_TRIES = 100
"""PFLlib-style redraws of ``dir`` before the fallback; enough where PFLlib itself finishes."""
DIR_FALLBACKS = ("repair", "error")
LABEL_ASSIGN_TRIES = 10000
"""Redraws of exdir's label sets (cheap: one vectorised draw each)."""


def least_samples(num_samples: int, num_clients: int, batch_size: int = 10,
                  train_ratio: float = 0.75) -> int:
    """PFLlib's minimum client size: enough for one test batch, at most half a fair share."""
    return int(min(batch_size / (1.0 - train_ratio), num_samples / num_clients / 2))


def _check_common(labels: np.ndarray, num_clients: int, num_classes: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise PartitionError(f"labels must be one-dimensional, got shape {labels.shape}")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise PartitionError(f"labels must be integers, got dtype {labels.dtype}")
    if num_clients < 1:
        raise PartitionError(f"num_clients must be at least 1, got {num_clients}")
    if num_classes < 1:
        raise PartitionError(f"num_classes must be at least 1, got {num_classes}")
    if num_clients > labels.size:
        raise PartitionError(
            f"more clients ({num_clients}) than samples ({labels.size}); lower --num-clients")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise PartitionError(
            f"labels must lie in [0, {num_classes}), found [{labels.min()}, {labels.max()}]")
    return labels


def _check_label_sets(name: str, num_clients: int, num_classes: int,
                      class_per_client: int) -> None:
    """``class_per_client`` labels per client must exist and cover every class."""
    if not 1 <= class_per_client <= num_classes:
        raise PartitionError(
            f"class_per_client must be between 1 and num_classes ({num_classes}), "
            f"got {class_per_client}")
    if num_clients * class_per_client < num_classes:
        raise PartitionError(
            f"{name} with {num_clients} clients x {class_per_client} classes leaves some of the "
            f"{num_classes} classes without a client; raise --num-clients or --class-per-client")


def _class_indices(labels: np.ndarray, num_classes: int) -> list[np.ndarray]:
    return [np.flatnonzero(labels == k) for k in range(num_classes)]


def _balanced_sizes(n: int, k: int, offset: int) -> np.ndarray:
    """Split ``n`` into ``k`` sizes differing by at most one; extras start at ``offset``."""
    sizes = np.full(k, n // k, dtype=np.int64)
    extra = (offset + np.arange(n % k)) % k
    sizes[extra] += 1
    return sizes


def _unbalanced_sizes(n: int, k: int, least: int, num_classes: int,
                      rng: np.random.Generator) -> np.ndarray:
    """PFLlib's unbalanced ``pat`` sizes: ``k-1`` draws in [max(n/k/10, least/K), n/k), rest last.

    Unlike PFLlib, a draw is at least 1: with fewer than 10 samples per holder PFLlib's lower
    bound rounds to 0 and a class could go whole to its last holder, leaving the others
    without it (and, in ``pat``, without any sample)."""
    if k == 1:
        return np.array([n], dtype=np.int64)
    num_per = n / k
    low, high = max(1, int(max(num_per / 10, least / num_classes))), int(num_per)
    if low >= high:
        # Too few samples for a random range (tiny classes): fall back to equal sizes.
        return _balanced_sizes(n, k, 0)
    sizes = rng.integers(low, high, k - 1)
    return np.append(sizes, n - sizes.sum()).astype(np.int64)


def _chunk_sizes(n_items: int, proportions: np.ndarray) -> np.ndarray:
    """Sizes of the pieces PFLlib's ``dir`` cuts at the cumulative proportions."""
    proportions = proportions / proportions.sum()
    cuts = (np.cumsum(proportions) * n_items).astype(np.int64)[:-1]
    last = int(np.flatnonzero(proportions > 0)[-1])
    # Rounding down can leave samples after the last cut; they go to the last client
    # with a positive share rather than to a client the rule excluded.
    cuts[last:] = n_items
    return np.diff(np.concatenate([[0], cuts, [n_items]]))


def _dirichlet_draw(class_idx: list[np.ndarray], size: int, num_clients: int, alpha: float,
                    rng: np.random.Generator,
                    holders: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One draw of PFLlib's ``dir`` (``holders``: ``exdir``'s classes x clients mask).

    Per class, proportions over clients ~ Dir(alpha); clients already holding
    ``size / num_clients`` samples get nothing more. Returns the owner of every
    sample and the client sizes.
    """
    fair_share = size / num_clients
    owner = np.empty(size, dtype=np.int64)
    sizes = np.zeros(num_clients, dtype=np.int64)
    clients = np.arange(num_clients)
    for k, idx_k in enumerate(class_idx):
        idx_k = rng.permutation(idx_k)
        p = rng.dirichlet(np.full(num_clients, alpha))
        if not len(idx_k):
            continue  # an empty class (it may come after every client is full)
        allowed = sizes < fair_share if holders is None else holders[k] & (sizes < fair_share)
        q = p * allowed
        if not _usable(q):
            # All drawn mass fell on full clients (or underflowed at tiny alpha); a
            # label of exdir still has to go to its holders.
            q = p * holders[k] if holders is not None else allowed.astype(float)
            if not _usable(q):
                q = (holders[k] if holders is not None else allowed).astype(float)
        chunk = _chunk_sizes(len(idx_k), q)
        owner[idx_k] = np.repeat(clients, chunk)
        sizes += chunk
    return owner, sizes


def _usable(p: np.ndarray) -> bool:
    total = p.sum()
    return bool(np.isfinite(total) and total > 0)


def pat(labels: np.ndarray, num_clients: int, num_classes: int, class_per_client: int,
        rng: np.random.Generator, *, balance: bool = False, least: int = 0) -> list[np.ndarray]:
    """PFLlib's pathological partition: ``class_per_client`` labels per client.

    Clients sharing a label set form consecutive groups; the samples of a class are
    split over the clients holding it, in equal parts (``balance``) or with PFLlib's
    random sizes, where ``least`` is the minimum client size used in PFLlib's lower
    bound ``max(n/k/10, least/num_classes)``.
    """
    labels = _check_common(labels, num_clients, num_classes)
    _check_label_sets("pat", num_clients, num_classes, class_per_client)
    start = [(c * class_per_client) % num_classes for c in range(num_clients)]
    order = sorted(range(num_clients), key=lambda c: (start[c], c))
    label_sets = [[(start[c] + j) % num_classes for j in range(class_per_client)] for c in order]
    holders = [[c for c in range(num_clients) if k in label_sets[c]] for k in range(num_classes)]
    class_idx = _class_indices(labels, num_classes)
    if class_per_client < num_classes:  # pat proper; IID (every class everywhere) may spread thin
        short = [k for k in range(num_classes) if len(class_idx[k]) < len(holders[k])]
        if short:
            k = short[0]
            raise PartitionError(
                f"pat: class {k} has {len(class_idx[k])} samples for the {len(holders[k])} clients "
                f"that hold it ({num_clients} clients x {class_per_client} classes; {len(short)} "
                f"classes are that short), so some clients would lack a class; lower --num-clients "
                f"or --class-per-client")

    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    offset = 0
    for k, idx_k in enumerate(class_idx):
        idx_k = rng.permutation(idx_k)
        clients = holders[k]
        if balance:
            sizes = _balanced_sizes(len(idx_k), len(clients), offset)
            offset += len(idx_k) % len(clients)
        else:
            sizes = _unbalanced_sizes(len(idx_k), len(clients), least, num_classes, rng)
        for client, chunk in zip(clients, np.split(idx_k, np.cumsum(sizes)[:-1])):
            parts[client].append(chunk)
    return [np.concatenate(p) if p else np.empty(0, dtype=np.int64) for p in parts]


def iid(labels: np.ndarray, num_clients: int, num_classes: int, rng: np.random.Generator,
        *, balance: bool = True, least: int = 0) -> list[np.ndarray]:
    """IID split, stratified by label (PFLlib: ``pat`` with every class on every client).

    Balanced: client sizes differ by at most one. Unbalanced: per class, PFLlib's
    random sizes (see :func:`pat`).
    """
    return pat(labels, num_clients, num_classes, num_classes, rng, balance=balance, least=least)


def dirichlet(labels: np.ndarray, num_clients: int, num_classes: int, alpha: float,
              rng: np.random.Generator, *, least: int,
              max_tries: int = DIR_MAX_TRIES, fallback: str = "repair") -> list[np.ndarray]:
    """PFLlib's ``dir``: per class, proportions over clients drawn from Dir(alpha).

    Clients already holding at least N/num_clients samples get nothing of later
    classes; the whole draw is repeated until every client has ``least`` samples,
    at most ``max_tries`` times. If no draw qualifies, ``fallback="repair"``
    keeps the last draw and tops up the short clients (:func:`_top_up`), so the
    call always returns for any alpha > 0 and any ``num_clients`` with
    ``least * num_clients <= N``; ``fallback="error"`` raises instead.
    """
    labels = _check_common(labels, num_clients, num_classes)
    if not alpha > 0 or not math.isfinite(alpha):
        raise PartitionError(f"alpha must be a positive number, got {alpha}")
    if fallback not in DIR_FALLBACKS:
        raise PartitionError(f"unknown dir fallback {fallback!r}; choose {' or '.join(DIR_FALLBACKS)}")
    if least * num_clients > labels.size:
        raise PartitionError(
            f"dir: {num_clients} clients x {least} samples each need more than the "
            f"{labels.size} samples; lower --num-clients")
    return _draw_until_filled("dir", labels, num_clients, num_classes, alpha, rng, least=least,
                              max_tries=max_tries, fallback=fallback,
                              hint="raise --alpha or lower --num-clients")


def _draw_until_filled(name: str, labels: np.ndarray, num_clients: int, num_classes: int,
                       alpha: float, rng: np.random.Generator, *, least: int, max_tries: int,
                       fallback: str, hint: str, holders: np.ndarray | None = None) -> list[np.ndarray]:
    """``dir``'s and ``exdir``'s outer loop: redraw until every client has ``least`` samples.

    PFLlib loops forever here; we stop after ``max_tries`` draws and then either top the
    short clients up from the last draw (``fallback="repair"``, within their own labels
    when ``holders`` restricts them) or raise (``"error"``)."""
    class_idx = _class_indices(labels, num_classes)
    owner = np.empty(0, dtype=np.int64)
    for _ in range(max(max_tries, 1)):
        owner, sizes = _dirichlet_draw(class_idx, labels.size, num_clients, alpha, rng, holders=holders)
        if sizes.min() >= least:
            return _parts_from_owner(owner, num_clients, rng)
    if fallback == "error":
        raise PartitionError(
            f"{name}: no draw in {max_tries} tries gave every client at least {least} samples; {hint}")
    _top_up(owner, labels, num_clients, num_classes, least, rng,
            allowed=None if holders is None else holders.T)
    return _parts_from_owner(owner, num_clients, rng)


def _parts_from_owner(owner: np.ndarray, num_clients: int,
                      rng: np.random.Generator) -> list[np.ndarray]:
    """Indices of each client (shuffled) from a per-sample owner array."""
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(num_clients + 1))
    return [rng.permutation(order[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]


def _top_up(owner: np.ndarray, labels: np.ndarray, num_clients: int, num_classes: int,
            least: int, rng: np.random.Generator, allowed: np.ndarray | None = None) -> None:
    """Move samples to clients below ``least`` until every client holds ``least``.

    The smallest client receives random samples of the largest (donor, class)
    block among donors holding more than ``least`` and, with ``allowed``
    (clients x classes), classes the receiver may hold (``exdir``'s label sets).
    Taking whole blocks of one class keeps the label skew a small alpha asks
    for (a uniform top-up would add every class). Without ``allowed`` this
    always terminates, because ``least * num_clients <= N``: while a client is
    short, some other client holds more than ``least``, and every move shrinks
    the total shortfall; with ``allowed`` a receiver whose classes no donor can
    spare raises :class:`PartitionError`.
    """
    counts = np.zeros((num_clients, num_classes), dtype=np.int64)
    np.add.at(counts, (owner, labels), 1)
    sizes = counts.sum(axis=1)
    while sizes.min() < least:
        receiver = int(np.argmin(sizes))
        spare = np.where((sizes > least)[:, None], counts, 0)
        spare[receiver] = 0
        if allowed is not None:
            spare = spare * allowed[receiver][None, :]
        if spare.max() == 0:
            raise PartitionError(
                f"no client can spare samples of client {receiver}'s classes to give it "
                f"{least} samples; raise --class-per-client or lower --num-clients")
        donor, k = (int(i) for i in np.unravel_index(np.argmax(spare), spare.shape))
        amount = int(min(least - sizes[receiver], sizes[donor] - least, counts[donor, k]))
        candidates = np.flatnonzero((owner == donor) & (labels == k))
        moved = rng.choice(candidates, size=amount, replace=False)
        owner[moved] = receiver
        counts[donor, k] -= amount
        counts[receiver, k] += amount
        sizes[donor] -= amount
        sizes[receiver] += amount


def label_quantity(labels: np.ndarray, num_clients: int, num_classes: int,
                   class_per_client: int, rng: np.random.Generator,
                   label_sets: str = "cover") -> list[np.ndarray]:
    """Label-quantity skew ``#C=k`` (NIID-Bench): each client holds exactly k classes.

    ``label_sets="cover"``: clients, in random order, first take classes no client
    holds yet, then random distinct others, so every class has a holder whenever
    ``num_clients * k >= num_classes``. ``"niid-bench"``: NIID-Bench's own rule
    (``partition_data``, ``noniid-#label``): client ``i``'s first class is
    ``i mod K``, then ``k - 1`` distinct others drawn uniformly; every class has
    a holder only when ``num_clients >= num_classes`` (fewer is refused: NIID-Bench
    would split a class over no client; we keep every sample). Each class is split
    into equal random parts (sizes differ by at most one) over its holders.
    """
    labels = _check_common(labels, num_clients, num_classes)
    _check_label_sets("classes", num_clients, num_classes, class_per_client)
    if label_sets not in LABEL_SETS:
        raise PartitionError(f"label_sets must be one of {', '.join(LABEL_SETS)}, got {label_sets!r}")
    holders: list[list[int]] = [[] for _ in range(num_classes)]
    if label_sets == "niid-bench":
        if num_clients < num_classes:
            raise PartitionError(
                f"--label-sets niid-bench gives client i class i mod {num_classes}, so {num_clients} clients leave "
                f"classes {num_clients}..{num_classes - 1} without a holder; use --label-sets cover or raise --num-clients")
        for client in range(num_clients):
            first = client % num_classes
            others = np.setdiff1d(np.arange(num_classes), [first])
            for k in [first, *(int(k) for k in rng.choice(others, class_per_client - 1, replace=False))]:
                holders[k].append(client)
    else:
        uncovered = list(rng.permutation(num_classes))
        for client in rng.permutation(num_clients):
            mine = [int(uncovered.pop()) for _ in range(min(class_per_client, len(uncovered)))]
            rest = np.setdiff1d(np.arange(num_classes), mine)
            mine += [int(k) for k in rng.choice(rest, class_per_client - len(mine), replace=False)]
            for k in mine:
                holders[k].append(int(client))
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k, idx_k in enumerate(_class_indices(labels, num_classes)):
        chunks = np.array_split(rng.permutation(idx_k), len(holders[k]))
        for client, chunk in zip(rng.permutation(holders[k]), chunks):
            parts[client].append(chunk)
    return [rng.permutation(np.concatenate(p)) for p in parts]


def quantity_skew(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator,
                  *, least: int = 1) -> list[np.ndarray]:
    """Quantity skew (NIID-Bench): client sizes from Dir(alpha), labels IID.

    Every client first gets ``least`` samples; the remaining ``N - least*n`` are
    shared by proportions ``p ~ Dir(alpha)`` (cumulative cuts, so sizes are
    ``least + floor``-rounded ``p * rest``). Samples are shuffled before the cut,
    so each client's labels follow the global label distribution.
    """
    labels = np.asarray(labels)
    if num_clients < 1:
        raise PartitionError(f"num_clients must be at least 1, got {num_clients}")
    if not alpha > 0 or not math.isfinite(alpha):
        raise PartitionError(f"alpha must be a positive number, got {alpha}")
    least = max(int(least), 1)
    if least * num_clients > labels.size:
        raise PartitionError(
            f"quantity: {num_clients} clients x {least} samples need more than the "
            f"{labels.size} samples; lower --num-clients")
    rest = labels.size - least * num_clients
    p = rng.dirichlet(np.full(num_clients, alpha))
    if not _usable(p):
        p = np.full(num_clients, 1.0 / num_clients)
    cuts = np.floor(np.cumsum(p / p.sum()) * rest + 1e-9).astype(np.int64)
    cuts[-1] = rest
    sizes = np.diff(np.concatenate([[0], cuts])) + least
    return np.split(rng.permutation(labels.size), np.cumsum(sizes)[:-1])


def few_shot(indices: np.ndarray, labels: np.ndarray, per_label: int | None,
             rng: np.random.Generator) -> np.ndarray:
    """PFLlib's few-shot option: keep at most ``per_label`` samples of each label, at random.

    The kept indices stay in their original order.
    """
    indices = np.asarray(indices)
    if per_label is None:
        return indices
    if per_label < 1:
        raise PartitionError(f"few-shot needs at least 1 sample per label, got {per_label}")
    keep = np.zeros(len(indices), dtype=bool)
    own = np.asarray(labels)[indices]
    for k in np.unique(own):
        where = np.flatnonzero(own == k)
        if len(where) > per_label:
            where = rng.choice(where, per_label, replace=False)
        keep[where] = True
    return indices[keep]


def exdir(labels: np.ndarray, num_clients: int, num_classes: int, class_per_client: int,
          alpha: float, rng: np.random.Generator, *, min_size: int = 10,
          max_tries: int = DIR_MAX_TRIES, fallback: str = "repair") -> list[np.ndarray]:
    """PFLlib's extended Dirichlet: ``class_per_client`` random labels, then ``dir`` per label.

    First each client draws ``class_per_client`` distinct labels, redrawn until every
    label has at least ``max(C*num_clients//num_classes//2, 1)`` clients; then each
    label's samples are split over its clients by Dir(alpha) proportions (full
    clients excluded), redrawn until every client has ``min_size`` samples. Each
    loop stops after ``max_tries`` (PFLlib loops forever); then ``fallback="repair"``
    tops the short clients up with samples of their own labels (:func:`_top_up`)
    and ``"error"`` raises.
    """
    labels = _check_common(labels, num_clients, num_classes)
    _check_label_sets("exdir", num_clients, num_classes, class_per_client)
    if not alpha > 0 or not math.isfinite(alpha):
        raise PartitionError(f"alpha must be a positive number, got {alpha}")
    if fallback not in DIR_FALLBACKS:
        raise PartitionError(f"unknown fallback {fallback!r}; choose {' or '.join(DIR_FALLBACKS)}")
    need = max(class_per_client * num_clients // num_classes // 2, 1)
    for _ in range(LABEL_ASSIGN_TRIES):
        # Each client's labels: the first k of a random permutation of the classes.
        picks = np.argsort(rng.random((num_clients, num_classes)), axis=1)[:, :class_per_client]
        holders = np.zeros((num_classes, num_clients), dtype=bool)
        holders[picks, np.arange(num_clients)[:, None]] = True
        if holders.sum(axis=1).min() >= need:
            break
    else:
        raise PartitionError(
            f"exdir: no label assignment in {LABEL_ASSIGN_TRIES} tries gave every label {need} "
            f"clients; raise --num-clients or --class-per-client")

    return _draw_until_filled("exdir", labels, num_clients, num_classes, alpha, rng, least=min_size,
                              max_tries=max_tries, fallback=fallback, holders=holders,
                              hint="raise --alpha, --class-per-client or lower --num-clients")


def shard(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *,
          shards_per_client: int = 2) -> list[np.ndarray]:
    """McMahan et al.'s sort-and-partition: label-sorted data cut into equal shards.

    The data sorted by label (ties in random order) is cut into
    ``shards_per_client * num_clients`` shards of equal size (sizes differ by at most
    one when the count does not divide). Clients draw their shards at random one by
    one; a shard whose (majority) label the client already holds is redrawn whenever
    another one is left, and clashes left at the end are repaired by swapping shards
    between clients where a swap removes them.
    """
    labels = _check_common(labels, num_clients, int(labels.max()) + 1 if len(labels) else 1)
    if shards_per_client < 1:
        raise PartitionError(f"shards_per_client must be at least 1, got {shards_per_client}")
    num_shards = shards_per_client * num_clients
    if num_shards > labels.size:
        raise PartitionError(
            f"{num_shards} shards need at least as many samples, have {labels.size}; "
            f"lower --num-clients or --shards-per-client")
    perm = rng.permutation(labels.size)
    order = perm[np.argsort(labels[perm], kind="stable")]
    shards = np.array_split(order, num_shards)
    shard_label = np.array([np.bincount(labels[s]).argmax() for s in shards])

    pool = rng.permutation(num_shards)
    owned: list[list[int]] = []
    for _ in range(num_clients):
        mine: list[int] = []
        for _ in range(shards_per_client):
            free = ~np.isin(shard_label[pool], shard_label[mine])
            candidates = np.flatnonzero(free) if free.any() else np.arange(len(pool))
            pick = int(candidates[rng.integers(len(candidates))])
            mine.append(int(pool[pick]))
            pool = np.delete(pool, pick)
        owned.append(mine)
    _repair_shard_clashes(owned, shard_label, rng)
    return [np.concatenate([shards[s] for s in mine]) for mine in owned]


def _repair_shard_clashes(owned: list[list[int]], shard_label: np.ndarray,
                          rng: np.random.Generator) -> None:
    """Swap shards between clients to remove same-label pairs where a swap can."""
    def others(client: int, skip: int) -> set[int]:
        return {int(shard_label[s]) for s in owned[client] if s != skip}

    for c in range(len(owned)):
        for pos in range(len(owned[c])):
            s = owned[c][pos]
            if int(shard_label[s]) not in others(c, s):
                continue
            for d in rng.permutation(len(owned)):
                if d == c:
                    continue
                swap = next((i for i, t in enumerate(owned[d])
                             if int(shard_label[t]) not in others(c, s)
                             and int(shard_label[s]) not in others(d, t)), None)
                if swap is not None:
                    owned[c][pos], owned[d][swap] = owned[d][swap], s
                    break


def cap_samples(indices: np.ndarray, cap: int | None, rng: np.random.Generator) -> np.ndarray:
    """Keep at most ``cap`` of ``indices``, chosen at random, in their original order."""
    indices = np.asarray(indices)
    if cap is None or len(indices) <= cap:
        return indices
    if cap < 1:
        raise PartitionError(f"the per-client sample cap must be at least 1, got {cap}")
    keep = np.sort(rng.choice(len(indices), size=cap, replace=False))
    return indices[keep]


def train_test_split(indices: np.ndarray, train_ratio: float,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle a client's indices and split them; ``floor(train_ratio*n)`` go to training.

    The sizes equal scikit-learn's ``train_test_split(train_size=train_ratio)``,
    which PFLlib uses.
    """
    if not 0 < train_ratio < 1:
        raise PartitionError(f"train_ratio must be in (0, 1), got {train_ratio}")
    shuffled = rng.permutation(np.asarray(indices))
    # The epsilon keeps e.g. 0.7*10 from flooring to 6 through binary rounding.
    n_train = int(math.floor(train_ratio * len(shuffled) + 1e-9))
    return shuffled[:n_train], shuffled[n_train:]


def make_partition(labels: np.ndarray, *, num_clients: int, num_classes: int,
                   rng: np.random.Generator, non_iid: bool, balance: bool,
                   partition: str | None, alpha: float = 0.1, class_per_client: int = 2,
                   shards_per_client: int = 2, batch_size: int = 10,
                   train_ratio: float = 0.75, max_tries: int | None = None,
                   dir_fallback: str = "repair", label_sets: str = "cover") -> list[np.ndarray]:
    """Dispatch on PFLlib's ``(non_iid, balance, partition)`` triple.

    As in PFLlib, ``non_iid=False`` means IID whatever ``partition`` says, and
    ``balance`` only matters for ``pat``/IID.
    """
    labels = np.asarray(labels)
    if not 0 < train_ratio < 1:
        raise PartitionError(f"train_ratio must be in (0, 1), got {train_ratio}")
    least = least_samples(labels.size, num_clients, batch_size, train_ratio) if num_clients else 0
    if not non_iid:
        return iid(labels, num_clients, num_classes, rng, balance=balance, least=least)
    if partition == "pat":
        return pat(labels, num_clients, num_classes, class_per_client, rng,
                   balance=balance, least=least)
    if partition == "dir":
        return dirichlet(labels, num_clients, num_classes, alpha, rng, least=least,
                         max_tries=DIR_MAX_TRIES if max_tries is None else max_tries,
                         fallback=dir_fallback)
    if partition == "exdir":
        min_size = min(10, labels.size // max(num_clients, 1))
        return exdir(labels, num_clients, num_classes, class_per_client, alpha, rng,
                     min_size=min_size, fallback=dir_fallback,
                     max_tries=DIR_MAX_TRIES if max_tries is None else max_tries)
    if partition == "classes":
        return label_quantity(labels, num_clients, num_classes, class_per_client, rng, label_sets)
    if partition == "quantity":
        _check_common(labels, num_clients, num_classes)
        return quantity_skew(labels, num_clients, alpha, rng, least=least)
    if partition == "shard":
        _check_common(labels, num_clients, num_classes)
        return shard(labels, num_clients, rng, shards_per_client=shards_per_client)
    raise PartitionError(
        f"unknown partition {partition!r} for non-IID data; choose one of {', '.join(PARTITIONS)}")


def label_counts(labels: np.ndarray, parts: Sequence[np.ndarray]) -> list[list[list[int]]]:
    """Per client, ``[label, count]`` pairs for the labels it holds (PFLlib's statistic)."""
    out = []
    for idx in parts:
        values, counts = np.unique(np.asarray(labels)[idx], return_counts=True)
        out.append([[int(v), int(c)] for v, c in zip(values, counts)])
    return out
