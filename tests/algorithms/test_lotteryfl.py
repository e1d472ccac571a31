"""LotteryFL and Hermes: each pruning rule on 10 parameters by hand, two LotteryFL rounds by hand,
-kf 1 is FedAvg exactly, uploads are the ticket's values plus positions and the mask stays on the
client, partial participation, bad input, main."""
from __future__ import annotations

import h5py
import pytest
import torch
from torch import nn

import main
from flcore.common.sparsemask import decode
from fltest import build_server, image_dataset, linear_grad, make_args, random_dataset, run_main_two_rounds, run_round, trained_server
from test_pfedeff import first_round_state
from toydata import make_dataset


def mask_of(positions, n=10):
    mask = torch.zeros(n, dtype=torch.bool)
    mask[list(positions)] = True
    return mask


def smallest_dropped(scores, positions, drop):
    """``positions`` without the ``drop`` of smallest score, by hand (ties: the higher position goes)."""
    ranked = sorted(positions, key=lambda j: (-float(scores[j]), j))
    return sorted(ranked[: len(ranked) - drop])


# ------------------------------------------------------------------ the pruning rules on 10 parameters
def test_lottery_pruning_step_on_ten_parameters():
    # TinyLinear(4, 2): weight entries 0..7, bias 8..9 (never pruned)
    data = random_dataset(num_clients=2, dim=4, num_classes=2, seed=1)
    server = build_server(make_args("LotteryFL", "-kf", "0.25", "--prune_rate", "0.4"), data)
    client = server.clients[0]
    theta = torch.tensor([0.5, -0.1, 0.9, -0.7, 0.2, 0.0, -0.3, 0.8, 0.05, -0.4])
    full = torch.ones(10, dtype=torch.bool)
    # 8 kept weights: round(0.4·8) = 3 smallest |θ| go: 0.0 (5), -0.1 (1), 0.2 (4)
    first = client.pruned(theta, full)
    assert torch.equal(first, mask_of([0, 2, 3, 6, 7, 8, 9]))
    # 5 kept: round(0.4·5) = 2 go, -0.3 (6) and 0.5 (0)
    second = client.pruned(theta, first)
    assert torch.equal(second, mask_of([2, 3, 7, 8, 9]))
    # 3 kept: round(0.4·3) = 1 goes, -0.7 (3), which lands on the target ⌈0.25·8⌉ = 2
    third = client.pruned(theta, second)
    assert torch.equal(third, mask_of([2, 7, 8, 9]))
    assert client.may_prune(second) and not client.may_prune(third)
    assert torch.equal(client.pruned(theta, third), third)  # at the target nothing more goes


def test_hermes_channel_pruning_on_ten_parameters():
    # Linear(1, 3) then Linear(3, 1): 3 + 3 + 3 + 1 = 10 parameters; only the first layer's 3
    # output channels (weight and bias) may go, the classifier keeps its output
    module = nn.Sequential(nn.Linear(1, 3), nn.ReLU(), nn.Linear(3, 1))
    data = random_dataset(num_clients=2, dim=1, num_classes=1, seed=1)
    server = build_server(make_args("Hermes", "-kf", "0.3", "--prune_rate", "0.34", eval_auc=False), data, module)
    client = server.clients[0]
    assert server.model.num_params == 10
    #               w0    w1   w2 | b0   b1   b2 | classifier weights and bias
    theta = torch.tensor([0.6, -0.1, 0.3, 0.0, 0.9, -0.2, 1.0, 1.0, 1.0, 1.0])
    full = torch.ones(10, dtype=torch.bool)
    # L1 norms of the channels' weights 0.6, 0.1, 0.3: round(0.34·3) = 1 goes, channel 1: its weight
    # (1), its bias (4) and the classifier's weight that reads it (7)
    first = client.pruned(theta, full)
    assert torch.equal(first, ~mask_of([1, 4, 7]))
    # 2 left: round(0.34·2) = 1 goes, down to the target ⌈0.3·3⌉ = 1: channel 2 (2, 5 and 8)
    second = client.pruned(theta, first)
    assert torch.equal(second, ~mask_of([1, 2, 4, 5, 7, 8]))
    assert client.may_prune(first) and not client.may_prune(second)


