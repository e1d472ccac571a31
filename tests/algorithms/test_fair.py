"""FAIR: the reverse auction and pay-as-bid recruiting by hand, the forgetting quality estimate, the
quality-weighted average, the reduction to FedAvg, the budgeted baselines, refusals, determinism; the
learned aggregation weights (``--fair_aggregation learned``) by hand, their reduction to FedAvg, and
their refusal without public data."""
from __future__ import annotations

import dataclasses
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import main
from flcore.auction import client_costs, reverse_auction, within_budget
from flcore.protocol import ClientUpdate
from flcore.servers.serverbase import weighted_average
from flcore.servers.serverfair import forgetting_update, quality_weights
from fltest import build_server, linear_loss, make_args, random_dataset, run_round, trained_server
from knowledgetest import refusal
from toydata import make_dataset

TINY = dict(global_rounds=2, batch_size=4, local_epochs=1)


def data():
    return random_dataset(num_clients=4, dim=4, num_classes=3, seed=6)


def test_reverse_auction_by_hand_on_four_clients():
    quality, bids = np.array([4.0, 3.0, 2.0, 1.0]), np.array([2.0, 3.0, 1.0, 2.0])
    # ranking by q/b: client 0 (2), client 2 (2), client 1 (1), client 3 (0.5)
    # B = 6: b0/q0 = 0.5 <= 6/4; b2/q2 = 0.5 <= 6/6; b1/q1 = 1 > 6/9, so K = 2;
    # unit price min(6/6, b1/q1 = 1) = 1: client 0 is paid 4, client 2 is paid 2
    winners, pay = reverse_auction(quality, bids, 6.0)
    assert winners == [0, 2] and pay.tolist() == [4.0, 0.0, 2.0, 0.0]
    # B = 2.5: only client 0 fits (0.5 <= 2.5/4; then 0.5 > 2.5/6); price min(0.625, b2/q2 = 0.5)
    winners, pay = reverse_auction(quality, bids, 2.5)
    assert winners == [0] and pay.tolist() == [2.0, 0.0, 0.0, 0.0]
    # no budget limit: everyone wins at the highest winning unit price, b3/q3 = 2
    winners, pay = reverse_auction(quality, bids, float("inf"))
    assert winners == [0, 1, 2, 3] and pay.tolist() == [8.0, 6.0, 4.0, 2.0]
    # B = 1 buys nobody (client 0 asks 0.5 a unit, the budget offers 1/4); zero quality never wins
    assert reverse_auction(quality, bids, 1.0)[0] == []
    assert reverse_auction(np.array([0.0, 1.0]), np.array([1.0, 1.0]), 10.0)[0] == [1]


def test_auction_is_budget_feasible_and_individually_rational():
    rng = np.random.default_rng(0)
    for _ in range(200):
        quality, bids = rng.uniform(0.01, 1, 6), rng.uniform(1, 5, 6)
        budget = float(rng.uniform(1, 30))
        winners, pay = reverse_auction(quality, bids, budget)
        assert pay.sum() <= budget + 1e-9
        assert all(pay[i] >= bids[i] - 1e-12 for i in winners)
        assert all(pay[i] == 0 for i in range(6) if i not in winners)


def test_pay_as_bid_in_order_by_hand():
    # order 3, 1, 0, 2 with bids 2, 3, 1, 2 and B = 5: 3 (spent 2), 1 (5), 0 and 2 no longer fit
    assert within_budget([3, 1, 0, 2], np.array([2.0, 3.0, 1.0, 2.0]), 5.0) == ([1, 3], 5.0)


def test_quality_estimate_forgets_exponentially_by_hand():
    # records 0.4 in round 0 and 0.1 in round 2, rho = 0.5: (0.25 * 0.4 + 0.1) / (0.25 + 1) = 0.16
    num, den = forgetting_update(0.0, 0.0, 0, 0, 0.4, 0.5)
    num, den = forgetting_update(num, den, 0, 2, 0.1, 0.5)
    assert num / den == pytest.approx(0.16)


def test_quality_weighted_average_by_hand():
    assert quality_weights(np.array([4, 6]), np.array([0.5, 0.25])).tolist() == pytest.approx([4 / 7, 3 / 7])
    assert quality_weights(np.array([4, 6]), np.array([0.0, 0.0])).tolist() == [0.0, 0.0]


