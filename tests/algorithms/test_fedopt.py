"""FedAdam / FedYogi / FedAdagrad: server steps by hand, bias correction, buffers, runs through main."""
from __future__ import annotations

import h5py
import pytest
import torch

from fltest import (build_server, gradient_descent, make_args, random_dataset, run_main_two_rounds, run_round,
                    two_client_server)


def second_moment(variant, v, d2, beta2):
    if variant == "FedAdam":
        return beta2 * v + (1 - beta2) * d2
    if variant == "FedYogi":
        return v - (1 - beta2) * d2 * torch.sign(v - d2)
    return v + d2


def setting(variant, *extra):
    return two_client_server(variant, "--server_lr", "0.05", "--beta1", "0.8", "--beta2", "0.9", "--tau", "0.01",
                             *extra, seed=6, local_learning_rate=0.5)


@pytest.mark.parametrize("variant", ["FedAdam", "FedYogi", "FedAdagrad"])
def test_server_step_matches_hand_computation(variant):
    data, server = setting(variant)
    eta, beta1, beta2, tau = 0.05, 0.8, 0.9, 0.01
    w = server.global_params.double()
    m, v = torch.zeros_like(w), torch.full_like(w, tau**2)
    for rnd in range(2):
        local = [gradient_descent(w, c.train_x.double(), c.train_y, 2, 2, 0.5) for c in data.clients]
        delta = 0.4 * local[0] + 0.6 * local[1] - w
        m = beta1 * m + (1 - beta1) * delta
        v = second_moment(variant, v, delta**2, beta2)
        w = w + eta * m / (v.sqrt() + tau)
        run_round(server, rnd)
        assert torch.allclose(server.global_params.double(), w, atol=1e-6, rtol=0)


def test_adam_and_yogi_first_step_in_closed_form():
    # One coordinate, Δ = 0.2, m0 = 0, v0 = τ²: Adam v1 = 0.9·1e-4 + 0.1·0.04; Yogi v1 = 1e-4 + 0.1·0.04
    # (sign(τ² − Δ²) = −1 grows v); the step is η·0.2·Δ/(√v1 + τ).
    from flcore.protocol import ClientUpdate, RoundPackage

    for variant, v1 in (("FedAdam", 0.9e-4 + 0.004), ("FedYogi", 1e-4 + 0.004)):
        data, server = setting(variant)
        w0 = server.global_params.clone()
        moved = w0.clone()
        moved[0] += 0.2
        server.aggregate([ClientUpdate(0, 5, 1, moved, 0.0), ClientUpdate(1, 5, 1, moved, 0.0)],
                         RoundPackage(0, w0, [0, 1]))
        step = 0.05 * (0.2 * 0.2) / (v1**0.5 + 0.01)
        assert server.global_params[0].item() == pytest.approx(w0[0].item() + step, abs=1e-6)
        assert torch.equal(server.global_params[1:], w0[1:])  # Δ = 0 there: m = 0, no move


def test_bias_correction_flag():
    data, plain = setting("FedAdam")
    _, corrected = setting("FedAdam", "--fedopt_bias_correction", "True")
    w = plain.global_params.double()
    local = [gradient_descent(w, c.train_x.double(), c.train_y, 2, 2, 0.5) for c in data.clients]
    delta = 0.4 * local[0] + 0.6 * local[1] - w
    m_hat = (0.2 * delta) / (1 - 0.8)
    v_hat = (0.9 * 1e-4 + 0.1 * delta**2) / (1 - 0.9)
    run_round(plain, 0)
    run_round(corrected, 0)
    assert torch.allclose(corrected.global_params.double(), w + 0.05 * m_hat / (v_hat.sqrt() + 0.01), atol=1e-6)
    assert not torch.allclose(plain.global_params, corrected.global_params)


def test_defaults_follow_the_paper():
    args = make_args("FedAdam")
    server = build_server(args, random_dataset(num_clients=2, dim=2, num_classes=2))
    hp = server.hp
    defaults = (hp.server_learning_rate, hp.beta1, hp.beta2, hp.tau, hp.fedopt_bias_correction)
    assert defaults == (0.01, 0.9, 0.99, 1e-3, False)
    assert torch.allclose(server.second_moment, torch.full_like(server.second_moment, 1e-6))


def test_beta1_is_a_per_algorithm_default():
    # Adagrad has no momentum (the paper's experiments, Flower); Adam and Yogi keep Algorithm 2's 0.9.
    assert [make_args(variant).beta1 for variant in ("FedAdam", "FedYogi", "FedAdagrad")] == [0.9, 0.9, 0.0]
    assert make_args("FedAdagrad", "--beta1", "0.9").beta1 == 0.9


def test_fedadagrad_default_step_has_no_momentum():
    # β1 = 0: m = Δ of this round only, v = τ² + ΣΔ², w ← w + η·Δ/(√v + τ).
    data, server = two_client_server("FedAdagrad", "--server_lr", "0.05", "--tau", "0.01", seed=6,
                                     local_learning_rate=0.5)
    eta, tau = 0.05, 0.01
    w = server.global_params.double()
    v = torch.full_like(w, tau**2)
    for rnd in range(3):
        local = [gradient_descent(w, c.train_x.double(), c.train_y, 2, 2, 0.5) for c in data.clients]
        delta = 0.4 * local[0] + 0.6 * local[1] - w
        v = v + delta**2
        w = w + eta * delta / (v.sqrt() + tau)
        run_round(server, rnd)
        assert torch.allclose(server.global_params.double(), w, atol=1e-6, rtol=0)
    assert torch.allclose(server.first_moment.double(), delta, atol=1e-6, rtol=0)


@pytest.mark.parametrize("variant", ["FedAdam", "FedYogi", "FedAdagrad"])
def test_two_round_run_through_main(tmp_path, variant):
    path = run_main_two_rounds(tmp_path, variant)
    assert variant in path.name
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
    assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