def test_hermes_drops_the_flattened_block_a_pruned_filter_feeds():
    # Conv2d(1 → 2, 1x1) on 2x2 images, flattened channel-major into Linear(8 → 2)
    module = nn.Sequential(nn.Conv2d(1, 2, 1), nn.ReLU(), nn.Flatten(), nn.Linear(8, 2))
    data = image_dataset([6, 6], shape=(1, 2, 2), num_classes=2)
    server = build_server(make_args("Hermes", "-kf", "0.5", "--prune_rate", "0.5"), data, module)
    client = server.clients[0]
    theta = server.global_params.clone()
    theta[0:2] = torch.tensor([0.1, -0.9])  # filter 0 is the weaker one
    mask = client.pruned(theta, torch.ones_like(theta, dtype=torch.bool))
    dropped = [0, 2] + [4 + row * 8 + col for row in range(2) for col in range(4)]  # filter, bias, block 0
    assert torch.equal(~mask, torch.isin(torch.arange(theta.numel()), torch.tensor(dropped)))


# ------------------------------------------------------------------ two rounds by hand
def test_two_rounds_by_hand():
    lr = 0.1
    data = random_dataset(num_clients=2, dim=4, num_classes=2, sizes=[4, 6], seed=5)
    server = build_server(make_args("LotteryFL", "-kf", "0.5", "--prune_rate", "0.5", "--acc_threshold=-1",
                                    batch_size=6, local_epochs=2, drop_last=False, local_learning_rate=lr), data)
    init = server.global_params.double()
    G = init.clone()
    masks = [torch.ones(10, dtype=torch.bool), torch.ones(10, dtype=torch.bool)]
    xy = [(c.train_x.double(), c.train_y) for c in data.clients]
    for rnd in range(2):
        uploads = []
        for i, (x, y) in enumerate(xy):
            theta = torch.where(masks[i], G, torch.zeros_like(G))
            if int(masks[i][:8].sum()) > 4:  # above the target: prune round(0.5·8) = 4 weights, rewind
                masks[i] = mask_of(smallest_dropped(theta.abs(), range(8), 4) + [8, 9])
                theta = torch.where(masks[i], init, torch.zeros_like(init))
            for _ in range(2):
                theta = theta - lr * linear_grad(theta, x, y, 2) * masks[i].double()
            uploads.append(theta)
        total = 0.4 * uploads[0] + 0.6 * uploads[1]
        coverage = 0.4 * masks[0].double() + 0.6 * masks[1].double()
        G = torch.where(coverage > 0, total / coverage.clamp_min(1e-30), G)
        updates = run_round(server, rnd).updates
        for i in range(2):
            values, sent = decode(updates[i].extras, 10)
            assert torch.equal(sent, masks[i]) and torch.equal(server.state.get("mask", i), masks[i])
            assert torch.allclose(values.double(), torch.where(masks[i], uploads[i], torch.zeros(10, dtype=torch.float64)),
                                  atol=1e-6)
            assert torch.allclose(server.eval_params(i).double(), uploads[i], atol=1e-6)
        assert torch.allclose(server.global_params.double(), G, atol=1e-6)


# ------------------------------------------------------------------ reductions, bytes, state
@pytest.mark.parametrize("algorithm", ["LotteryFL", "Hermes"])
@pytest.mark.parametrize("join_ratio", [1.0, 0.5])
def test_kept_fraction_one_is_fedavg_exactly(algorithm, join_ratio):
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=2)
    settings = dict(global_rounds=3, join_ratio=join_ratio, batch_size=4, local_epochs=2)
    fedavg = trained_server(data, "FedAvg", **settings)
    dense = trained_server(data, algorithm, "-kf", "1", "--acc_threshold=-1", **settings)
    assert torch.equal(dense.global_params, fedavg.global_params)
    assert dense.history.extra_series["test_acc_global"] == fedavg.history.test_acc
    assert dense.history.bytes_up == fedavg.history.bytes_up and dense.history.bytes_down == fedavg.history.bytes_down
    assert dense.history.extra_series["comm_volume"] == [1.0, 1.0, 1.0]


