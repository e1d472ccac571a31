"""PFLlib's per-client micro-AUC for many clients at once, on the device that holds the predictions.

A client's micro-AUC is the ROC AUC of its one-hot label matrix against its softmax outputs, both
flattened (:func:`utils.metrics.micro_auc`, which calls scikit-learn per client: 0.4-0.8 CPU s
per evaluation of P1, and a device-to-host copy of every client's probabilities). The area under
the trapezoidal ROC curve equals the Mann-Whitney statistic with ties counted one half::

    AUC = (R+ - n+ (n+ + 1) / 2) / (n+ n-),

where R+ is the sum of the positives' ranks among the client's scores, tied scores getting the
mean of their ranks. Here a client of n rows and C classes has n+ = n positive scores (the true
class of each row) and n- = n (C - 1). All clients are ranked with two stable sorts (by score,
then by client), ties are found as runs of equal (client, score), and the rank sums are one
``index_add``: a few kernels for the whole evaluation, in float64, and one small result per
client. Scores are compared as given (float32 softmax outputs, as scikit-learn gets them), so
ties are the same and the value equals scikit-learn's up to float64 rounding (checked to 1e-6 on
random cases in ``tests/system/test_auc.py``). A client without rows gets NaN.
"""
from __future__ import annotations

import torch


def segment_micro_auc(probs: torch.Tensor, labels: torch.Tensor, lens: list[int] | torch.Tensor,
                      positives: torch.Tensor | None = None) -> torch.Tensor:
    """Micro-AUC of each client: ``probs`` [N, C] and ``labels`` [N] hold the clients' rows one
    after another, client k owning ``lens[k]`` rows; returns a float64 tensor [K] on their device.
    ``positives`` (bool [N, C]) gives the positive entries instead of the one-hot ``labels``
    (multi-label rows); a client without a positive or a negative entry then has NaN."""
    device = probs.device
    lens = torch.as_tensor(lens, dtype=torch.long, device=device)
    rows, classes = probs.shape
    count = len(lens)
    if rows == 0:
        return torch.full((count,), float("nan"), dtype=torch.float64, device=device)
    scores = probs.reshape(-1)
    if positives is None:
        positive = torch.zeros(rows, classes, dtype=torch.bool, device=device)
        positive[torch.arange(rows, device=device), labels] = True
    else:
        positive = positives
    positive = positive.reshape(-1)
    client = torch.repeat_interleave(torch.arange(count, device=device), lens * classes)

    by_score = torch.sort(scores, stable=True).indices
    order = by_score[torch.sort(client[by_score], stable=True).indices]  # by client, then by score
    scores, positive, client = scores[order], positive[order], client[order]

    # runs of equal (client, score) share the mean of their ranks: each position finds its run's
    # first and last position by a running max / min (no host sync, unlike nonzero)
    total = len(scores)
    position = torch.arange(total, device=device)
    starts = torch.ones(total, dtype=torch.bool, device=device)
    starts[1:] = (scores[1:] != scores[:-1]) | (client[1:] != client[:-1])
    ends = torch.ones(total, dtype=torch.bool, device=device)
    ends[:-1] = starts[1:]
    first = torch.cummax(torch.where(starts, position, torch.zeros_like(position)), 0).values
    last = torch.cummin(torch.where(ends, position, torch.full_like(position, total)).flip(0), 0).values.flip(0)
    client_start = torch.cumsum(lens * classes, 0) - lens * classes
    mean_rank = (first + last).double() / 2 - client_start[client].double() + 1  # 1-based, within the client

    rank_sum = torch.zeros(count, dtype=torch.float64, device=device)
    rank_sum.index_add_(0, client, torch.where(positive, mean_rank, torch.zeros_like(mean_rank)))
    if positives is None:
        n_pos = lens.double()
    else:
        n_pos = torch.zeros(count, dtype=torch.float64, device=device).index_add_(0, client, positive.double())
    n_neg = lens.double() * classes - n_pos
    auc = (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return torch.where((n_pos > 0) & (n_neg > 0), auc, torch.full_like(auc, float("nan")))
