"""IGFL, IGFL-C and IGFL-S (Huang et al., IJCAI 2021): the spec's hand example, reductions,
an independent re-derivation on a tiny classifier, and two-round runs of every name."""
from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fltest import (build_server, dataset_from_arrays, make_args, random_dataset, run_main_two_rounds, run_round,
                    TinyLinear)
from flcore.clients.clientfedavg import FedAvgClient
from flcore.clients.clientigfl import DELTA_KEY, SERVER_STEP_KEY, igfl_direction, igfl_terms
from flcore.registry import ALGORITHMS, list_algorithms, load_all
from flcore.servers.serverfedavg import FedAvgServer
from flcore.servers.serverigfl import IGFLBaseServer, attention_weights

F64 = torch.float64


# ---------------------------------------------------------------- helpers
def pure_client(w0: float, c: float, prev: float | None, server_step: float, lr=0.5, steps=2, denom=2) -> float:
    """IGFL-C on f(w) = ½(w − c)² using only the pure functions."""
    step = torch.tensor([server_step], dtype=F64)
    scale, offset = igfl_terms(None if prev is None else torch.tensor([prev], dtype=F64), step, lr, steps, denom)
    w = torch.tensor([w0], dtype=F64)
    for _ in range(steps):
        w = w - lr * igfl_direction(w - c, scale, offset)
    return float(w - w0)


class Scalar(nn.Module):
    """One parameter w (float64); its logits are irrelevant (the loss is the client's quadratic)."""

    def __init__(self, num_classes: int = 2):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1, dtype=F64))
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * torch.zeros(x.shape[0], self.num_classes, dtype=F64)


class QuadraticMixin:
    """Test-only: f_i(w) = ½(w − c_i)² with c_i stored as the client's inputs."""

    def compute_gradient(self, model, idx, ctx=None):
        model.zero_grad()
        c = float(self.data.train_x[0, 0])
        loss = 0.5 * ((model.module.w - c) ** 2).sum()
        loss.backward()
        return loss.detach()


def quadratic_server(name: str, *flags: str, targets=(2.0, -1.0)):
    """The spec's §4 set-up: two clients, c = (2, −1), η = 1/2, T = 2 (2 samples, B = 1), w⁰ = 0."""
    load_all()
    base = ALGORITHMS.get(name)
    client_cls = type("Quadratic" + base.client_cls.__name__, (QuadraticMixin, base.client_cls), {})
    server_cls = type("Quadratic" + base.__name__, (base,), {"client_cls": client_cls})
    clients = [(torch.full((2, 1), c), torch.zeros(2, dtype=torch.long), torch.full((2, 1), c),
                torch.zeros(2, dtype=torch.long)) for c in targets]
    args = make_args(name, "-lr", "0.5", "-lbs", "1", *flags)
    return server_cls(args, dataset_from_arrays(clients, 2), Scalar(), torch.device("cpu"))


# ------------------------------------------------- spec §4: the client rule
def test_client_rule_hand_example_round0():
    assert pure_client(0.0, 2.0, None, 0.0) == pytest.approx(15 / 8, abs=1e-12)
    assert pure_client(0.0, -1.0, None, 0.0) == pytest.approx(-15 / 16, abs=1e-12)


def test_client_rule_hand_example_round1_full_and_partial():
    w1 = 15 / 32
    assert pure_client(w1, 2.0, 15 / 8, w1) == pytest.approx(585 / 512, abs=1e-12)
    assert pure_client(w1, -1.0, -15 / 16, w1) == pytest.approx(-405 / 512, abs=1e-12)
    assert pure_client(w1, 2.0, 15 / 8, w1, denom=1) == pytest.approx(53 / 64, abs=1e-12)


