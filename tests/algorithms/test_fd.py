"""FD: the distillation loss and the uploaded per-label logits by hand over two rounds (teacher =
the other clients' logits, paper; or everyone's, PFLlib), PFLlib's raw-logit target, what travels
(and its bytes), λ = 0 is Local, partial participation, bad input."""
from __future__ import annotations

import h5py
import pytest
import torch
import torch.nn.functional as F

from fltest import build_server, make_args, random_dataset, run_main_two_rounds, run_round
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from knowledgetest import refusal, HiddenBody, hand_forward, hidden_server, per_class_sums

LR, LAM, C = 0.3, 1.5, 3


def hand_client(w, x, y, teacher, present, target="softmax", steps=2):
    """Full-batch steps on CE + λ·ψ(F(x), F̂_y) written out; returns (w, per-label mean logits, labels)."""
    sums = torch.zeros(C, C, dtype=w.dtype)
    seen = torch.zeros(C, dtype=w.dtype)
    for _ in range(steps):
        w = w.detach().requires_grad_(True)
        logits = hand_forward(w, x, C)[1]
        batch_sums, batch_seen = per_class_sums(logits.detach(), y, C)
        sums, seen = sums + batch_sums, seen + batch_seen
        loss = F.cross_entropy(logits, y)
        if teacher is not None:
            terms = []
            for row, label in zip(logits, y.tolist()):
                log_p = torch.log_softmax(row, 0)
                if target == "softmax":
                    terms.append(-(torch.softmax(teacher[label], 0) * log_p).sum() if present[label] else 0 * row.sum())
                else:  # PFLlib: raw teacher logits (or the row's own logits) taken as probabilities
                    probs = teacher[label] if present[label] else row.detach()
                    terms.append(-(probs * log_p).sum())
            loss = loss + LAM * torch.stack(terms).mean()
        (grad,) = torch.autograd.grad(loss, w)
        w = w - LR * grad
    held = seen > 0
    return w.detach(), sums[held] / seen[held].unsqueeze(1), torch.nonzero(held).flatten()


def teachers(expected, num_clients, exclude_own):
    """Per client: (teacher logits, present) from the uploads ``expected`` = [(w, means, labels)]."""
    out = []
    for i in range(num_clients):
        sums = torch.zeros(C, C, dtype=torch.float64)
        count = torch.zeros(C, dtype=torch.float64)
        for j, (_, means, labels) in enumerate(expected):
            if exclude_own and j == i:
                continue
            for row, label in enumerate(labels.tolist()):
                sums[label] += means[row]
                count[label] += 1
        out.append((sums / count.clamp_min(1).unsqueeze(1), count > 0))
    return out


@pytest.mark.parametrize("teacher, target", [("others", "softmax"), ("all", "softmax"), ("all", "pfllib")])
def test_two_rounds_by_hand(teacher, target):
    data = random_dataset(num_clients=3, dim=2, num_classes=C, sizes=[4, 6, 5], seed=7)
    server = hidden_server("FD", data, "-lam", str(LAM), "--fd_teacher", teacher, "--fd_target", target,
                           local_learning_rate=LR)
    models = [server.global_params.double()] * 3
    given = [(None, None)] * 3
    for rnd in range(2):
        expected = [hand_client(models[k], c.train_x.double(), c.train_y, *given[k], target=target)
                    for k, c in enumerate(data.clients)]
        done = run_round(server, rnd)
        for k, (update, (w, means, labels)) in enumerate(zip(done.updates, expected)):
            assert set(update.extras) == {"labels", "means"} and not update.uploads_params
            assert torch.equal(update.extras["labels"], labels)
            assert torch.allclose(update.extras["means"].double(), means, atol=1e-6, rtol=0)
            assert torch.allclose(server.eval_params(k).double(), w, atol=1e-6, rtol=0)
        if rnd == 1:
            for k, (logits, present) in enumerate(given):
                sent = {**done.package.extras, **done.package.payload(k)}
                assert torch.equal(sent["teacher_present"], present)
                assert torch.allclose(sent["teacher_logits"].double()[present], logits[present], atol=1e-6, rtol=0)
            plain = hand_client(models[0], data.clients[0].train_x.double(), data.clients[0].train_y, None, None)[0]
            assert (plain - expected[0][0]).abs().max() > 1e-4  # the distillation term really acts
        models = [w for w, _, _ in expected]
        given = teachers(expected, 3, exclude_own=teacher == "others")


def test_upload_is_a_few_logits_and_bytes_count_them():
    data = random_dataset(num_clients=3, dim=4, num_classes=C, sizes=[10, 12, 9], seed=2)
    server = hidden_server("FD", data)
    first = run_round(server, 0)
    assert first.package.total_nbytes() == 0
    for update in first.updates:
        k = len(update.extras["labels"])
        assert update.nbytes() == k * 8 + k * C * 4  # labels and k x C mean logits, no model
    second = run_round(server, 1)
    # the paper's teacher leaves each client's own logits out: one C x C teacher and mask per client
    assert set(second.package.payloads) == set(second.cohort) and not second.package.extras
    assert second.package.nbytes(0) == C * C * 4 + C


def test_lambda_zero_trains_exactly_like_local():
    data = random_dataset(num_clients=4, dim=4, num_classes=C, sizes=[7, 12, 9, 15], seed=4)
    flags = dict(batch_size=4, local_epochs=2, join_ratio=0.5, global_rounds=3, local_learning_rate=0.1)
    servers = []
    for algorithm, extra in (("FD", ["-lam", "0"]), ("Local", [])):
        torch.manual_seed(0)
        server = build_server(make_args(algorithm, *extra, **flags), data, HiddenBody(4, C))
        server.train(progress=False)
        servers.append(server)
    fd, local = servers
    for i in range(4):
        assert torch.equal(fd.eval_params(i), local.eval_params(i)), i
    assert fd.history.test_acc == local.history.test_acc


def test_a_client_not_among_the_uploaders_gets_every_upload():
    data = random_dataset(num_clients=3, dim=4, num_classes=C, sizes=[10, 12, 9], seed=3)
    server = hidden_server("FD", data)
    run_round(server, 0, cohort=[0, 1])
    everyone = server.teacher(None)
    assert torch.equal(server.teacher(2)["teacher_logits"], everyone["teacher_logits"])
    assert not torch.equal(server.teacher(0)["teacher_logits"], everyone["teacher_logits"])
    untouched = server.eval_params(2)
    run_round(server, 1, cohort=[0])
    assert torch.equal(server.eval_params(2), untouched)
    assert server.uploaders == [0]


def test_main_records_personal_accuracy_and_kilobytes(tmp_path):
    path = run_main_two_rounds(tmp_path, "FD")
    with h5py.File(path) as f:
        assert "rs_test_acc_global" not in f
        assert (f["rs_bytes_up"][()] > 0).all() and (f["rs_bytes_up"][()] < 2_000).all()


def test_bad_input():
    assert "-lam" in refusal("FD", "-lam", "-1")
