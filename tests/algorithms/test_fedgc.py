"""FedGC: the server's correction by hand (PFLlib's loop), local training over the client's classes,
heads per client, partial participation, λ = 0, main."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fltest import build_server, dataset_from_arrays, make_args, run_main_two_rounds, run_round
from fltest import one_thread  # noqa: F401  (fixture)
from flcore.clients.clientfedgc import ABSENT_BIAS
from flcore.servers.serverfedgc import correction_loss
from twolayer import DIM, TwoLayer


def reg_by_hand(rows, holds):
    """PFLlib's loop: for every row (k, c) held, −log(exp(e·e) / (exp(e·e) + Σ_{j∌c} Σ_{c'∈j} exp(W_j[c']·e)))."""
    K, C, _ = rows.shape
    e = {c: sum(rows[k, c] for k in range(K) if holds[k, c]) / sum(1 for k in range(K) if holds[k, c])
         for c in range(C) if any(holds[k, c] for k in range(K))}
    total = 0.0
    for k in range(K):
        for c in range(C):
            if not holds[k, c]:
                continue
            a = math.exp(float(e[c] @ e[c]))
            d = sum(math.exp(float(rows[j, c2] @ e[c])) for j in range(K) if not holds[j, c]
                    for c2 in range(C) if holds[j, c2])
            total += -math.log(a / (a + d))
    return total


def test_correction_loss_matches_pfllibs_loop():
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(3, 4, 2, generator=g, dtype=torch.float64) * 0.5
    holds = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 0], [1, 0, 0, 1]], dtype=torch.bool)
    assert float(correction_loss(rows, holds)) == pytest.approx(reg_by_hand(rows, holds), rel=1e-10)
    everyone = torch.ones(3, 4, dtype=torch.bool)
    assert float(correction_loss(rows, everyone)) == 0.0  # no client lacks a class: nothing to push apart


def three_clients():
    """Client k holds classes {k, k+1} of 3 (TwoLayer has CLASSES = 2, so use a 3-class head)."""
    g = torch.Generator().manual_seed(1)
    clients = []
    for k, n in enumerate([4, 6, 5]):
        y = torch.tensor([k % 3, (k + 1) % 3] * n)[:n]
        clients.append((torch.randn(n, DIM, generator=g), y, torch.randn(4, DIM, generator=g),
                        torch.tensor([k % 3, (k + 1) % 3, k % 3, (k + 1) % 3])))
    return dataset_from_arrays(clients, 3)


def model3():
    torch.manual_seed(0)
    model = TwoLayer()
    model.head = torch.nn.Linear(3, 3)
    return model


def test_one_round_by_hand():
    lr, lam = 0.2, 0.5
    data = three_clients()
    server = build_server(make_args("FedGC", "-lam", str(lam), batch_size=8, local_epochs=2, drop_last=False,
                                    local_learning_rate=lr), data, model3())
    w0 = server.global_params.double()
    a, b = DIM * 3, DIM * 3 + 3  # body.W, body.b; head.W [3x3] from b, head.b from b + 9
    holds = torch.tensor([[1, 1, 0], [0, 1, 1], [1, 0, 1]], dtype=torch.bool)
    trained = []
    for k, c in enumerate(data.clients):
        w = w0.clone()
        w[b + 9:][~holds[k]] = ABSENT_BIAS
        x, y = c.train_x.double(), c.train_y
        for _ in range(2):
            w = w.detach().requires_grad_(True)
            z = x @ w[:a].view(3, DIM).T + w[a:b]
            loss = F.cross_entropy(z @ w[b:b + 9].view(3, 3).T + w[b + 9:], y)
            (grad,) = torch.autograd.grad(loss, w)
            w = (w - lr * grad).detach()
        trained.append(w)
    updates = run_round(server, 0).updates
    body = (4 * trained[0] + 6 * trained[1] + 5 * trained[2]) / 15
    assert torch.allclose(server.global_params[:b].double(), body[:b], atol=1e-5)
    assert torch.equal(server.global_params[b:], w0[b:].float())  # no global head
    rows = torch.stack([t[b:b + 9].view(3, 3) for t in trained]).requires_grad_(True)
    (g,) = torch.autograd.grad(correction_loss(rows, holds), rows)
    corrected = rows.detach() - lr * lam * g
    for k in range(3):
        assert torch.equal(updates[k].extras["classes"], holds[k])
        head = server.state.get("fedgc_head", k).double()
        assert torch.allclose(head[:9].view(3, 3), corrected[k], atol=1e-5)
        assert torch.allclose(head[9:], trained[k][b + 9:], atol=1e-5)
        assert (head[9:][~holds[k]] == ABSENT_BIAS).all()
        evaluated = server.eval_params(k).double()
        assert torch.allclose(evaluated[:b], body[:b], atol=1e-5) and torch.allclose(evaluated[b:], head, atol=1e-5)
    assert float(g.abs().sum()) > 0
    assert server.history.extra_series["fedgc_reg"][0] == pytest.approx(reg_by_hand(rows.detach(), holds), rel=1e-5)
    # the next round starts from the corrected head
    package = run_round(server, 1).package
    assert torch.allclose(package.payload(0)["head"].double()[:9].view(3, 3), corrected[0], atol=1e-5)


def test_lambda_zero_keeps_the_trained_heads_and_partial_participation():
    data = three_clients()
    server = build_server(make_args("FedGC", "-lam", "0", join_ratio=0.67, batch_size=8), data, model3())
    round0 = run_round(server, 0)
    for u in round0.updates:
        assert torch.equal(server.state.get("fedgc_head", u.index), u.params[DIM * 3 + 3:])
    missing = set(range(3)) - set(round0.cohort)
    for k in missing:
        assert server.state.get("fedgc_head", k) is None and torch.equal(server.eval_params(k), server.global_params)
    round1 = run_round(server, 1)
    for k in round1.cohort:
        assert ("head" in round1.package.payload(k)) == (k in round0.cohort)


def test_two_round_run_through_main(tmp_path):
    run_main_two_rounds(tmp_path, "FedGC")