def test_one_round_by_hand_and_equal_qualities_are_fedavg_over_the_selected():
    dataset = data()
    fair = build_server(make_args("FAIR", "--budget", "inf", "--fair_forgetting", "0.5", **TINY), dataset)
    start = fair.global_params.clone()
    cohort, _, updates = run_round(fair, 0)
    assert cohort == [0, 1, 2, 3]  # an unlimited budget recruits everyone
    before = [float(linear_loss(start.double(), c.train_x.double(), c.train_y, 3)) for c in dataset.clients]
    after = [float(linear_loss(u.params.double(), c.train_x.double(), c.train_y, 3)) for u, c in zip(updates, dataset.clients)]
    for u, b, a in zip(updates, before, after):  # the client's loss over its rows, by hand
        assert fair.training_loss(u.index, start) == pytest.approx(b, abs=1e-5)
        assert fair.training_loss(u.index, u.params) == pytest.approx(a, abs=1e-5)
    quality = np.maximum(np.array(before) - np.array(after), 0)
    sizes = np.array([u.num_samples for u in updates])
    assert torch.allclose(fair.global_params, weighted_average(updates, quality_weights(sizes, quality)), atol=1e-6)
    assert fair.quality_estimates() == pytest.approx(quality, abs=1e-5)  # one record each
    fair.last_record[3], fair.quality_denominator[3] = -1, 0.0  # forget client 3: the priors
    assert fair.quality_estimates()[3] == pytest.approx(quality[:3].max(), abs=1e-5)
    fair.hp = dataclasses.replace(fair.hp, fair_unknown="mean")
    assert fair.quality_estimates()[3] == pytest.approx(quality[:3].mean(), abs=1e-5)
    # equal qualities: FedAvg's sample weights, and FedAvg's model on the same cohort bit for bit
    fedavg = build_server(make_args("FedAvg", **TINY), dataset)
    run_round(fedavg, 0, cohort=cohort)
    assert torch.equal(fedavg.global_params, weighted_average(updates, quality_weights(sizes, np.ones(4))))


def test_uploads_that_did_not_reduce_their_loss_are_left_out(monkeypatch):
    fair = build_server(make_args("FAIR", **TINY), data())
    w = fair.global_params
    good, bad = ClientUpdate(0, 10, 1, w + 1.0, 0.0), ClientUpdate(1, 10, 1, w + 7.0, 0.0)
    measured = {0: 0.5, 1: 0.0}  # client 1's loss went up: quality 0
    monkeypatch.setattr(fair, "measured_qualities", lambda ups, package: np.array([measured[u.index] for u in ups]))
    fair.aggregate([good, bad], fair.package(0, [0, 1]))
    assert torch.equal(fair.global_params, w + 1.0)
    fair.aggregate([bad], fair.package(1, [1]))  # nothing ideal: the model stays
    assert torch.equal(fair.global_params, w + 1.0)
    assert fair.quality_estimates()[:2].tolist() == [0.5, 0.0]


def test_budget_is_kept_and_the_baselines_pay_the_same_costs():
    dataset = data()
    budget = 4.0
    fair = trained_server(dataset, "FAIR", "--budget", str(budget), global_rounds=3, batch_size=4)
    spent = fair.history.extra_series["budget_spent"]
    assert len(spent) == 3 and all(0 < s <= budget + 1e-9 for s in spent)
    for policy in ("budget_uniform", "budget_adafl"):
        server = trained_server(dataset, "FedAvg", "--select", policy, "--budget", str(budget), global_rounds=3,
                                batch_size=4)
        assert np.array_equal(server.selector.costs, fair.selector.costs)
        spent = server.history.extra_series["budget_spent"]
        assert len(spent) == 3 and all(0 < s <= budget for s in spent)
    assert np.array_equal(client_costs(0, 4, 1, 5), client_costs(0, 4, 1, 5))
    assert not np.array_equal(client_costs(0, 4, 1, 5), client_costs(1, 4, 1, 5))


def test_same_seed_same_run():
    dataset = data()
    runs = [trained_server(dataset, "FAIR", "--budget", "6", **TINY) for _ in range(2)]
    assert torch.equal(runs[0].global_params, runs[1].global_params)
    series = [run.history.extra_series for run in runs]
    assert series[0].keys() == series[1].keys()
    for name in series[0]:
        np.testing.assert_array_equal(np.asarray(series[0][name]), np.asarray(series[1][name]), err_msg=name)