def test_client_rule_single_step_and_no_step():
    # first step of round 1, client 1: w = 15/32 + 49/64 + 19/128 = 177/128
    w1 = 15 / 32
    assert pure_client(w1, 2.0, 15 / 8, w1, steps=2) != 0
    scale, offset = igfl_terms(torch.tensor([15 / 8], dtype=F64), torch.tensor([w1], dtype=F64), 0.5, 2, 2)
    w = w1 - 0.5 * float(igfl_direction(torch.tensor([w1 - 2.0], dtype=F64), scale, offset))
    assert w == pytest.approx(177 / 128, abs=1e-12)
    scale, offset = igfl_terms(torch.ones(3), torch.ones(3), 0.1, 0, 4)
    assert torch.equal(offset, torch.zeros(3)) and scale == pytest.approx(1.25)


# ---------------------------------------------- spec §4: attention schemes
U1 = torch.tensor([[1.142578125], [-0.791015625]], dtype=F64)
P1 = torch.tensor([[1.875], [-0.9375]], dtype=F64)


@pytest.mark.parametrize("scheme, mode, weights, step", [
    ("self", "diag", (0.5395732, 0.4604268), 0.2522997),
    ("global", "diag", (0.5841637, 0.4158363), 0.3385196),
    ("time", "diag", (0.9740550, 0.8596932), 0.4329032),
    ("time", "matrix", (0.5571809, 0.4428191), 0.2863459),
    ("time", "vector", (0.8023040, 0.1976960), 0.7603143),
])
def test_attention_hand_example(scheme, mode, weights, step):
    beta = attention_weights(U1, P1, scheme, mode)
    assert beta.dtype == F64
    assert beta.tolist() == pytest.approx(weights, abs=1e-7)
    assert float(beta @ U1[:, 0]) == pytest.approx(step, abs=1e-7)


def test_attention_hand_example_round0():
    u0 = torch.tensor([[15 / 8], [-15 / 16]], dtype=F64)
    assert attention_weights(u0, None, "self").tolist() == pytest.approx((0.5308563, 0.4691437), abs=1e-7)
    for mode in ("diag", "matrix", "vector"):
        assert attention_weights(u0, torch.zeros_like(u0), "time", mode).tolist() == pytest.approx((0.5, 0.5))


def algorithm3_literal(u: np.ndarray, prev: np.ndarray, scheme: str) -> np.ndarray:
    """Independent reference: Algorithm 3 line by line (attended copies Δŵ_i, then their mean)."""
    s = len(u)
    mean = u.mean(0)
    if scheme == "time":  # Sec. 4.3: w += Σ_j α_j u_j, α_j = e^{ψ(p_j, u_j)} / Σ_τ e^{ψ(p_j, u_τ)}
        alpha = [math.exp(prev[j] @ u[j]) / sum(math.exp(prev[j] @ u[t]) for t in range(s)) for j in range(s)]
        return sum(alpha[j] * u[j] for j in range(s))
    attended = []
    for i in range(s):
        q = u[i] if scheme == "self" else mean
        scores = np.array([math.exp(q @ u[j]) for j in range(s)])
        attended.append(sum(scores[j] / scores.sum() * u[j] for j in range(s)))
    return np.mean(attended, axis=0)


@pytest.mark.parametrize("scheme", ["self", "global", "time"])
def test_weight_form_equals_algorithm3(scheme):
    g = torch.Generator().manual_seed(1)
    u = 0.4 * torch.randn(4, 7, generator=g, dtype=F64)
    prev = 0.4 * torch.randn(4, 7, generator=g, dtype=F64)
    step = attention_weights(u, prev, scheme) @ u
    assert step.numpy() == pytest.approx(algorithm3_literal(u.numpy(), prev.numpy(), scheme), abs=1e-12)


# ------------------------------------------------------------ reductions
@pytest.mark.parametrize("scheme, mode", [("self", "diag"), ("global", "diag"), ("time", "matrix"), ("time", "vector")])
def test_identical_updates_give_the_mean(scheme, mode):
    u = torch.randn(1, 6, dtype=F64).repeat(3, 1)
    beta = attention_weights(u, u.clone(), scheme, mode)
    assert beta.tolist() == pytest.approx([1 / 3] * 3, abs=1e-12)
    base = torch.tensor([0.2, 0.3, 0.5], dtype=F64)
    if scheme != "time" or mode == "matrix":  # line 7's weights p pass through
        weighted = attention_weights(u, u.clone(), scheme, mode, base=base)
        assert float(weighted @ u[:, 0]) == pytest.approx(float(u[0, 0]), abs=1e-12)