def test_uploads_are_the_ticket_as_values_plus_positions_and_the_mask_stays_home():
    data = random_dataset(num_clients=3, dim=40, num_classes=2, seed=6)
    server = build_server(make_args("LotteryFL", "-kf", "0.05", "--prune_rate", "1", "--acc_threshold=-1", batch_size=4),
                          data)
    n = server.global_params.numel()  # 80 weights, 2 biases
    for rnd in range(2):
        result = run_round(server, rnd)
        for update in result.updates:
            assert set(update.extras) == {"values", "bitmap"}  # 6 of 82 entries: an 11-byte bitmap < 24 index bytes
            assert update.params.numel() == 0 and not any(t.dtype == torch.bool for t in update.extras.values())
            _, sent = decode(update.extras, n)
            assert update.nbytes() == int(sent.sum()) * 4 + 11  # values + the bitmap's ⌈82/8⌉ bytes
            assert torch.equal(sent, server.state.get("mask", update.index))  # what the server must learn
        if rnd == 1:  # the download is the global model on the kept entries only
            for i in result.cohort:
                assert result.package.nbytes(i) == 4 * int(server.state.get("mask", i).sum()) + 11
    assert int(server.state.get("mask", 0)[:80].sum()) == 4  # ⌈0.05·80⌉


@pytest.mark.parametrize("algorithm", ["LotteryFL", "Hermes"])
def test_partial_participation_keeps_state_and_first_timers_get_the_dense_model(algorithm):
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=4)
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))  # Hermes prunes the hidden channels
    server = build_server(make_args(algorithm, "-kf", "0.5", "--acc_threshold=-1", join_ratio=0.5, batch_size=50,
                                    drop_last=False), data, module)
    init, cohort0 = first_round_state(server, "mask", "support")
    n = init.numel()
    before = {i: (server.eval_params(i).clone(), server.state.get("mask", i)) for i in cohort0}
    result = run_round(server, 1)
    for i in range(4):
        if i not in result.cohort and i in before:
            assert torch.equal(server.eval_params(i), before[i][0])
            assert torch.equal(server.state.get("mask", i), before[i][1])
        if i in result.cohort and i not in cohort0:  # never uploaded: the dense model, no positions
            assert set(result.package.payload(i)) == {"values"} and result.package.nbytes(i) == 4 * n
        if i in result.cohort and i in cohort0:
            assert result.package.nbytes(i) < 4 * n


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    folder = make_dataset(tmp_path, num_clients=2, input_shape=(1, 8, 8))
    for algorithm, flag, said in (("LotteryFL", "--kept_fraction=0", "-kf must be in (0, 1]"),
                                  ("Hermes", "-kf=2", "-kf must be in (0, 1]"),
                                  ("LotteryFL", "--prune_rate=1.5", "--prune_rate must be in [0, 1]")):
        rc = main.main(["-data", str(folder), "--results_dir", str(tmp_path / "r"), "-dev", "cpu", "-gr", "1",
                        "-m", "DNN", "-algo", algorithm, flag, "--progress", "False", "-q", "True"])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and said in err
        assert not list((tmp_path / "r").glob("*.h5"))


@pytest.mark.parametrize("algorithm", ["LotteryFL", "Hermes"])
def test_two_round_run_through_main_prunes_and_records_sparsity(algorithm, tmp_path):
    path = run_main_two_rounds(tmp_path, algorithm, "-kf", "0.5", "--prune_rate", "0.5", "--acc_threshold=-1")
    with h5py.File(path, "r") as f:
        assert len(f["rs_test_acc"][:]) == 3 and len(f["rs_test_acc_global"][:]) == 3
        sparsity = f["rs_sparsity"][:]
        volume = f["rs_comm_volume"][:]
    assert len(sparsity) == 2 and all(0.2 < s < 0.5 for s in sparsity)
    assert len(volume) == 2 and volume[0] < 0.9 and volume[1] < 0.7
