"""FedAS: alignment, local training, Fisher trace and Fisher-weighted aggregation by hand on a
two-layer model; heads never leave the client; partial participation; main."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fltest import build_server, make_args, random_dataset, run_main_two_rounds, run_round
from fltest import one_thread  # noqa: F401  (fixture)
from twolayer import CLASSES, DIM, HEAD, TwoLayer, features, grad_of, two_layer_server


def align(w, x, y, protos, lr):
    """One full-batch alignment step on the body."""
    w = w.detach().clone().requires_grad_(True)
    z = features(w, x)
    loss = sum(F.mse_loss(z[y == c], protos[c].expand_as(z[y == c])) for c in y.unique().tolist())
    (g,) = torch.autograd.grad(loss, w)
    g[HEAD] = 0
    return (w - lr * g).detach()


def class_means(w, x, y):
    z = features(w, x)
    return torch.stack([z[y == c].mean(0) if (y == c).any() else torch.zeros(z.shape[1], dtype=z.dtype)
                        for c in range(CLASSES)])


def test_two_rounds_by_hand():
    lr, align_lr = 0.1, 0.05
    data, server = two_layer_server("FedAS", "--fedas_align_lr", str(align_lr), local_learning_rate=lr)
    w = server.global_params.double()
    xy = [(c.train_x.double(), c.train_y) for c in data.clients]
    personal = [None, None]
    for rnd in range(2):
        trained, traces = [], []
        for i, (x, y) in enumerate(xy):
            own = personal[i] if personal[i] is not None else w
            start = w.clone()
            if personal[i] is not None:
                start[HEAD] = personal[i][HEAD]
            v = align(start, x, y, class_means(own, x, y), align_lr)
            for _ in range(2):
                v = v - lr * grad_of(v, x, y)
            trained.append(v)
            traces.append(float(grad_of(v, x, y).pow(2).sum()))
        personal = trained
        total = sum(traces)
        w = w.clone()
        w[: HEAD.start] = sum(t / total * m[: HEAD.start] for t, m in zip(traces, trained))
        updates = run_round(server, rnd).updates
        assert torch.allclose(server.global_params.double(), w, atol=1e-5)
        for i in range(2):
            assert float(updates[i].extras["fisher_trace"]) == pytest.approx(traces[i], rel=1e-4)
            assert torch.allclose(server.eval_params(i).double(), trained[i], atol=1e-5)
            # the head never leaves the client: the upload carries the server's (initial) head
            assert torch.equal(updates[i].params[HEAD], server.initial_params[HEAD])


def test_partial_participation():
    data, server = two_layer_server("FedAS", num_clients=4, join_ratio=0.5)
    cohort0 = run_round(server, 0).cohort
    before = {i: server.eval_params(i).clone() for i in range(4)}
    for i in set(range(4)) - set(cohort0):
        assert torch.equal(before[i], server.initial_params)
    cohort1 = run_round(server, 1).cohort
    for i in set(range(4)) - set(cohort1):
        assert torch.equal(server.eval_params(i), before[i])
    assert len(server.history.extra_series["fedas_fisher_trace"]) == 2


def test_two_round_run_through_main(tmp_path):
    run_main_two_rounds(tmp_path, "FedAS")


def test_alignment_and_fisher_passes_are_charged_as_work():
    # 10 and 12 samples, batch 4 (drop_last): 2 and 3 local steps and a Fisher pass of as many steps;
    # an alignment epoch in minibatches of 3: 3 and 4 steps
    data = random_dataset(num_clients=2, dim=DIM, num_classes=CLASSES, sizes=[10, 12], seed=2)
    torch.manual_seed(0)
    server = build_server(make_args("FedAS", "--fedas_align_batch", "3", batch_size=4, local_epochs=1), data,
                          TwoLayer())
    updates = run_round(server, 0).updates
    expected = [2 * 8 + 9, 2 * 12 + 12]
    assert [u.samples_processed for u in updates] == expected
    assert [c.expected_gradient_samples() for c in server.clients] == expected
