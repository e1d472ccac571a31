"""FML: mutual learning of the personal and meme models by hand over two rounds, the KL reductions
(paper, PFLlib), clipping, α = β = 1 is FedAvg (meme) and Local (personal), what travels, partial
participation, bad input."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fltest import build_server, make_args, random_dataset, run_round, two_client_server
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from knowledgetest import refusal

LR, C, DIM = 0.4, 2, 2


def logits_of(w, x):
    return x @ w[: DIM * C].view(C, DIM).T + w[DIM * C:]


def kl(log_q, p, reduction):
    per_sample = (p * (p.log() - log_q)).sum(1)
    return per_sample.mean() if reduction == "batchmean" else per_sample.mean() / C


def hand_fml(meme, personal, x, y, alpha, beta, reduction, clip=0.0, steps=2):
    """Both models' full-batch steps, each loss with the other model's prediction as a constant."""
    def clipped(g):
        return g if clip <= 0 else g * min(1.0, clip / (float(g.norm()) + 1e-6))

    for _ in range(steps):
        meme, personal = meme.detach().requires_grad_(True), personal.detach().requires_grad_(True)
        out_m, out_l = logits_of(meme, x), logits_of(personal, x)
        p_m, p_l = F.softmax(out_m, 1).detach(), F.softmax(out_l, 1).detach()
        loss_l = alpha * F.cross_entropy(out_l, y) + (1 - alpha) * kl(F.log_softmax(out_l, 1), p_m, reduction)
        loss_m = beta * F.cross_entropy(out_m, y) + (1 - beta) * kl(F.log_softmax(out_m, 1), p_l, reduction)
        (g_l,) = torch.autograd.grad(loss_l, personal)
        (g_m,) = torch.autograd.grad(loss_m, meme)
        personal, meme = personal - LR * clipped(g_l), meme - LR * clipped(g_m)
    return meme.detach(), personal.detach()


@pytest.mark.parametrize("reduction, clip", [("batchmean", 0.0), ("mean", 0.0), ("batchmean", 0.05)])
def test_two_rounds_by_hand(reduction, clip):
    alpha, beta = 0.3, 0.6
    data, server = two_client_server("FML", "-al", str(alpha), "-bt", str(beta), "--fml_kl", reduction,
                                     "--fml_clip", str(clip), seed=3, local_learning_rate=LR)
    glob = server.global_params.double()
    personal = [glob, glob]
    for rnd in range(2):
        expected = [hand_fml(glob, personal[k], c.train_x.double(), c.train_y, alpha, beta, reduction, clip)
                    for k, c in enumerate(data.clients)]
        updates = run_round(server, rnd).updates
        for k, (update, (meme, own)) in enumerate(zip(updates, expected)):
            assert torch.allclose(update.params.double(), meme, atol=1e-6, rtol=0)  # the meme model goes up
            assert torch.allclose(server.eval_params(k).double(), own, atol=1e-6, rtol=0)  # the personal model stays
        personal = [own for _, own in expected]
        glob = 0.4 * expected[0][0] + 0.6 * expected[1][0]
        assert torch.allclose(server.global_params.double(), glob, atol=1e-6, rtol=0)


def test_uniform_weighting_is_the_plain_mean():
    data, server = two_client_server("FML", "--fml_weighting", "uniform", seed=3)
    updates = run_round(server, 0).updates
    assert torch.allclose(server.global_params, (updates[0].params + updates[1].params) / 2, atol=1e-7)


def test_alpha_beta_one_is_fedavg_and_local():
    data = random_dataset(num_clients=4, dim=4, num_classes=3, sizes=[7, 12, 9, 15], seed=4)
    flags = dict(batch_size=4, local_epochs=2, join_ratio=0.5, global_rounds=3, local_learning_rate=0.1)
    fml, fedavg, local = (build_server(make_args(a, *extra, **flags), data) for a, extra in
                          (("FML", ["-al", "1", "-bt", "1"]), ("FedAvg", []), ("Local", [])))
    for server in (fml, fedavg, local):
        server.train(progress=False)
    assert torch.allclose(fml.global_params, fedavg.global_params, atol=1e-6, rtol=0)
    for i in range(4):
        assert torch.allclose(fml.eval_params(i), local.eval_params(i), atol=1e-6, rtol=0), i
    assert fml.history.extra_series["test_acc_global"] == pytest.approx(fedavg.history.test_acc)


def test_meme_model_travels_and_personal_models_wait():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[10, 12, 9], seed=2)
    server = build_server(make_args("FML", batch_size=4), data)
    initial = server.global_params.clone()
    done = run_round(server, 0, cohort=[0, 2])
    size = initial.numel() * 4
    assert done.package.nbytes(0) == size and all(u.nbytes() == size for u in done.updates)
    assert torch.equal(server.eval_params(1), initial)
    personal0 = server.eval_params(0).clone()
    run_round(server, 1, cohort=[1])
    assert torch.equal(server.eval_params(0), personal0)
    assert server.clients[1].expected_gradient_samples() == 2 * server.clients[1].local_epochs * 3 * 4


def test_bad_input():
    assert "-al" in refusal("FML", "-al", "1.5")
    assert "--fml_clip" in refusal("FML", "--fml_clip", "-1")