@pytest.mark.parametrize("scheme, mode", [("self", "diag"), ("global", "diag"), ("time", "diag"), ("time", "matrix"),
                                          ("time", "vector")])
def test_huge_temperature_gives_uniform_mean(scheme, mode):
    g = torch.Generator().manual_seed(2)
    u, prev = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    beta = attention_weights(u, prev, scheme, mode, temperature=1e12)
    assert beta.tolist() == pytest.approx([1 / 3] * 3, abs=1e-9)


@pytest.mark.parametrize("scheme, mode", [("self", "diag"), ("global", "diag"), ("time", "diag"), ("time", "vector")])
@pytest.mark.parametrize("similarity", ["dot", "cos"])
def test_huge_logits_do_not_overflow(scheme, mode, similarity):
    u = torch.tensor([[300.0, 0.0], [0.0, 200.0], [-100.0, 50.0]])  # dot logits up to 9e4
    beta = attention_weights(u, u.flip(0), scheme, mode, similarity=similarity)
    assert torch.isfinite(beta).all()
    if similarity == "dot" and scheme == "global":
        assert beta.tolist() == pytest.approx([1.0, 0.0, 0.0])  # one-hot: the paper's behaviour


def test_cosine_ignores_scale():
    u = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=F64)
    assert torch.allclose(attention_weights(u, None, "self", similarity="cos"),
                          attention_weights(1000 * u, None, "self", similarity="cos"))


# ------------------------------------------- end to end on the quadratic
def test_igfl_c_end_to_end_hand_example():
    server = quadratic_server("IGFL-C")
    updates = run_round(server, 0).updates
    assert [float(u.params[0]) for u in updates] == pytest.approx([15 / 8, -15 / 16], abs=1e-12)
    assert float(server.global_params[0]) == pytest.approx(15 / 32, abs=1e-12)
    assert float(server.server_step[0]) == pytest.approx(15 / 32, abs=1e-12)
    updates = run_round(server, 1).updates
    assert [float(u.params[0]) - 15 / 32 for u in updates] == pytest.approx([585 / 512, -405 / 512], abs=1e-12)
    assert float(server.global_params[0]) == pytest.approx(165 / 256, abs=1e-12)
    assert float(server.state.get(DELTA_KEY, 0)[0]) == pytest.approx(585 / 512, abs=1e-12)


def test_igfl_c_partial_participation_keeps_stale_delta():
    server = quadratic_server("IGFL-C")
    run_round(server, 0)
    updates = run_round(server, 1, cohort=[0]).updates
    assert float(updates[0].params[0]) - 15 / 32 == pytest.approx(53 / 64, abs=1e-12)
    assert float(server.state.get(DELTA_KEY, 1)[0]) == pytest.approx(-15 / 16, abs=1e-12)  # stale, kept
    assert float(server.global_params[0]) == pytest.approx(15 / 32 + 53 / 64, abs=1e-12)


def test_igfl_c_denominator_p_uses_all_clients():
    server = quadratic_server("IGFL-C", "--igfl_c_denominator", "P")
    run_round(server, 0)
    updates = run_round(server, 1, cohort=[0]).updates
    assert float(updates[0].params[0]) - 15 / 32 == pytest.approx(585 / 512, abs=1e-12)


@pytest.mark.parametrize("mode, step", [("diag", 0.4329032), ("matrix", 0.2863459), ("vector", 0.7603143)])
def test_igfl_time_attention_end_to_end(mode, step):
    server = quadratic_server("IGFL", "--attention", "time", "--igfl_ta_mode", mode)
    run_round(server, 0)
    assert float(server.global_params[0]) == pytest.approx(15 / 32, abs=1e-12)  # round 0 = uniform mean
    run_round(server, 1)
    assert float(server.global_params[0]) == pytest.approx(15 / 32 + step, abs=1e-7)
    assert float(server.server_step[0]) == pytest.approx(step, abs=1e-7)
    assert server.history.extra_series["igfl_weights"][0] == pytest.approx([0.5, 0.5])


