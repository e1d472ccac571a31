"""FedMix: the FedMix and NaiveMix losses against a hand computation on a linear model, the shared
means (uploaded once, a client never mixes with its own), λ = 0 is FedAvg, bytes, AdaFL selection."""
from __future__ import annotations

import h5py
import pytest
import torch
import torch.nn.functional as F

from fltest import build_server, make_args, random_dataset, run_main_two_rounds, run_round
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from knowledgetest import refusal

C, DIM = 3, 4


def hand_fedmix_loss(w, x, y, mean_x, mean_y, lam):
    """The FedMix loss of the linear model w = [W, b], its input derivative written out:
    ∂CE(Wx + b, y)/∂x = Wᵀ(softmax(Wx + b) − onehot(y))."""
    weight, bias = w[: C * DIM].view(C, DIM), w[C * DIM:]
    scaled = (1 - lam) * x
    logits = scaled @ weight.T + bias
    probs = torch.softmax(logits, 1)
    own = F.cross_entropy(logits, y, reduction="none")
    mixed = -(mean_y * torch.log_softmax(logits, 1)).sum(1)
    derivative = ((probs - F.one_hot(y, C).to(w.dtype)) @ weight * mean_x).sum(1)
    return ((1 - lam) * own + lam * mixed + lam * derivative).mean()


def hand_naive_loss(w, x, y, mean_x, mean_y, lam):
    weight, bias = w[: C * DIM].view(C, DIM), w[C * DIM:]
    logits = ((1 - lam) * x + lam * mean_x) @ weight.T + bias
    mixed = -(mean_y * torch.log_softmax(logits, 1)).sum(1)
    return ((1 - lam) * F.cross_entropy(logits, y, reduction="none") + lam * mixed).mean()


@pytest.mark.parametrize("variant, hand", [("fedmix", hand_fedmix_loss), ("naive", hand_naive_loss)])
def test_loss_and_gradient_by_hand(variant, hand):
    lam = 0.3
    data = random_dataset(num_clients=2, dim=DIM, num_classes=C, sizes=[6, 8], seed=2)
    server = build_server(make_args("FedMix", "--fedmix_variant", variant, "--fedmix_lambda", str(lam)), data)
    client = server.clients[0]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, DIM, generator=g), torch.randint(0, C, (5,), generator=g)
    mean_x = torch.randn(5, DIM, generator=g)
    mean_y = torch.softmax(torch.randn(5, C, generator=g), 1)
    ctx = {"mix_x": mean_x, "mix_y": mean_y, "lam": torch.tensor(lam)}
    flat = server.model
    flat.load(server.global_params)
    flat.zero_grad()
    loss = client.local_loss(flat.net, x, y, ctx)
    loss.backward()
    w = server.global_params.double().requires_grad_(True)
    expected = hand(w, x.double(), y, mean_x.double(), mean_y.double(), lam)
    (grad,) = torch.autograd.grad(expected, w)
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), abs=1e-6)
    assert torch.allclose(flat.grad.double(), grad, atol=1e-6)


def test_lambda_zero_is_fedavg_exactly():
    data = random_dataset(num_clients=4, dim=DIM, num_classes=C, sizes=[17, 22, 19, 25], seed=4)
    flags = dict(batch_size=4, local_epochs=1, join_ratio=0.5, global_rounds=3, local_learning_rate=0.1)
    mix = build_server(make_args("FedMix", "--fedmix_lambda", "0", **flags), data)
    avg = build_server(make_args("FedAvg", **flags), data)
    for server in (mix, avg):
        server.train(progress=False)
    assert torch.equal(mix.global_params, avg.global_params)
    assert mix.history.test_acc == avg.history.test_acc


def test_means_travel_once_and_a_client_mixes_only_with_others():
    data = random_dataset(num_clients=3, dim=DIM, num_classes=C, sizes=[20, 30, 10], seed=5)
    server = build_server(make_args("FedMix", "--fedmix_mean_size", "10", batch_size=5), data)
    model_bytes = server.global_params.numel() * 4
    first = run_round(server, 0, cohort=[0, 1])
    assert "mean_x" not in first.package.static  # nothing shared yet
    for update, client in zip(first.updates, data.clients):
        mean_x, mean_y = update.extras["mean_x"], update.extras["mean_y"]
        groups = client.num_train // 10
        assert mean_x.shape == (groups, DIM) and torch.allclose(mean_y.sum(1), torch.ones(groups))
        # every sample averaged exactly once (the sizes are multiples of M)
        assert torch.allclose(mean_x.sum(0) * 10, client.train_x.sum(0), atol=1e-5)
        assert torch.allclose(mean_y.sum(0) * 10, F.one_hot(client.train_y, C).float().sum(0))
        assert update.nbytes() == model_bytes + (groups * DIM + groups * C) * 4
    second = run_round(server, 1, cohort=[0, 2])
    assert torch.equal(second.package.static["mean_owner"], torch.tensor([0, 0, 1, 1, 1]))
    assert "mean_x" not in second.updates[0].extras and "mean_x" in second.updates[1].extras
    own_only = server.package(2, [0], static={k: v[:2] for k, v in second.package.static.items()})
    assert float(server.clients[0].begin_round(own_only, 3)["lam"]) == 0.0  # its own means only: no mixing
    ctx = server.clients[0].begin_round(second.package, 3)
    others = second.package.static["mean_x"][2:]
    assert float(ctx["lam"]) == pytest.approx(0.1)
    assert all(any(torch.equal(row, o) for o in others) for row in ctx["mix_x"].reshape(-1, DIM))


def test_runs_under_adafl_selection(tmp_path):
    with h5py.File(run_main_two_rounds(tmp_path, "FedMix", "--select", "adafl")) as f:
        assert f["rs_join_fraction"].shape[0] >= 2 and f["rs_test_acc"].shape == (3,)


def test_bad_input():
    assert "--fedmix_lambda" in refusal("FedMix", "--fedmix_lambda", "1")
    assert "--fedmix_mean_size" in refusal("FedMix", "--fedmix_mean_size", "0")
