"""Data poisoning under DP-SGD (``-dp --attack label_flip``): the local steps compose in the documented
order (poison the minibatch, then clip and noise per sample), checked against a hand computation on
a linear model, and the run goes end to end through ``main`` with ε accounted as without the attack."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

pytest.importorskip("opacus", reason="the DP accountant needs opacus (requirements.txt pins it)")

from fltest import build_server, make_args, random_dataset, run_main_two_rounds  # noqa: E402
from fltest import one_thread  # noqa: E402,F401  (fixture)
from flcore.features import attacks  # noqa: E402
from flcore.features.privacy.dpsgd import DPSGD  # noqa: E402
from utils.seeding import torch_generator  # noqa: E402

CLIENTS, CLASSES, DIM = 4, 3, 4


def poisoned_dp_server(sigma: float = 0.0):
    data = random_dataset(num_clients=CLIENTS, dim=DIM, num_classes=CLASSES, sizes=[10] * CLIENTS, seed=5)
    args = make_args("FedAvg", "-dp", "-dps", str(sigma), dp_clip=0.05, dp_sampling="shuffle", batch_size=5,
                     num_clients=CLIENTS, attack="label_flip", attack_fraction=0.25)
    return data, build_server(args, data)


def clipped_mean_by_hand(model, x: torch.Tensor, labels: torch.Tensor, clip: float) -> torch.Tensor:
    """Σ_i g_i · min(1, C / (‖g_i‖ + 1e-6)) / B for the linear softmax model: g_i = (p_i − e_{y_i}) x_iᵀ for
    the weights and p_i − e_{y_i} for the bias, in the flat vector's layout."""
    segments = {seg.name: seg for seg in model.param_segments()}
    weight = model.params[segments["head.weight"].start:segments["head.weight"].stop].double().view(CLASSES, DIM)
    bias = model.params[segments["head.bias"].start:segments["head.bias"].stop].double()
    total = torch.zeros(model.num_params, dtype=torch.float64)
    for xi, yi in zip(x.double(), labels):
        error = torch.softmax(weight @ xi + bias, 0) - torch.nn.functional.one_hot(yi, CLASSES).double()
        g = torch.zeros(model.num_params, dtype=torch.float64)
        g[segments["head.weight"].start:segments["head.weight"].stop] = torch.outer(error, xi).flatten()
        g[segments["head.bias"].start:segments["head.bias"].stop] = error
        total += g * min(1.0, clip / (float(g.norm()) + 1e-6))
    return total / len(labels)


def test_the_chain_poisons_the_labels_then_clips_per_sample():
    data, server = poisoned_dp_server()
    chain = server.clients[0].local_step
    assert [type(link) for link in chain.links] == [attacks.PoisonedData, DPSGD]  # the documented order
    assert chain.carried == ("dp_steps",) and not chain.plain
    mask = attacks.attacker_mask(0, 0.25, False, CLIENTS, 0)
    package = server.package(0, list(range(CLIENTS)))
    idx = torch.tensor([0, 3, 4, 7, 9])
    model = server.model
    for i in range(CLIENTS):
        x, y = data.clients[i].train_x[idx], data.clients[i].train_y[idx]
        trained_on = CLASSES - 1 - y if mask[i] else y
        server.clients[i].step_gradient(model, idx, {}, package, 0)
        want = clipped_mean_by_hand(model, x, trained_on, 0.05)
        torch.testing.assert_close(model.grad.double(), want, rtol=1e-5, atol=1e-7)
        assert not torch.allclose(want, clipped_mean_by_hand(model, x, trained_on, float("inf")))  # C clips
        if mask[i]:  # an attacker's step is not the clipped gradient of its true labels
            assert not torch.allclose(model.grad.double(), clipped_mean_by_hand(model, x, y, 0.05), atol=1e-4)
    assert mask.sum() == 1


def test_an_attackers_noise_is_its_own_seeded_stream_on_top_of_the_poisoned_clipped_mean():
    data, server = poisoned_dp_server(sigma=0.8)
    attacker = int(np.flatnonzero(attacks.attacker_mask(0, 0.25, False, CLIENTS, 0))[0])
    client, model = server.clients[attacker], server.model
    idx = torch.tensor([1, 2, 5, 6, 8])
    x, y = data.clients[attacker].train_x[idx], data.clients[attacker].train_y[idx]
    client.step_gradient(model, idx, {}, server.package(3, list(range(CLIENTS))), 4)
    noise = torch.randn(model.num_params, generator=torch_generator(0, "dp", 3, client.cid, 4))
    want = clipped_mean_by_hand(model, x, CLASSES - 1 - y, 0.05) + 0.8 * 0.05 * noise.double() / 5
    torch.testing.assert_close(model.grad.double(), want, rtol=1e-5, atol=1e-7)


def test_dp_with_label_flipping_runs_through_main_and_accounts_epsilon_as_without_it(tmp_path):
    flags = ("-dp", "-dps", "1.0", "--dp_sampling", "poisson")
    poisoned = run_main_two_rounds(tmp_path / "poisoned", "FedAvg", *flags, "--attack", "label_flip",
                                   "--attack_fraction", "0.3")
    plain = run_main_two_rounds(tmp_path / "plain", "FedAvg", *flags)
    with h5py.File(poisoned) as f, h5py.File(plain) as g:
        epsilon = f["rs_dp_epsilon"][()]
        assert epsilon.shape == (2,) and np.all(np.isfinite(epsilon)) and epsilon[1] > epsilon[0] > 0
        np.testing.assert_array_equal(epsilon, g["rs_dp_epsilon"][()])  # the same steps at the same rates
        assert list(f["rs_attack_uploads"][()]) == [1, 1]  # round(0.3 x 4) = 1 attacker, in every cohort
        assert not np.array_equal(f["rs_test_acc"][()], g["rs_test_acc"][()]) or not np.array_equal(
            f["rs_train_loss"][()], g["rs_train_loss"][()])  # the attacker trained on other labels
