"""FedDyn: client states, server h and model by hand over two rounds, α = 0's first client step is
FedAvg's, states under partial participation, PFLlib's unsquared regulariser, warnings, engines."""
from __future__ import annotations

import pytest
import torch

from fltest import (assert_same_training, build_server, engine_run, fl_log_messages, linear_grad, make_args,
                    random_dataset, run_round, two_client_server)
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from utils.errors import FLError


def test_states_and_server_model_match_hand_computation_over_two_rounds():
    alpha, lr, steps = 0.5, 0.3, 2
    data, server = two_client_server("FedDyn", "-al", str(alpha), seed=21, local_learning_rate=lr, local_epochs=steps)
    theta = server.global_params.double()
    h = torch.zeros_like(theta)
    grads = [torch.zeros_like(theta), torch.zeros_like(theta)]
    for rnd in range(2):
        uploads = []
        for k, client in enumerate(data.clients):
            w = theta.clone()
            for _ in range(steps):
                w = w - lr * (linear_grad(w, client.train_x.double(), client.train_y, 2) - grads[k]
                              + alpha * (w - theta))
            grads[k] = grads[k] - alpha * (w - theta)
            uploads.append(w)
        h = h - alpha * ((uploads[0] - theta) + (uploads[1] - theta)) / 2  # 1/N, N = 2 clients
        theta = (uploads[0] + uploads[1]) / 2 - h / alpha  # uniform mean over the uploads
        updates = run_round(server, rnd).updates
        for k, update in enumerate(updates):
            assert torch.allclose(update.params.double(), uploads[k], atol=1e-6, rtol=0)
            assert torch.allclose(server.state.get("dyn_grad", k).double(), grads[k], atol=1e-6, rtol=0)
        assert torch.allclose(server.h.double(), h, atol=1e-6, rtol=0)
        assert torch.allclose(server.global_params.double(), theta, atol=1e-6, rtol=0)
    assert grads[0].abs().max() > 1e-3  # the second round really used a non-zero state


def test_first_round_client_step_with_alpha_zero_is_fedavg():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, seed=22)
    fedavg = build_server(make_args("FedAvg", batch_size=4, local_epochs=2), data)
    feddyn = build_server(make_args("FedDyn", "-al", "0", batch_size=4, local_epochs=2), data)
    expected, got = run_round(fedavg, 0).updates, run_round(feddyn, 0).updates
    for a, b in zip(expected, got):
        assert torch.equal(a.params, b.params)
    # and the server model is the uniform mean of the uploads (h stays 0)
    mean = sum(u.params for u in got) / 3
    assert torch.allclose(feddyn.global_params, mean, atol=1e-7, rtol=0)
    assert torch.equal(feddyn.h, torch.zeros_like(feddyn.h))


def test_states_under_partial_participation():
    data = random_dataset(num_clients=4, dim=3, num_classes=2, seed=23)
    server = build_server(make_args("FedDyn", "-al", "0.1", join_ratio=0.5, batch_size=4), data)
    for rnd in range(4):
        before = {i: server.state.get("dyn_grad", i).clone() for i in server.state.indices("dyn_grad")}
        _, package, _ = run_round(server, rnd)
        assert len(package.cohort) == 2
        for i in range(4):
            if i in package.cohort:
                assert not torch.equal(server.state.get("dyn_grad", i), before.get(i, torch.zeros_like(server.h)))
            elif i in before:
                assert torch.equal(server.state.get("dyn_grad", i), before[i])  # skipped: kept
            else:
                assert not server.state.has("dyn_grad", i)  # created on first participation only
        # with every upload received, h stays the mean of all N clients' states (absent = 0)
        total = sum(server.state.get("dyn_grad", i) for i in server.state.indices("dyn_grad"))
        assert torch.allclose(server.h, total / 4, atol=1e-6)


def test_pfllib_unsquared_regulariser_gradient():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    server = build_server(make_args("FedDyn", "-al", "0.6", "--feddyn_norm", "unsquared"), data)
    client = server.clients[0]
    n = server.model.num_params
    w, g, state = torch.randn(3, n), torch.randn(3, n), torch.randn(3, n)
    anchor = torch.randn(server.model.num_total)
    anchor_rows = anchor[:n].expand(3, n).clone()
    w[2] = anchor[:n]  # at the anchor the unsquared norm contributes nothing (its subgradient 0)
    out = torch.func.vmap(client.adjust_grad, in_dims=(0, 0, {"anchor": None, "dyn_grad": 0}))(
        w, g, {"anchor": anchor, "dyn_grad": state})
    diff = w - anchor_rows
    norms = diff.norm(dim=1, keepdim=True)
    want = g - state + 0.3 * torch.where(norms > 0, diff / norms, torch.zeros_like(diff))
    assert torch.allclose(out, want, atol=1e-6)
    assert torch.equal(out[2], g[2] - state[2])


def test_flags_warnings_and_errors():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    with fl_log_messages() as messages:
        server = build_server(make_args("FedDyn"), data)
        assert messages == [] and server.summary() == {"alpha": 1.0, "feddyn_norm": "squared"}
        build_server(make_args("FedDyn", "-al", "0"), data)
        assert any("FedAvg" in m for m in messages)
    with pytest.raises(FLError, match="-al"):
        build_server(make_args("FedDyn", "-al", "-0.5"), data)


@pytest.mark.parametrize("engine", ["threaded", "batched"])
def test_engines_match_the_sequential_engine(engine):
    ref = engine_run("FedDyn", "sequential", alpha=0.1)
    out = engine_run("FedDyn", engine, alpha=0.1)
    assert out.engine.stats[f"{engine}_clients"] > 0
    assert_same_training(ref, out, exact=engine == "threaded", atol=2e-5, rtol=1e-4)  # batched: up to rounding
