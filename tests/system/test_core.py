"""The simulator's spine: FedAvg's update rule, flat models, selection, evaluation, determinism."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import nn

from fltest import TinyLinear, build_server, dataset_from_arrays, make_args, random_dataset
from flcore.flat import FlatModel
from flcore.registry import SELECTORS
from flcore.selectors.uniform import cohort_size
from flcore.trainmodel.models import lenet


def two_client_problem():
    g = torch.Generator().manual_seed(3)
    clients = []
    for n in (4, 6):
        clients.append((torch.randn(n, 2, generator=g), torch.randint(0, 2, (n,), generator=g),
                        torch.randn(3, 2, generator=g), torch.randint(0, 2, (3,), generator=g)))
    return dataset_from_arrays(clients, num_classes=2)


def test_fedavg_round_matches_hand_computation():
    """Two clients, full-batch SGD for two local steps, sample-weighted average."""
    dataset = two_client_problem()
    # Batch size = client size and 2 epochs: exactly two full-batch steps per client.
    args = make_args("FedAvg", global_rounds=1, batch_size=6, local_epochs=2, local_learning_rate=0.3,
                     drop_last=False)
    server = build_server(args, dataset)
    w0 = server.model.module.head.weight.detach().clone()
    b0 = server.model.module.head.bias.detach().clone()
    server.train(progress=False)

    expected_w, expected_b, total = torch.zeros_like(w0), torch.zeros_like(b0), 0
    for client in dataset.clients:
        w, b = w0.clone().requires_grad_(), b0.clone().requires_grad_()
        for _ in range(2):
            loss = F.cross_entropy(client.train_x @ w.T + b, client.train_y)
            gw, gb = torch.autograd.grad(loss, (w, b))
            w, b = (w - 0.3 * gw).detach().requires_grad_(), (b - 0.3 * gb).detach().requires_grad_()
        expected_w += client.num_train * w.detach()
        expected_b += client.num_train * b.detach()
        total += client.num_train
    expected = torch.cat([(expected_w / total).reshape(-1), expected_b / total])
    assert torch.allclose(server.global_params, expected, atol=1e-6)


def test_flat_model_views_and_buffers():
    torch.manual_seed(0)
    module = lenet((1, 28, 28), 10)
    flat = FlatModel(module)
    assert flat.num_params == sum(p.numel() for p in module.parameters())
    bn = module.body[-3]
    assert isinstance(bn, nn.BatchNorm1d)
    assert flat.num_total == flat.num_params + bn.running_mean.numel() + bn.running_var.numel()
    flat.vector.fill_(0.5)
    assert all(bool((p == 0.5).all()) for p in module.parameters())
    assert bool((bn.running_var == 0.5).all())
    snap = flat.snapshot()
    flat.vector.zero_()
    assert bool((snap == 0.5).all())
    head = flat.head_mask()
    assert int(head.sum()) == sum(p.numel() for p in module.head.parameters())


def test_gradients_land_in_the_flat_buffer():
    module = TinyLinear(3, 2)
    flat = FlatModel(module)
    loss = module(torch.randn(5, 3)).sum()
    loss.backward()
    assert torch.equal(flat.grad, torch.cat([module.head.weight.grad.reshape(-1), module.head.bias.grad]))


@pytest.mark.parametrize("clients,ratio,expected", [(100, 0.29, 29), (10, 0.05, 1), (20, 1.0, 20), (7, 0.5, 3)])
def test_cohort_size_does_not_truncate_floats(clients, ratio, expected):
    assert cohort_size(clients, ratio) == expected


def test_selection_is_sorted_seeded_and_partial():
    dataset = random_dataset(num_clients=10)
    args = make_args("FedAvg", join_ratio=0.3)
    a, b = build_server(args, dataset), build_server(args, dataset)
    cohorts = [a.select_clients(t) for t in range(5)]
    assert cohorts == [b.select_clients(t) for t in range(5)]
    assert all(len(c) == 3 and c == sorted(c) for c in cohorts)
    assert len({tuple(c) for c in cohorts}) > 1


@pytest.mark.parametrize("policy", ["uniform", "adafl", "budget_uniform", "budget_adafl"])
def test_a_selection_policy_needs_only_the_runtime_and_draws_among_the_allowed(policy):
    """Policies are built from the run's Runtime (not the server) and get the plug-ins' mask per round."""
    dataset = random_dataset(num_clients=10)
    server = build_server(make_args("FedAvg", "--select", policy, join_ratio=0.5, budget=4), dataset)
    own = SELECTORS.get(policy)(server.runtime)
    assert not hasattr(server.selector, "server") and server.selector.runtime is server.runtime
    assert own.select(3, None) == server.select_clients(3)
    allowed = np.zeros(10, dtype=bool)
    allowed[[1, 4, 6, 7, 8]] = True
    cohort = own.select(4, allowed)
    assert cohort and set(cohort) <= {1, 4, 6, 7, 8} and cohort == sorted(cohort)


def test_batch_plan_depends_only_on_seed_round_client():
    dataset = random_dataset(num_clients=3, sizes=[25, 25, 25])
    args = make_args("FedAvg", batch_size=4)
    server = build_server(args, dataset)
    plan = [idx.tolist() for idx in server.clients[2].batch_plan(5)]
    other = build_server(args, dataset)
    other.clients[0].batch_plan(5)  # processing another client first changes nothing
    assert [idx.tolist() for idx in other.clients[2].batch_plan(5)] == plan
    assert [idx.tolist() for idx in server.clients[2].batch_plan(6)] != plan
    assert len(plan) == 25 // 4  # drop_last, as PFLlib


def test_evaluation_matches_naive_per_client_metrics():
    dataset = random_dataset(num_clients=4, num_classes=3)
    server = build_server(make_args("FedAvg"), dataset)
    result = server.evaluate_models(server.eval_params)
    module = server.model.module
    correct = n = auc_weighted = loss_sum = train_n = 0
    accs = []
    with torch.no_grad():
        server.model.load(server.global_params)
        for client in dataset.clients:
            logits = module(client.test_x)
            hits = int((logits.argmax(1) == client.test_y).sum())
            correct += hits
            n += client.num_test
            accs.append(hits / client.num_test)
            onehot = np.eye(3)[client.test_y.numpy()]
            auc_weighted += roc_auc_score(onehot.ravel(), logits.softmax(1).numpy().ravel()) * client.num_test
            loss_sum += float(F.cross_entropy(module(client.train_x), client.train_y, reduction="sum"))
            train_n += client.num_train
    assert result.test_acc == pytest.approx(correct / n)
    assert result.test_auc == pytest.approx(auc_weighted / n)
    assert result.test_acc_std == pytest.approx(np.std(accs))
    assert result.train_loss == pytest.approx(loss_sum / train_n, rel=1e-5)


def test_local_clients_keep_their_own_models():
    dataset = random_dataset(num_clients=4)
    args = make_args("Local", global_rounds=3, join_ratio=0.5)
    server = build_server(args, dataset)
    init = server.global_params.clone()
    server.train(progress=False)
    assert torch.equal(server.global_params, init)  # nothing is shared
    trained = server.state.indices("personal")
    assert trained  # the selected clients have personal models
    for i in range(4):
        expected = server.state.get("personal", i) if i in trained else init
        assert torch.equal(server.eval_params(i), expected)


def test_same_seed_same_numbers_different_seed_different():
    dataset = random_dataset(num_clients=4)
    runs = []
    for seed in (0, 0, 1):
        args = make_args("FedAvg", global_rounds=3, join_ratio=0.5, seed=seed, batch_size=4)
        torch.manual_seed(0)
        server = build_server(args, dataset, TinyLinear(5, 3))
        runs.append((server.train(progress=False).test_acc, server.global_params.clone()))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])
    assert not torch.equal(runs[0][1], runs[2][1])


def test_client_drop_rate_drops_uploads():
    dataset = random_dataset(num_clients=8)
    server = build_server(make_args("FedAvg", global_rounds=3, client_drop_rate=0.5), dataset)
    history = server.train(progress=False)
    assert min(history.clients_per_round) < 8


def test_slow_trainers_run_fewer_epochs():
    dataset = random_dataset(num_clients=4, sizes=[40] * 4)
    server = build_server(make_args("FedAvg", train_slow_rate=0.5, local_epochs=4, batch_size=10), dataset)
    slow = [c for c in server.clients if server.plugin("clock").train_slow[c.index]]
    assert len(slow) == 2
    assert all(len(c.batch_plan(0)) <= 2 * 4 for c in slow)
    fast = [c for c in server.clients if not server.plugin("clock").train_slow[c.index]]
    assert all(len(c.batch_plan(0)) == 4 * 4 for c in fast)
