"""KT-pFL: simplex projection, the knowledge-coefficient update and the personalised soft targets by
hand, distillation + local training by hand over two rounds, λ = 0 is Local, what travels, partial
participation, a run without public data refused in one line."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import main
from fltest import build_server, gradient_descent, make_args, random_dataset, run_round
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from flcore.servers.serverktpfl import personalised_targets, project_rows_to_simplex
from knowledgetest import refusal
from toydata import make_dataset

LR, C, DIM = 0.3, 2, 2
PUBLIC = ("--public_data", "0.2")


def test_rows_are_projected_onto_the_simplex():
    c = torch.tensor([[0.5, 0.5, 0.5], [2.0, 0.0, 0.0], [0.6, 0.5, -1.0]], dtype=torch.float64)
    expected = torch.tensor([[1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0], [0.55, 0.45, 0.0]], dtype=torch.float64)
    assert torch.allclose(project_rows_to_simplex(c), expected, atol=1e-12)
    on = torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.float64)
    assert torch.allclose(project_rows_to_simplex(on), on)  # already on it: unchanged


def linear_logits(w, x):
    return x @ w[: DIM * C].view(C, DIM).T + w[DIM * C:]


def kl_rows(p, q):
    """Mean over samples of Σ_c p log(p / q)."""
    return (p * (p.log() - q.log())).sum(-1).mean(-1)


def hand_coefficients(c, soft, lam, rho, lr):
    """One projected gradient step of λ·mean_n KL(ŝ_n ‖ s_n) + ρ‖c − 1/N‖² written with loops."""
    n = c.shape[0]
    c = c.clone().requires_grad_(True)
    losses = []
    for row in range(n):
        target = sum(c[row, m] * soft[m] for m in range(n)) / c[row].sum()
        losses.append(kl_rows(target, soft[row]))
    loss = lam * torch.stack(losses).mean() + rho * ((c - 1 / n) ** 2).sum()
    (grad,) = torch.autograd.grad(loss, c)
    return project_rows_to_simplex((c - lr * grad).detach())


def test_two_rounds_by_hand():
    temperature, lam = 2.0, 1.5
    data = random_dataset(num_clients=2, dim=DIM, num_classes=C, sizes=[5, 7], seed=6)
    flags = ["--ktpfl_temperature", str(temperature), "--ktpfl_lambda", str(lam), "--ktpfl_steps", "1",
             "--ktpfl_rho", "0.3", "--ktpfl_coef_lr", "2.0", *PUBLIC]
    server = build_server(make_args("KT-pFL", *flags, batch_size=8, local_epochs=2, drop_last=False,
                                    local_learning_rate=LR), data)
    public_x = server.public["public_x"].double()
    assert len(public_x) == 2  # 20% of 12 samples, taken from the clients
    assert sum(c.num_train for c in server.clients) == 10
    models = [server.global_params.double()] * 2
    c = torch.full((2, 2), 0.5, dtype=torch.float64)
    targets = None
    for rnd in range(2):
        expected = []
        for k, client in enumerate(server.clients):
            w = models[k]
            if targets is not None:  # one distillation step on all public samples (batch 8 covers them)
                w = w.clone().requires_grad_(True)
                log_student = F.log_softmax(linear_logits(w, public_x) / temperature, 1)
                loss = lam * temperature**2 * (targets[k] * (targets[k].log() - log_student)).sum(1).mean()
                (grad,) = torch.autograd.grad(loss, w)
                w = (w - LR * grad).detach()
            w = gradient_descent(w, client.data.train_x.double(), client.data.train_y, C, 2, LR)
            expected.append(w)
        done = run_round(server, rnd)
        if targets is not None:
            for k in range(2):
                assert torch.allclose(done.package.payload(k)["soft_target"].double(), targets[k], atol=1e-6)
        soft = torch.stack([F.softmax(linear_logits(w, public_x) / temperature, 1) for w in expected])
        for k, update in enumerate(done.updates):
            assert set(update.extras) == {"soft"} and not update.uploads_params
            assert torch.allclose(update.extras["soft"].double(), soft[k], atol=1e-6)
            assert torch.allclose(server.eval_params(k).double(), expected[k], atol=1e-6, rtol=0)
        c = hand_coefficients(c, soft, lam, 0.3, 2.0)
        assert torch.allclose(server.coefficients, c, atol=1e-6)
        targets = [sum(c[k, m] * soft[m] for m in range(2)) / c[k].sum() for k in range(2)]
        models = expected
    assert server.history.extra_series["ktpfl_self_weight"][-1] > 0.5  # own predictions weigh more


def test_personalised_targets_weigh_the_pool():
    soft = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]], dtype=torch.float64)  # 2 clients, 1 sample
    c = torch.tensor([[3.0, 1.0]], dtype=torch.float64)
    assert torch.allclose(personalised_targets(c, soft), torch.tensor([[[0.75, 0.25]]], dtype=torch.float64))


def test_lambda_zero_trains_exactly_like_local():
    data = random_dataset(num_clients=4, dim=4, num_classes=3, sizes=[17, 22, 19, 25], seed=4)
    flags = dict(batch_size=4, local_epochs=1, join_ratio=0.5, global_rounds=3, local_learning_rate=0.1)
    kt = build_server(make_args("KT-pFL", "--ktpfl_lambda", "0", *PUBLIC, **flags), data)
    kt.train(progress=False)
    local_data = kt.dataset  # Local on the same clients (the public samples removed)
    local = build_server(make_args("Local", **flags), local_data)
    local.train(progress=False)
    for i in range(4):
        assert torch.equal(kt.eval_params(i), local.eval_params(i)), i


def test_what_travels_and_partial_participation():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[20, 22, 19], seed=2)
    server = build_server(make_args("KT-pFL", *PUBLIC, batch_size=4), data)
    samples = len(server.public["public_x"])
    first = run_round(server, 0, cohort=[0, 2])
    assert not first.package.payloads  # nobody has uploaded yet: nothing to distil
    assert first.package.nbytes(0) == server.public["public_x"].numel() * 4  # the public inputs
    assert all(u.nbytes() == samples * 3 * 4 for u in first.updates)  # |public| x C soft predictions
    assert server.pool() == [0, 2]
    initial = build_server(make_args("KT-pFL", *PUBLIC, batch_size=4), data).global_params
    assert torch.equal(server.eval_params(1), initial)
    c = server.coefficients.clone()  # what round 1's package is made from
    soft = torch.stack([server.state.get("soft", m) for m in (0, 2)]).double()
    second = run_round(server, 1, cohort=[1])
    # client 1's target mixes clients 0 and 2 by its row of c (its own predictions do not exist yet)
    expected = personalised_targets(c[[1]][:, [0, 2]], soft)[0]
    assert torch.allclose(second.package.payload(1)["soft_target"].double(), expected, atol=1e-6)
    assert server.pool() == [0, 1, 2]


def test_needs_public_data(tmp_path, capsys):
    assert "--public_data 0.02" in refusal("KT-pFL")
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 4, 4))
    code = main.main(["-data", str(folder), "-m", "DNN", "-algo", "KT-pFL", "-gr", "1", "-dev", "cpu",
                      "--progress", "False", "-q", "--results_dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "public dataset" in err[0]
    assert not list((tmp_path / "r").glob("*.h5"))