def test_cost_range_upside_down_is_one_line_exit_2(tmp_path, capsys):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 8, 8))
    rc = main.main(["-data", str(folder), "--results_dir", str(tmp_path / "res"), "-dev", "cpu", "-gr", "1",
                    "-m", "DNN", "-algo", "FAIR", "--cost_low", "5", "--cost_high", "2", "--progress", "False",
                    "-q", "True"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--cost_low 5.0 is above --cost_high 2.0" in err, err


LEARNED = ("--fair_aggregation", "learned", "--public_data", "0.2")


def learned_server(*flags: str):
    return build_server(make_args("FAIR", *LEARNED, *flags, **TINY), data())


def two_uploads(server) -> list[ClientUpdate]:
    w = server.global_params
    g = torch.Generator().manual_seed(3)
    return [ClientUpdate(0, 6, 1, w + torch.randn(w.shape, generator=g), 0.0),
            ClientUpdate(2, 10, 1, w + torch.randn(w.shape, generator=g), 0.0)]


def test_learned_weights_one_gradient_step_by_hand():
    fair = learned_server("--fair_learn_steps", "1", "--fair_learn_lr", "0.7", "--eval_batch_size", "3")
    assert len(fair.dataset.public) == 10  # so the public gradient is summed over four chunks
    updates = two_uploads(fair)
    x, y = fair.dataset.public.inputs().double(), fair.dataset.public.y
    stacked = torch.stack([u.params for u in updates]).double()
    n = torch.tensor([6.0, 10.0], dtype=torch.float64)
    w0 = n / n.sum()  # softmax(log n)
    mixed = w0 @ stacked
    # the linear model's cross-entropy gradient in the flat layout [W.flatten(), b]: (P - Y)^T x / N and mean(P - Y)
    dim, classes = x.shape[1], 3
    residual = torch.softmax(x @ mixed[: dim * classes].view(classes, dim).T + mixed[dim * classes:], 1) \
        - F.one_hot(y, classes).double()
    g = torch.cat([(residual.T @ x / len(y)).flatten(), residual.mean(0)])
    # d loss / d theta_i = w_i (g . x_i - g . mixed), then one step of 0.7 from theta = log n
    theta = n.log() - 0.7 * w0 * (stacked @ g - g @ mixed)
    expected = torch.softmax(theta, 0)
    learned = fair.learned_weights(updates)
    assert learned == pytest.approx(expected.numpy(), abs=1e-6)
    assert not learned == pytest.approx(w0.numpy(), abs=1e-4)  # the step moved them
    fair.aggregate(updates, fair.package(0, [0, 2]))
    assert torch.allclose(fair.global_params, weighted_average(updates, learned), atol=1e-6)
    # the quality records: the learned weight times the cohort size (2)
    assert fair.quality_estimates()[[0, 2]] == pytest.approx(2 * learned, abs=1e-9)


def test_learned_weights_with_a_zero_step_are_fedavgs():
    fair = learned_server("--fair_learn_lr", "0")
    cohort, _, updates = run_round(fair, 0, cohort=[0, 1, 2, 3])
    sizes = np.array([u.num_samples for u in updates], dtype=float)
    fedavg = build_server(make_args("FedAvg", "--public_data", "0.2", "--public_data_withhold", "True", **TINY), data())
    run_round(fedavg, 0, cohort=cohort)
    assert torch.allclose(fair.global_params, fedavg.global_params, atol=1e-6)
    assert fair.quality_estimates() == pytest.approx(4 * sizes / sizes.sum(), abs=1e-6)


def test_learned_weights_favour_the_upload_that_fits_the_public_data():
    fair = learned_server("--fair_learn_steps", "20")
    x, y = fair.dataset.public.inputs(), fair.dataset.public.y
    fitted = fair.global_params.clone().requires_grad_(True)
    for _ in range(200):  # a model fitted to the public data by plain gradient descent
        (grad,) = torch.autograd.grad(linear_loss(fitted, x, y, 3), fitted)
        fitted = (fitted - 0.5 * grad).detach().requires_grad_(True)
    w = fair.global_params
    updates = [ClientUpdate(0, 10, 1, fitted.detach(), 0.0), ClientUpdate(1, 10, 1, w - 3 * (fitted.detach() - w), 0.0)]
    learned = fair.learned_weights(updates)
    assert learned[0] > 0.9 and learned.sum() == pytest.approx(1.0)


def test_a_learned_run_is_budgeted_and_reproducible():
    runs = [trained_server(data(), "FAIR", *LEARNED, "--budget", "6", **TINY) for _ in range(2)]
    assert torch.equal(runs[0].global_params, runs[1].global_params)
    spent = runs[0].history.extra_series["budget_spent"]
    assert len(spent) == 2 and all(0 < s <= 6 + 1e-9 for s in spent)


def test_learned_aggregation_without_public_data_is_refused_in_one_line():
    message = refusal("FAIR", "--fair_aggregation", "learned")
    assert "FAIR --fair_aggregation learned needs a public dataset held by the server: pass --public_data" in message