def test_igfl_s_uses_plain_sgd_clients_and_attention():
    server = quadratic_server("IGFL-S", "--attention", "self")
    assert issubclass(server.client_cls, FedAvgClient)
    updates = run_round(server, 0).updates
    assert [float(u.params[0]) for u in updates] == pytest.approx([3 / 2, -3 / 4], abs=1e-12)
    u = np.array([[1.5], [-0.75]])
    assert float(server.global_params[0]) == pytest.approx(algorithm3_literal(u, 0 * u, "self")[0], abs=1e-12)


# --------------------------------------- end to end on a tiny classifier
def reference_igfl(args, dataset, init: torch.Tensor, cohorts: list[list[int]], scheme: str) -> torch.Tensor:
    """Independent re-derivation of IGFL (Algorithms 1-3) with cross-entropy on a linear model."""
    from flcore.clients.clientbase import Client

    k, d = dataset.num_classes, dataset.input_shape[0]
    clients = [Client(i, c, args, None) for i, c in enumerate(dataset.clients)]
    lr = float(args.local_learning_rate)
    w_ps, w_prev = init.double().clone(), init.double().clone()
    stored = {i: torch.zeros_like(w_ps) for i in range(len(clients))}
    for rnd, cohort in enumerate(cohorts):
        s = len(cohort)
        group = w_ps - w_prev
        uploads = []
        for i in cohort:
            plan = clients[i].batch_plan(rnd)
            steps = len(plan)
            w = w_ps.clone()
            for idx in plan:
                v = w.clone().requires_grad_(True)
                x, y = dataset.clients[i].train_x[idx].double(), dataset.clients[i].train_y[idx]
                F.cross_entropy(x @ v[: k * d].view(k, d).T + v[k * d :], y).backward()
                delta_i = -lr * v.grad
                delta_g = (delta_i - stored[i] / steps) / s + group / steps
                w = w + delta_i + delta_g
            uploads.append(w - w_ps)
        step = torch.from_numpy(algorithm3_literal(torch.stack(uploads).numpy(),
                                                   torch.stack([stored[i] for i in cohort]).numpy(), scheme))
        for i, u in zip(cohort, uploads):
            stored[i] = u
        w_prev, w_ps = w_ps, w_ps + step
    return w_ps


@pytest.mark.parametrize("scheme", ["self", "global", "time"])
def test_igfl_matches_independent_rederivation(scheme):
    dataset = random_dataset(num_clients=4, dim=5, num_classes=3, sizes=[8, 11, 14, 9])
    # lr 0.6 makes the attention weights clearly non-uniform (e.g. 0.60/0.40) on this data
    args = make_args("IGFL", "-lr", "0.6", "-lbs", "4", "-jr", "0.5", "--attention", scheme)
    server = build_server(args, dataset)
    init = server.global_params.clone()
    cohorts = []
    for rnd in range(3):
        before = {i: server.state.get(DELTA_KEY, i).clone() for i in server.state.indices(DELTA_KEY)}
        cohort = server.select_clients(rnd)
        cohorts.append(cohort)
        run_round(server, rnd, cohort)
        for i, value in before.items():  # Δw_i of clients outside the cohort survives unchanged
            if i not in cohort:
                assert torch.equal(server.state.get(DELTA_KEY, i), value)
    assert len({tuple(c) for c in cohorts}) > 1
    assert max(abs(b - 0.5) for row in server.history.extra_series["igfl_weights"] for b in row) > 0.05
    expected = reference_igfl(args, dataset, init, cohorts, scheme)
    assert torch.allclose(server.global_params.double(), expected, atol=1e-5)


def test_round0_time_attention_is_the_uniform_mean():
    dataset = random_dataset(num_clients=3, sizes=[8, 12, 20])
    server = build_server(make_args("IGFL", "-lbs", "4"), dataset)
    updates = run_round(server, 0).updates
    mean = torch.stack([u.params for u in updates]).mean(0)
    assert torch.allclose(server.global_params, mean, atol=1e-6)


