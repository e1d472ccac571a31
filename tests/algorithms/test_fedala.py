"""FedALA: ALA and local training by hand, η = 0 is FedAvg, state under partial participation, main."""
from __future__ import annotations

import dataclasses
import logging

import h5py
import torch

from fltest import (build_server, fl_log_messages, gradient_descent, linear_grad, make_args, random_dataset,
                    run_main_two_rounds, run_round, trained_server, two_client_server)
from fltest import one_thread  # noqa: F401  (an autouse fixture: importing it switches it on here)


def test_ala_and_local_training_match_hand_computation():
    # Two clients (4 and 6 samples), one full batch (-lbs 6), two local epochs; W covers the bias
    # only (-p 1), is learned on all data (-s 100) and the start phase stops after 2 epochs.
    lr, eta = 0.5, 3.0
    data, server = two_client_server("FedALA", "-et", str(eta), "--rand_percent", "100", "-p", "1",
                                     "--ala_num_pre_loss", "1", "--ala_threshold", "10", seed=3,
                                     local_learning_rate=lr)
    g = server.global_params.double()
    xs = [(c.train_x.double(), c.train_y) for c in data.clients]

    # Round 0: no local model yet, so no ALA; plain FedAvg.
    local = [gradient_descent(g, x, y, 2, 2, lr) for x, y in xs]
    g1 = 0.4 * local[0] + 0.6 * local[1]
    run_round(server, 0)
    assert torch.allclose(server.global_params.double(), g1, atol=1e-6, rtol=0)
    assert not server.state.indices("ala_weights")

    # Round 1: ALA on the bias (entries 4:6), weight taken from the global model, then SGD.
    expected_w, expected_local = [], []
    for (x, y), mine in zip(xs, local):
        gap = g1[4:] - mine[4:]
        weights = torch.ones(2, dtype=torch.float64)
        for _ in range(2):  # start phase: 2 epochs of one batch each
            mixed = torch.cat([g1[:4], mine[4:] + gap * weights])
            weights = torch.clamp(weights - eta * linear_grad(mixed, x, y, 2)[4:] * gap, 0, 1)
        mixed = torch.cat([g1[:4], mine[4:] + gap * weights])
        expected_w.append(weights)
        expected_local.append(gradient_descent(mixed, x, y, 2, 2, lr))
    assert not torch.equal(expected_w[0], torch.ones(2, dtype=torch.float64))  # W moved
    updates = run_round(server, 1).updates
    for i, update in enumerate(updates):
        assert torch.allclose(server.state.get("ala_weights", i).double(), expected_w[i], atol=1e-6, rtol=0)
        assert torch.allclose(update.params.double(), expected_local[i], atol=1e-6, rtol=0)
        assert torch.equal(server.state.get("local", i), update.params)
        assert torch.equal(server.eval_params(i), update.params)
    assert torch.allclose(server.global_params.double(), 0.4 * expected_local[0] + 0.6 * expected_local[1],
                          atol=1e-6, rtol=0)


def test_eta_zero_is_fedavg_over_three_rounds():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[8, 6, 7], seed=2)
    finals = {name: trained_server(data, algo, *extra, global_rounds=3, batch_size=4, local_epochs=2,
                                   local_learning_rate=0.1).global_params
              for name, algo, extra in (("fedavg", "FedAvg", ()), ("all", "FedALA", ("-et", "0", "-p", "0")),
                                        ("top", "FedALA", ("-et", "0")),
                                        ("learned", "FedALA", ("--ala_max_init_epochs", "3")))}
    assert torch.equal(finals["fedavg"], finals["all"])
    assert torch.equal(finals["fedavg"], finals["top"])
    assert not torch.equal(finals["fedavg"], finals["learned"])


def test_window_and_sample():
    data = random_dataset(num_clients=2, dim=3, num_classes=2, sizes=[25, 9])
    server = build_server(make_args("FedALA", "-p", "1", batch_size=4), data)
    client, model = server.clients[0], server.model
    assert client.ala_window(model) == (6, 8)  # weight 2x3, then the bias
    for p, lo in (("0", 0), ("2", 0), ("5", 0)):
        client.hp = dataclasses.replace(client.hp, layer_idx=int(p))
        assert client.ala_window(model) == (lo, 8)
    batches = client.ala_batches(rnd=3)
    sample = torch.cat(batches)
    assert [len(b) for b in batches] == [4, 4, 4, 4, 4]  # int(0.8 * 25) = 20 samples
    assert torch.equal(sample, torch.arange(int(sample[0]), int(sample[0]) + 20))
    assert all(torch.equal(a, b) for a, b in zip(batches, client.ala_batches(rnd=3)))  # seeded
    client.hp = dataclasses.replace(client.hp, ala_sample="random")
    sample = torch.cat(client.ala_batches(rnd=3))
    assert len(sample) == 20 and len(set(sample.tolist())) == 20 and int(sample.max()) < 25
    client.hp = dataclasses.replace(client.hp, rand_percent=0)
    assert client.ala_batches(rnd=3) == []


