"""FedKD: truncated SVD by the energy rule (T = 1 sends the exact update), adaptive mutual
distillation by hand (mentor, mentee, W_h), what travels and its bytes, the server's mentee,
partial participation, bad input."""
from __future__ import annotations

import h5py
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fltest import random_dataset, run_main_two_rounds, run_round
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from flcore.clients.clientfedkd import compress, decompress, energy_threshold, initial_projection
from flcore.flat import FlatModel
from knowledgetest import HIDDEN, hand_forward, hidden_server, refusal

LR, MLR, C, DIM = 0.3, 0.2, 2, 2


def one_matrix_model(rows: int, cols: int) -> FlatModel:
    return FlatModel(nn.Linear(cols, rows))


def test_energy_rule_keeps_the_fewest_singular_values():
    torch.manual_seed(0)
    flat = one_matrix_model(8, 6)
    u, _ = torch.linalg.qr(torch.randn(8, 8))
    v, _ = torch.linalg.qr(torch.randn(6, 6))
    sigma = torch.tensor([3.0, 2.0, 1.0, 0.0, 0.0, 0.0])  # energies 9, 4, 1 of 14
    matrix = u[:, :6] @ torch.diag(sigma) @ v.T
    vector = torch.cat([matrix.reshape(-1), torch.arange(8.0)])
    for energy, rank in ((0.5, 1), (0.9, 2), (0.95, 3)):  # 9/14 = 0.64, 13/14 = 0.93, 14/14
        sent = compress(vector, flat.segments, energy)
        assert sent["weight|S"].shape == (rank,) and sent["weight|U"].shape == (8, rank)
        assert torch.equal(sent["bias"], vector[48:])  # vectors travel as they are
        best = (u[:, :rank] * sigma[:rank]) @ v[:, :rank].T  # the best rank-k approximation
        assert torch.allclose(decompress(sent, flat.segments, vector)[:48].view(8, 6), best, atol=1e-5)


def test_energy_one_sends_the_exact_tensor():
    torch.manual_seed(1)
    flat = one_matrix_model(5, 4)
    vector = torch.randn(flat.num_total)
    sent = compress(vector, flat.segments, 1.0)
    assert set(sent) == {"weight", "bias"}  # full rank: factors would be larger than the matrix
    assert torch.equal(decompress(sent, flat.segments, vector), vector)
    zero = compress(torch.zeros_like(vector), flat.segments, 0.9)  # an all-zero update: rank 0
    assert zero["weight|S"].numel() == 0 and torch.equal(decompress(zero, flat.segments, vector), torch.zeros_like(vector))


def test_energy_schedule():
    assert energy_threshold(0, 10, 0.95, 0.98) == 0.95
    assert energy_threshold(10, 10, 0.95, 0.98) == pytest.approx(0.98)
    assert energy_threshold(5, 10, 0.95, 0.98) == pytest.approx(0.965)


def kl(p, log_q):
    return (p * (p.log() - log_q)).sum(1).mean()


def hand_fedkd(mentor, mentee, w_h, x, y, steps=2):
    """Both models' and W_h's full-batch steps on the adaptive mutual distillation losses."""
    for _ in range(steps):
        mentor, mentee, w_h = (t.detach().requires_grad_(True) for t in (mentor, mentee, w_h))
        h_t, out_t = hand_forward(mentor, x, C)
        h_s, out_s = hand_forward(mentee, x, C)
        ce_t, ce_s = F.cross_entropy(out_t, y), F.cross_entropy(out_s, y)
        hidden = (h_t - h_s @ w_h.view(HIDDEN, HIDDEN).T).pow(2).mean()
        p_t, p_s = F.softmax(out_t, 1).detach(), F.softmax(out_s, 1).detach()
        mentor_loss = ce_t + (kl(p_s, F.log_softmax(out_t, 1)) + hidden) / (ce_t + ce_s)
        mentee_loss = ce_s + (kl(p_t, F.log_softmax(out_s, 1)) + hidden) / (ce_t + ce_s)
        g_t, w_t = torch.autograd.grad(mentor_loss, [mentor, w_h], retain_graph=True)
        g_s, w_s = torch.autograd.grad(mentee_loss, [mentee, w_h])
        mentor, mentee, w_h = mentor - LR * g_t, mentee - MLR * g_s, w_h - LR * (w_t + w_s)
    return mentor.detach(), mentee.detach(), w_h.detach()


