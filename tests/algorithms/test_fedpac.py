"""FedPAC: the QP against its closed form, the client's statistics and its two training phases by
hand, the server's body average, centroids and combined heads, what travels, bad input."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fltest import random_dataset, run_round
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from flcore.servers.serverfedpac import collaboration_weights, simplex_qp
from knowledgetest import HIDDEN, hand_forward, hidden_server, per_class_sums, refusal

LR, LAM, C, DIM = 0.3, 2.0, 2, 2
HEAD = slice(HIDDEN * DIM + HIDDEN, None)


@pytest.mark.parametrize("gap, expected", [(1.0, [2 / 3, 1 / 3]), (0.0, [0.5, 0.5]), (1e4, [1.0, 0.0])])
def test_qp_matches_its_closed_form(gap, expected):
    # V = (1, 1), H_0 − H_1 = h with ‖h‖² = gap: min a0² + (1 + gap)·a1², a0 + a1 = 1
    # → a0 = (1 + gap) / (2 + gap); a weight below 1e-3 is dropped
    statistics = np.array([[0.0, 0.0], [np.sqrt(gap), 0.0]])
    alpha = collaboration_weights(np.array([1.0, 1.0]), statistics, own=0)
    assert alpha == pytest.approx(expected, abs=1e-6)


def test_active_set_qp_is_as_good_as_slsqp():
    """The active-set solver against scipy's SLSQP on random QPs of the collaboration's shape."""
    from scipy.optimize import minimize
    rng = np.random.default_rng(0)
    for _ in range(40):
        n, d = int(rng.integers(1, 12)), int(rng.integers(1, 30))
        gaps = rng.normal(size=(n, d)) - rng.normal(size=d)
        quadratic = np.diag(rng.uniform(1e-3, 2, size=n)) + gaps @ gaps.T
        a = simplex_qp(quadratic)
        ref = minimize(lambda x: x @ quadratic @ x, np.full(n, 1 / n), jac=lambda x: 2 * quadratic @ x, method="SLSQP",
                       bounds=[(0, 1)] * n, options={"ftol": 1e-14, "maxiter": 500},
                       constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1, "jac": lambda x: np.ones_like(x)}]).x
        assert a.min() >= 0 and a.sum() == pytest.approx(1, abs=1e-12)
        assert a @ quadratic @ a <= ref @ quadratic @ ref * (1 + 1e-9)
        np.testing.assert_allclose(a, ref, atol=1e-4)


def hand_statistics(w, x, y):
    z = hand_forward(w, x, C)[0]
    sums, seen = per_class_sums(z, y, C)
    p = seen / seen.sum()
    mu = sums / seen.clamp_min(1).unsqueeze(1)
    second = torch.zeros(C, dtype=w.dtype)
    for row, label in zip(z, y.tolist()):
        second[label] += row @ row / seen[label]
    v = ((p * second).sum() - (p**2 * (mu**2).sum(1)).sum()) / len(y)
    return v, p.unsqueeze(1) * mu


def hand_client(w, x, y, centroids, present):
    """One full-batch head step (body frozen), two full-batch body steps (head frozen) on
    CE + λ·MSE(z, c_y); then the class means of the trained body."""
    def step(w, train_head):
        w = w.detach().requires_grad_(True)
        z, logits = hand_forward(w, x, C)
        loss = F.cross_entropy(logits, y)
        if centroids is not None and not train_head:
            loss = loss + LAM * ((z - centroids[y]) * present[y].unsqueeze(1)).pow(2).mean()
        (grad,) = torch.autograd.grad(loss, w)
        keep = torch.zeros_like(w, dtype=torch.bool)
        keep[HEAD] = True
        return (w - LR * torch.where(keep if train_head else ~keep, grad, 0.0)).detach()

    w = step(w, True)
    w = step(step(w, False), False)
    sums, seen = per_class_sums(hand_forward(w, x, C)[0], y, C)
    return w, sums, seen


def test_two_rounds_by_hand():
    data = random_dataset(num_clients=2, dim=DIM, num_classes=C, sizes=[4, 6], seed=11)
    server = hidden_server("FedPAC", data, "-lam", str(LAM), local_learning_rate=LR)
    glob = server.global_params.double()
    heads = [glob[HEAD]] * 2
    centroids = present = None
    for rnd in range(2):
        expected, stats = [], []
        for k, c in enumerate(data.clients):
            start = glob.clone()
            start[HEAD] = heads[k]
            stats.append(hand_statistics(start, c.train_x.double(), c.train_y))
            expected.append(hand_client(start, c.train_x.double(), c.train_y, centroids, present))
        done = run_round(server, rnd)
        if rnd == 1:
            for k in range(2):
                assert torch.allclose(done.package.payload(k)["head"].double(), heads[k], atol=1e-6)
        for k, (update, (w, _, _)) in enumerate(zip(done.updates, expected)):
            assert torch.allclose(update.extras["V"].double(), stats[k][0].reshape(1), atol=1e-6)
            assert torch.allclose(update.extras["H"].double(), stats[k][1], atol=1e-6)
            assert torch.allclose(update.extras["head"].double(), w[HEAD], atol=1e-6)
        glob = 0.4 * expected[0][0] + 0.6 * expected[1][0]
        assert torch.allclose(server.global_params.double()[: HEAD.start], glob[: HEAD.start], atol=1e-6)
        total = sum(counts.unsqueeze(1) * (sums / seen.clamp_min(1).unsqueeze(1))
                    for (_, sums, seen), counts in zip(expected, [torch.bincount(c.train_y, minlength=C).double()
                                                                  for c in data.clients]))
        weight = sum(torch.bincount(c.train_y, minlength=C).double() for c in data.clients)
        present = weight > 0
        centroids = total / weight.clamp_min(1).unsqueeze(1)
        assert torch.allclose(server.centroids.double()[present], centroids[present], atol=1e-6)
        variances = np.array([float(v) for v, _ in stats])
        statistics = torch.stack([h.flatten() for _, h in stats]).numpy()
        trained_heads = torch.stack([w[HEAD] for w, _, _ in expected])
        heads = [torch.from_numpy(collaboration_weights(variances, statistics, k)) @ trained_heads for k in range(2)]
        for k in range(2):
            evaluated = server.eval_params(k).double()
            assert torch.allclose(evaluated[HEAD], heads[k], atol=1e-5)
            assert torch.allclose(evaluated[: HEAD.start], glob[: HEAD.start], atol=1e-6)


def test_what_travels():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[10, 12, 9], seed=2)
    server = hidden_server("FedPAC", data, batch_size=4)
    body = HIDDEN * 4 + HIDDEN
    head = 3 * HIDDEN + 3
    done = run_round(server, 0)
    assert done.package.nbytes(0) == body * 4  # round 0: the body only
    for update in done.updates:
        k = len(update.extras["labels"])
        assert update.nbytes() == (body + head + 1 + 3 * HIDDEN) * 4 + k * (8 + HIDDEN * 4 + 4)
    second = run_round(server, 1, cohort=[0, 1])
    assert second.package.nbytes(0) == (body + head + 3 * HIDDEN) * 4 + 3  # + its head, the centroids and mask


def test_bad_input():
    assert "body (features) and head (classifier)" in refusal("FedPAC", module=nn.Linear(3, 2))
    assert "-lam" in refusal("FedPAC", "-lam", "-1")
