"""The vectorised per-client micro-AUC (utils/auc.py) against scikit-learn's, client by client."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from utils.auc import segment_micro_auc
from utils.metrics import micro_auc

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")


def _case(seed: int, classes: int, lens: list[int], ties: bool = False, missing: bool = False):
    g = torch.Generator().manual_seed(seed)
    rows = sum(lens)
    logits = torch.randn(rows, classes, generator=g) * 3
    if ties:  # few distinct values: many tied scores, within and across rows
        logits = torch.round(logits)
    probs = logits.softmax(1)
    high = 1 if missing else classes  # missing classes: every label 0 (one class only)
    labels = torch.randint(0, high, (rows,), generator=g)
    return probs, labels


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("classes", [2, 3, 10])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("missing", [False, True])
def test_equals_sklearn_per_client(device, classes, ties, missing):
    for seed in range(5):
        lens = [int(n) for n in np.random.default_rng(seed).integers(1, 40, size=7)]
        lens[2] = 1  # a client with one test row
        probs, labels = _case(seed, classes, lens, ties, missing)
        got = segment_micro_auc(probs.to(device), labels.to(device), lens).cpu()
        start = 0
        for k, n in enumerate(lens):
            want = micro_auc(probs[start : start + n], labels[start : start + n], classes)
            assert got[k].item() == pytest.approx(want, abs=1e-6), (seed, k)
            start += n


def test_clients_without_rows_get_nan_and_leave_the_others_alone():
    probs, labels = _case(1, 4, [5, 6])
    got = segment_micro_auc(probs, labels, [5, 0, 6, 0])
    assert torch.isnan(got[1]) and torch.isnan(got[3])
    assert got[0].item() == pytest.approx(micro_auc(probs[:5], labels[:5], 4), abs=1e-6)
    assert got[2].item() == pytest.approx(micro_auc(probs[5:], labels[5:], 4), abs=1e-6)
    assert torch.isnan(segment_micro_auc(probs[:0], labels[:0], [0, 0])).all()


def test_a_perfect_and_a_reversed_ranking():
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.1, 0.9], [0.8, 0.2]])
    labels = torch.tensor([0, 1, 0, 1])
    got = segment_micro_auc(probs, labels, [2, 2])
    assert got.tolist() == [1.0, 0.0]