def test_mutual_distillation_by_hand_with_exact_transfer():
    data = random_dataset(num_clients=2, dim=DIM, num_classes=C, sizes=[4, 6], seed=4)
    server = hidden_server("FedKD", data, "-Ts", "1", "-Te", "1", "-mlr", str(MLR), local_learning_rate=LR)
    mentee = server.global_params.double()
    mentors = [mentee] * 2
    projections = [initial_projection(server.args.seed, c.cid, HIDDEN, mentee) for c in data.clients]
    for rnd in range(2):
        expected = [hand_fedkd(mentors[k], mentee, projections[k], c.train_x.double(), c.train_y)
                    for k, c in enumerate(data.clients)]
        done = run_round(server, rnd)
        for k, (update, (mentor, trained, w_h)) in enumerate(zip(done.updates, expected)):
            delta = decompress(update.extras, server.model.segments, server.global_params).double()
            assert torch.allclose(delta, trained - mentee, atol=1e-6, rtol=0)  # the exact update
            assert torch.allclose(server.eval_params(k).double(), mentor, atol=1e-6, rtol=0)  # the mentor stays
            assert torch.allclose(server.state.get("projection", k).double(), w_h, atol=1e-6, rtol=0)
        mentee = mentee + sum(trained - mentee for _, trained, _ in expected) / 2
        assert torch.allclose(server.mentee.double(), mentee, atol=1e-6, rtol=0)
        mentors = [m for m, _, _ in expected]
        projections = [w for _, _, w in expected]


def test_uploads_and_downloads_count_the_factors():
    data = random_dataset(num_clients=3, dim=6, num_classes=3, sizes=[10, 12, 9], seed=2)
    server = hidden_server("FedKD", data, "-Ts", "0.5", "-Te", "0.5", batch_size=4)
    done = run_round(server, 0)
    for update in done.updates:
        assert not update.uploads_params
        assert update.nbytes() == sum(t.numel() * 4 for t in update.extras.values())
        assert any(name.endswith("|S") for name in update.extras)  # some matrix really went as factors
    assert done.package.nbytes(0) == sum(t.numel() * 4 for t in done.package.extras.values())
    # the server's mentee grows from what it sent, the truncated mentee, not from its exact one
    sent = decompress(done.package.extras, server.model.segments, server.mentee)
    mean_update = sum(decompress(u.extras, server.model.segments, sent) for u in done.updates) / 3
    assert torch.allclose(server.mentee, sent + mean_update, atol=1e-6)


def test_partial_participation():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[10, 12, 9], seed=9)
    server = hidden_server("FedKD", data, batch_size=4)
    initial = server.global_params.clone()
    run_round(server, 0, cohort=[0, 2])
    assert torch.equal(server.eval_params(1), initial) and not server.state.has("projection", 1)
    mentor0 = server.eval_params(0).clone()
    run_round(server, 1, cohort=[1])
    assert torch.equal(server.eval_params(0), mentor0)
    assert server.state.has("projection", 1)


def test_main_records_the_mentee(tmp_path):
    with h5py.File(run_main_two_rounds(tmp_path, "FedKD")) as f:
        assert f["rs_test_acc_mentee"].shape == f["rs_test_acc"].shape == (3,)
        assert "rs_test_acc_global" not in f


def test_bad_input():
    assert "body (features) and head (classifier)" in refusal("FedKD", module=nn.Linear(3, 2))
    assert "-Ts" in refusal("FedKD", "-Ts", "1.5")
    assert "-mlr" in refusal("FedKD", "-mlr", "0")


def test_a_diverging_mentee_stops_the_run_in_one_line_not_in_the_svd():
    """Non-finite values must end in Diverged (main prints one line and keeps the results so far),
    never in torch.linalg.svd's traceback."""
    from utils.errors import Diverged

    data = random_dataset(num_clients=2, dim=6, num_classes=3, sizes=[10, 12], seed=4)
    server = hidden_server("FedKD", data, "-mlr", "1e30", "-lr", "1e30", batch_size=4)
    with pytest.raises(Diverged, match="non-finite|loss became"):
        for rnd in range(3):
            run_round(server, rnd)


def test_pfllib_gradient_clipping_bounds_each_step_and_a_loose_bound_changes_nothing():
    data = random_dataset(num_clients=2, dim=DIM, num_classes=C, sizes=[4, 6], seed=4)

    def one_round(*flags):
        server = hidden_server("FedKD", data, "-Ts", "1", "-Te", "1", "-mlr", str(MLR), *flags,
                               local_learning_rate=LR, local_epochs=1, batch_size=16)  # one full-batch step
        start = server.global_params.clone()
        done = run_round(server, 0)
        mentors = [server.eval_params(k) - start for k in range(2)]
        mentees = [decompress(u.extras, server.model.segments, start) for u in done.updates]
        return mentors, mentees, [server.state.get("projection", k).clone() for k in range(2)]

    plain, loose = one_round(), one_round("--fedkd_clip", "1e9")
    assert all(torch.equal(a, b) for part_a, part_b in zip(plain, loose) for a, b in zip(part_a, part_b))
    bound = 1e-3
    mentors, mentees, _ = one_round("--fedkd_clip", str(bound))
    for step in mentors:  # the mentor moved lr x (its gradient scaled to norm 1e-3)
        assert float(step.norm()) == pytest.approx(LR * bound, rel=1e-4)
    for step in mentees:
        assert float(step.norm()) == pytest.approx(MLR * bound, rel=1e-4)