def test_huge_temperature_server_is_the_uniform_mean():
    dataset = random_dataset(num_clients=3, sizes=[8, 12, 20])
    server = build_server(make_args("IGFL-S", "-lbs", "4", "--attention", "self", "--igfl_attn_temp", "1e12"), dataset)
    updates = run_round(server, 0).updates
    assert torch.allclose(server.global_params, torch.stack([u.params for u in updates]).mean(0), atol=1e-6)


def test_buffers_are_averaged_not_attended():
    dataset = random_dataset(num_clients=3, sizes=[8, 12, 20])
    torch.manual_seed(0)
    module = nn.Sequential(nn.BatchNorm1d(5), nn.Linear(5, 3))
    server = build_server(make_args("IGFL", "-lbs", "4", "-lr", "0.6", "--attention", "global"), dataset, module)
    n = server.model.num_params
    assert server.global_params.numel() > n
    old = server.global_params.clone()
    updates = run_round(server, 0).updates
    uploads = torch.stack([u.params for u in updates])
    beta = torch.tensor(server.history.extra_series["igfl_weights"][0], dtype=torch.float32)
    assert torch.allclose(server.global_params[n:], uploads[:, n:].mean(0), atol=1e-6)
    assert torch.allclose(server.global_params[:n], old[:n] + beta @ (uploads[:, :n] - old[:n]), atol=1e-6)


def test_plain_rules_reproduce_fedavg_exactly():
    """Both rules off (FedAvg client, plain mean) with sample weights is FedAvg bit for bit."""
    dataset = random_dataset(num_clients=3, sizes=[8, 12, 20])
    args = make_args("IGFL-C", "-lbs", "4", "--igfl_weighting", "samples")
    load_all()
    plain = type("PlainIGFL", (IGFLBaseServer,), {"client_cls": FedAvgClient})
    torch.manual_seed(0)
    ours = plain(args, dataset, TinyLinear(5, 3), torch.device("cpu"))
    fedavg = build_server(make_args("FedAvg", "-lbs", "4"), dataset)
    assert isinstance(fedavg, FedAvgServer)
    for rnd in range(2):
        run_round(ours, rnd)
        run_round(fedavg, rnd)
    assert torch.equal(ours.global_params, fedavg.global_params)


def test_client_without_steps_uploads_zero_and_broadcast_counts():
    dataset = random_dataset(num_clients=2, sizes=[8, 2])
    server = build_server(make_args("IGFL", "-lbs", "4"), dataset)
    package = server.make_package(0, [0, 1])
    n = server.model.num_params
    assert package.extras[SERVER_STEP_KEY].numel() == n
    assert package.nbytes() == (server.global_params.numel() + n) * 4
    run_round(server, 0)
    run_round(server, 1)
    assert torch.equal(server.state.get(DELTA_KEY, 1), torch.zeros(n))
    assert torch.isfinite(server.global_params).all()
    server.after_round(2, package, [])  # every upload lost: the model did not move
    assert torch.equal(server.server_step, torch.zeros(n))


def test_flags_and_registration():
    assert {"IGFL", "IGFL-C", "IGFL-S"} <= set(list_algorithms())
    args = make_args("IGFL-S", "--igfl-attn-temp", "2", "--igfl-sim", "cos", "--igfl-weighting", "samples")
    assert (args.attention, args.igfl_ta_mode, args.igfl_attn_temp, args.igfl_sim) == ("time", "diag", 2.0, "cos")
    assert not hasattr(args, "igfl_c_denominator")
    args = make_args("IGFL-C")
    assert args.igfl_c_denominator == "S" and args.igfl_weighting == "uniform" and not hasattr(args, "attention")


@pytest.mark.parametrize("name", ["IGFL-C", "IGFL-S", "IGFL"])
def test_two_round_run_writes_results(tmp_path, name):
    path = run_main_two_rounds(tmp_path, name, "-jr", "0.5")
    with h5py.File(path) as f:
        acc = f["rs_test_acc"][()]
        assert len(acc) == 3 and np.isfinite(acc).all()
        if name != "IGFL-C":
            assert f["rs_igfl_weights"].shape == (2, 2)