def test_state_survives_partial_participation():
    data = random_dataset(num_clients=4, dim=3, num_classes=2, sizes=[12, 9, 10, 8], seed=4)
    args = make_args("FedALA", "-p", "0", local_learning_rate=0.3, batch_size=3)
    server = build_server(args, data)
    seen = []
    for client in server.clients:
        original = client._learn_weights

        def record(model, global_params, gap, weights, batches, start_phase, rnd, original=original, cid=client.cid):
            seen.append((cid, rnd, start_phase, weights.clone(), gap.clone()))
            return original(model, global_params, gap, weights, batches, start_phase, rnd)

        client._learn_weights = record
    run_round(server, 0, [0, 1, 2])
    round0_model_2 = server.state.get("local", 2).clone()
    run_round(server, 1, [0, 1])  # start phase of clients 0 and 1
    w0, w1 = server.state.get("ala_weights", 0).clone(), server.state.get("ala_weights", 1).clone()
    local1 = server.state.get("local", 1).clone()
    run_round(server, 2, [0, 3])  # clients 1 and 2 sit out; client 3 has no local model yet: no ALA
    global3 = server.global_params.clone()
    run_round(server, 3, [0, 2])  # client 2 comes back after two rounds: its first ALA
    assert [s[:3] for s in seen] == [(0, 1, True), (1, 1, True), (0, 2, False), (0, 3, False), (2, 3, True)]
    assert torch.equal(seen[2][3], w0)  # client 0 continues from its stored W, not from ones
    assert torch.equal(seen[4][3], torch.ones_like(w0))
    assert torch.equal(seen[4][4], global3 - round0_model_2)  # client 2 kept its round-0 model
    assert torch.equal(server.state.get("ala_weights", 1), w1)  # client 1 untouched while away
    assert torch.equal(server.state.get("local", 1), local1)
    assert torch.equal(server.eval_params(1), local1)
    assert [c.participations for c in server.clients] == [4, 2, 2, 1]


def test_all_clients_mode_runs_ala_at_send_time_like_pfllib():
    data = random_dataset(num_clients=3, dim=3, num_classes=2, sizes=[12, 9, 10], seed=5)
    args = make_args("FedALA", "--ala_all_clients", "True", "-p", "0", local_learning_rate=0.3, batch_size=3)
    server = build_server(args, data)
    initial = server.global_params.clone()
    assert all(torch.equal(server.eval_params(i), initial) for i in range(3))
    run_round(server, 0, [0, 1])
    # Every client, trained or not, now holds its ALA model for round 1 and is evaluated on it;
    # client 2 never trained, so it mixed the initial model with the global one (PFLlib).
    assert server.state.indices("ala_weights") == [0, 1, 2]
    for i in range(3):
        assert torch.equal(server.eval_params(i), server.state.get("local", i))
        assert not torch.equal(server.eval_params(i), server.global_params)
    calls = []
    server.clients[2].adaptive_local_aggregation = lambda *a: calls.append(a)
    package = server.make_package(1, [2])
    (update,) = server.engine.train([server.clients[2]], package)
    assert calls == []  # no second ALA: training starts from the model mixed at send time
    assert torch.equal(server.state.get("local", 2), update.params)


def test_start_phase_is_capped():
    data = random_dataset(num_clients=2, dim=3, num_classes=2, seed=6)
    args = make_args("FedALA", "--ala_threshold", "0", "--ala_max_init_epochs", "3", local_learning_rate=0.3,
                     batch_size=3)
    server = build_server(args, data)
    with fl_log_messages(logging.INFO) as messages:
        run_round(server, 0, [0, 1])
        run_round(server, 1, [0, 1])
    assert any("--ala_max_init_epochs 3" in m for m in messages)


def test_pfllib_short_flags():
    args = make_args("FedALA", "-et", "0.5", "-p", "1")
    assert (args.eta, args.layer_idx, args.prev) == (0.5, 1, 0)


def test_short_flag_s():
    assert make_args("FedALA", "-s", "50").rand_percent == 50


def test_two_round_run_through_main(tmp_path):
    path = run_main_two_rounds(tmp_path, "FedALA")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
        acc_global = f["rs_test_acc_global"][:]
    assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
    assert len(acc_global) == 3
