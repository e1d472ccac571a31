"""FedGH: two rounds by hand (local CE training of body + global head, the uploaded class means of
the trained body, the server's SGD pass of the head on them), what travels (and its bytes), the
body never leaves a client, partial participation, bad input."""
from __future__ import annotations

import h5py
import torch
import torch.nn.functional as F
from torch import nn

from fltest import random_dataset, run_main_two_rounds, run_round
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from knowledgetest import refusal, HIDDEN, hand_forward, hidden_server, per_class_sums

LR, SLR, DIM, C = 0.3, 0.5, 2, 2
HEAD = slice(HIDDEN * DIM + HIDDEN, None)  # W2, b2 at the end of the flat vector


def hand_client(w, x, y, steps=2):
    """Full-batch CE steps, then (w, class means of the trained body, labels held)."""
    for _ in range(steps):
        w = w.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(F.cross_entropy(hand_forward(w, x, C)[1], y), w)
        w = w - LR * grad
    w = w.detach()
    sums, seen = per_class_sums(hand_forward(w, x, C)[0], y, C)
    held = seen > 0
    return w, sums[held] / seen[held].unsqueeze(1), torch.nonzero(held).flatten()


def hand_head_step(head, representations, labels):
    """One SGD step of the head on all pairs at once (batch >= pairs: one minibatch)."""
    head = head.detach().requires_grad_(True)
    w2, b2 = head[: C * HIDDEN].view(C, HIDDEN), head[C * HIDDEN:]
    (grad,) = torch.autograd.grad(F.cross_entropy(representations @ w2.T + b2, labels), head)
    return (head - SLR * grad).detach()


def test_two_rounds_by_hand():
    data = random_dataset(num_clients=2, dim=DIM, num_classes=C, sizes=[4, 6], seed=8)
    server = hidden_server("FedGH", data, "-slr", str(SLR), local_learning_rate=LR)
    start = [server.global_params.double()] * 2
    head = server.global_params.double()[HEAD]
    for rnd in range(2):
        expected = []
        for k, c in enumerate(data.clients):
            w = start[k].clone()
            w[HEAD] = head  # the client's body with the global head
            expected.append(hand_client(w, c.train_x.double(), c.train_y))
        done = run_round(server, rnd)
        for update, (w, means, labels) in zip(done.updates, expected):
            assert set(update.extras) == {"labels", "means"} and not update.uploads_params
            assert torch.equal(update.extras["labels"], labels)
            assert torch.allclose(update.extras["means"].double(), means, atol=1e-6, rtol=0)
        head = hand_head_step(head, torch.cat([m for _, m, _ in expected]), torch.cat([lab for _, _, lab in expected]))
        assert torch.allclose(server.global_params.double()[HEAD], head, atol=1e-6, rtol=0)
        for k, (w, _, _) in enumerate(expected):
            evaluated = server.eval_params(k).double()
            assert torch.allclose(evaluated[: HEAD.start], w[: HEAD.start], atol=1e-6, rtol=0)  # its own body
            assert torch.allclose(evaluated[HEAD], head, atol=1e-6, rtol=0)  # the global head
        start = [w for w, _, _ in expected]
    # the global body never moves
    assert torch.equal(server.global_params[: HEAD.start], hidden_server("FedGH", data).global_params[: HEAD.start])


def test_what_travels():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[10, 12, 9], seed=2)
    server = hidden_server("FedGH", data)
    head_bytes = (3 * HIDDEN + 3) * 4
    done = run_round(server, 0)
    assert done.package.nbytes(0) == head_bytes  # down: the head only
    for update in done.updates:
        k = len(update.extras["labels"])
        assert update.nbytes() == k * 8 + k * HIDDEN * 4  # up: labels and representations, no weights


def test_partial_participation():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[10, 12, 9], seed=9)
    server = hidden_server("FedGH", data, batch_size=4)
    initial = server.global_params.clone()
    run_round(server, 0, cohort=[0, 2])
    head = server.model.head_mask()
    # client 1, never selected: the initial body with the new global head
    assert torch.equal(server.eval_params(1)[~head], initial[~head])
    assert torch.equal(server.eval_params(1)[head], server.global_params[head])
    body0 = server.eval_params(0)[~head].clone()
    run_round(server, 1, cohort=[1])
    assert torch.equal(server.eval_params(0)[~head], body0)


def test_main_writes_the_head_loss(tmp_path):
    path = run_main_two_rounds(tmp_path, "FedGH")
    with h5py.File(path) as f:
        assert "rs_test_acc_global" not in f
        assert f["rs_fedgh_head_loss"].shape == (2,)


def test_bad_input():
    assert "body (features) and head (classifier)" in refusal("FedGH", module=nn.Linear(3, 2))
    assert "-slr" in refusal("FedGH", "-slr", "0")
