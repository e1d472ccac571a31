"""pFedEff: the sparse message, every mask rule on 10 parameters by hand, two rounds by hand,
-kf 1 is FedAvg, personal masks stay on the client, partial participation, bad input, main."""
from __future__ import annotations

import h5py
import pytest
import torch

import main
from flcore.common.sparsemask import (decode, encode, keep_largest, kept_count, masked_average, pack_bits,
                                       unpack_bits)
from fltest import build_server, linear_grad, make_args, random_dataset, run_main_two_rounds, run_round, trained_server
from toydata import make_dataset

GROUPS = [(0, 8), (8, 10)]  # TinyLinear(4, 2): the weight (8 entries), then the bias (2)


def top(scores, start, stop, count, eligible=None):
    """Positions of the ``count`` largest scores in [start, stop) by hand (ties: lower position)."""
    pool = [j for j in range(start, stop) if eligible is None or bool(eligible[j])]
    return sorted(sorted(pool, key=lambda j: (-float(scores[j]), j))[:count])


def mask_of(positions, n=10):
    mask = torch.zeros(n, dtype=torch.bool)
    mask[list(positions)] = True
    return mask


# ------------------------------------------------------------------ the sparse message
def test_message_is_values_plus_the_cheapest_position_encoding():
    vector = torch.arange(1000, dtype=torch.float32)
    few = mask_of([3, 500, 999], 1000)
    message = encode(vector, few)
    # 3 values and 3 int32 indices (24 bytes) beat a 125-byte bitmap
    assert set(message) == {"values", "indices"} and message["indices"].dtype == torch.int32
    assert sum(t.numel() * t.element_size() for t in message.values()) == 3 * 4 + 3 * 4
    many = torch.arange(1000) % 3 == 0
    message = encode(vector, many)
    assert set(message) == {"values", "bitmap"} and message["bitmap"].numel() == 125
    assert sum(t.numel() * t.element_size() for t in message.values()) == 334 * 4 + 125
    assert set(encode(vector, torch.ones(1000, dtype=torch.bool))) == {"values"}  # dense: no positions
    for keep in (few, many, torch.ones(1000, dtype=torch.bool), torch.zeros(1000, dtype=torch.bool)):
        dense, sent = decode(encode(vector, keep), 1000)
        assert torch.equal(sent, keep) and torch.equal(dense, torch.where(keep, vector, torch.zeros(1000)))
    bits = torch.tensor([1, 0, 0, 1, 0, 0, 0, 0, 1], dtype=torch.bool)
    assert pack_bits(bits).tolist() == [9, 1] and torch.equal(unpack_bits(pack_bits(bits), 9), bits)


def test_masked_average_by_hand():
    previous = torch.full((4,), 7.0)
    a = (torch.tensor([1.0, 2.0, 0.0, 0.0]), mask_of([0, 1], 4))
    b = (torch.tensor([3.0, 0.0, 5.0, 0.0]), mask_of([0, 2], 4))
    out = masked_average([a, b], [1, 3], previous)  # weights 0.25 / 0.75
    assert torch.allclose(out, torch.tensor([0.25 * 1 + 0.75 * 3, 2.0, 5.0, 7.0]))


# ------------------------------------------------------------------ the mask rules on 10 parameters
def test_every_mask_rule_on_ten_parameters():
    data = random_dataset(num_clients=2, dim=4, num_classes=2, sizes=[4, 6], seed=3)
    server = build_server(make_args("pFedEff", "-kf", "0.5", "--magnitude_decay", "0.1"), data)
    client = server.clients[0]
    s = torch.tensor([0.5, -0.1, 0.9, -0.7, 0.2, 0.0, -0.3, 0.8, 0.05, -0.4])
    # pre-training magnitude mask: ⌈0.5·8⌉ = 4 weights {0.9, 0.8, -0.7, 0.5}, ⌈0.5·2⌉ = 1 bias {-0.4}
    pre = keep_largest(s.abs(), GROUPS, 0.5)
    assert torch.equal(pre, mask_of([0, 2, 3, 7, 9]))
    # its approximated regulariser: λ·sign(w) on the other entries only
    package = server.sparse_package(0, [0], {0: encode(s, mask_of(range(10)))})
    ctx = client.begin_round(package, 1)
    g = torch.ones(10)
    expected = g + 0.1 * torch.tensor([0, -1, 0, 0, 1, 0, -1, 0, 1, 0], dtype=torch.float32)
    assert torch.allclose(client.adjust_grad(s, g, ctx), expected)
    # post-training magnitude mask on the trained w, and the upload importance mask: of the kept
    # entries, ⌈0.5·4⌉ = 2 weights and ⌈0.5·1⌉ = 1 bias that changed most (|p − s|)
    w = torch.tensor([0.1, -0.6, 1.0, -0.2, 0.3, 0.4, -0.5, 0.85, 0.3, -0.1])
    update = client.end_round(w, package, ctx, 1, 0.0)
    post = mask_of([1, 2, 6, 7, 8])  # weights {1.0, 0.85, -0.6, -0.5}, bias {0.3}
    assert torch.equal(client.mask(), post)
    personal = torch.where(post, w, torch.zeros(10))
    assert torch.equal(client.personal(), personal)
    # |p − s| on the kept weights: 1: 0.5, 2: 0.1, 6: 0.2, 7: 0.05 → {1, 6}; bias 8: 0.25
    values, sent = decode(update.extras, 10)
    assert torch.equal(sent, mask_of([1, 6, 8])) and torch.equal(values[sent], personal[[1, 6, 8]])
    # download importance mask: ⌈0.5·⌈0.5·8⌉⌉ = 2 weights and 1 bias where G differs most from the
    # server's view of the client; entries that do not differ are never sent
    server.global_params = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    known = torch.tensor([1.0, 0.0, 1.0, 0.7, 1.0, 1.0, 1.0, 2.5, 1.0, 1.0])
    assert torch.equal(server.download_mask(known), mask_of([1, 7]))  # the biases do not differ
    # personalised merge: the downloaded entries overwrite the personal model's
    message = encode(server.global_params, mask_of([1, 7]))
    merged = client.merged_start(server.sparse_package(1, [0], {0: message}))
    assert torch.equal(merged, torch.where(mask_of([1, 7]), torch.ones(10), personal))


def test_keep_largest_is_a_stable_sort_by_selection_ties_and_nan_included():
    """The rule found by selection keeps what a stable descending sort's first ⌈K·m⌉ keep, on scores
    with many ties (few distinct values), zeros of both signs, NaN, eligibility masks and counts."""
    g = torch.Generator().manual_seed(7)
    groups = [(0, 300), (300, 307), (307, 1000)]
    for trial in range(40):
        scores = torch.randint(0, 4 if trial % 2 else 1000, (1000,), generator=g).to(torch.float32) / 8
        scores[torch.randint(0, 1000, (20,), generator=g)] = -0.0
        if trial % 5 == 0:
            scores[torch.randint(0, 1000, (3,), generator=g)] = float("nan")
        eligible = None if trial % 3 == 0 else torch.rand(1000, generator=g) < 0.6
        fraction = [0.25, 0.5, 0.75, 1.0, 0.001][trial % 5]
        counts = [int(c) for c in torch.randint(0, 400, (3,), generator=g)] if trial % 4 == 1 else None
        expected = torch.zeros(1000, dtype=torch.bool)
        for k, (start, stop) in enumerate(groups):
            pool = torch.arange(start, stop)
            if eligible is not None:
                pool = pool[eligible[start:stop]]
            if pool.numel() == 0:
                continue
            count = kept_count(pool.numel(), fraction) if counts is None else min(counts[k], pool.numel())
            expected[pool[torch.argsort(scores[pool], descending=True, stable=True)[:count]]] = True
        assert torch.equal(keep_largest(scores, groups, fraction, eligible=eligible, counts=counts), expected), trial


# ------------------------------------------------------------------ two rounds by hand
def test_two_rounds_by_hand():
    lr, lam, kf = 0.1, 0.05, 0.5
    data = random_dataset(num_clients=2, dim=4, num_classes=2, sizes=[4, 6], seed=5)
    server = build_server(make_args("pFedEff", "-kf", str(kf), "--magnitude_decay", str(lam), batch_size=6,
                                    local_epochs=2, drop_last=False, local_learning_rate=lr), data)
    G = server.global_params.double()
    known = [G.clone(), G.clone()]
    personal = [G.clone(), G.clone()]
    xy = [(c.train_x.double(), c.train_y) for c in data.clients]
    for rnd in range(2):
        uploads = []
        for i, (x, y) in enumerate(xy):
            importance = (G - known[i]).abs()
            down = top(importance, 0, 8, 2, importance > 0) + top(importance, 8, 10, 1, importance > 0)
            known[i][down] = G[down]
            s = personal[i].clone()
            s[down] = G[down]
            pre = mask_of(top(s.abs(), 0, 8, 4) + top(s.abs(), 8, 10, 1)).double()
            w = s.clone()
            for _ in range(2):
                w = w - lr * (linear_grad(w, x, y, 2) + lam * torch.sign(w) * (1 - pre))
            post = mask_of(top(w.abs(), 0, 8, 4) + top(w.abs(), 8, 10, 1))
            personal[i] = torch.where(post, w, torch.zeros_like(w))
            change = (personal[i] - s).abs()
            up = mask_of(top(change, 0, 8, 2, post) + top(change, 8, 10, 1, post))
            known[i] = torch.where(up, personal[i], known[i])
            uploads.append((torch.where(up, personal[i], torch.zeros_like(w)), up))
        weights = [0.4, 0.6]
        total = sum(wt * v for wt, (v, _) in zip(weights, uploads))
        coverage = sum(wt * m.double() for wt, (_, m) in zip(weights, uploads))
        G = torch.where(coverage > 0, total / coverage.clamp_min(1e-30), G)
        updates = run_round(server, rnd).updates
        for i in range(2):
            values, sent = decode(updates[i].extras, 10)
            assert torch.equal(sent, uploads[i][1])
            assert torch.allclose(values.double(), uploads[i][0], atol=1e-6)
            assert torch.allclose(server.eval_params(i).double(), personal[i], atol=1e-6)
            assert torch.allclose(server.state.get("known", i).double(), known[i], atol=1e-6)
        assert torch.allclose(server.global_params.double(), G, atol=1e-6)


# ------------------------------------------------------------------ reductions and bytes
@pytest.mark.parametrize("join_ratio", [1.0, 0.5])
def test_kept_fraction_one_is_fedavg_exactly(join_ratio):
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=2)
    settings = dict(global_rounds=3, join_ratio=join_ratio, batch_size=4, local_epochs=2)
    fedavg = trained_server(data, "FedAvg", **settings)
    pfedeff = trained_server(data, "pFedEff", "-kf", "1", **settings)
    assert torch.equal(pfedeff.global_params, fedavg.global_params)
    assert pfedeff.history.extra_series["test_acc_global"] == fedavg.history.test_acc
    assert pfedeff.history.extra_series["sparsity"] == [0.0, 0.0, 0.0]
    # uploads are dense (no positions): FedAvg's bytes; downloads send only what the client lacks
    assert pfedeff.history.bytes_up == fedavg.history.bytes_up
    assert all(a <= b * 1.02 for a, b in zip(pfedeff.history.bytes_down, fedavg.history.bytes_down))


def test_upload_bytes_are_values_plus_positions_and_personal_masks_stay_home():
    data = random_dataset(num_clients=3, dim=4, num_classes=2, seed=6)
    server = build_server(make_args("pFedEff", "-kf", "0.5", batch_size=4), data)
    for rnd in range(2):
        updates = run_round(server, rnd).updates
        for update in updates:
            assert set(update.extras) in ({"values", "indices"}, {"values", "bitmap"})
            assert not any(t.dtype == torch.bool for t in update.extras.values())
            assert update.params.numel() == 0  # the model itself is not uploaded
            _, sent = decode(update.extras, 10)
            positions = update.extras.get("indices", update.extras.get("bitmap"))
            assert update.nbytes() == int(sent.sum()) * 4 + positions.numel() * positions.element_size()
            mask = server.state.get("mask", update.index)
            assert bool((sent <= mask).all()) and int(sent.sum()) < int(mask.sum())  # a strict part of it


def test_the_download_is_decoded_once_a_round_and_training_starts_from_the_merge(monkeypatch):
    """begin_round merges the download into the personal model; start_point, called next, takes
    that merge instead of decoding the download a second time (it cost ~3% of a round)."""
    from flcore.clients import clientpfedeff

    decoded = []
    monkeypatch.setattr(clientpfedeff, "decode", lambda message, n: decoded.append(n) or decode(message, n))
    data = random_dataset(num_clients=3, dim=4, num_classes=2, seed=6)
    server = build_server(make_args("pFedEff", "-kf", "0.5", batch_size=4), data)
    for rnd in range(2):
        decoded.clear()
        cohort = run_round(server, rnd).cohort
        assert len(decoded) == len(cohort)
    client = server.clients[0]
    package = server.make_package(2, [0])
    ctx = client.begin_round(package, 1)
    assert client.start_point(package) is ctx["start"] and "_merged" not in vars(client)  # kept until taken
    assert torch.equal(client.start_point(package), ctx["start"])  # alone (no begin_round before): decoded


def first_round_state(server, *names: str):
    """Round 0 with partial participation: exactly its cohort holds the state ``names``; the others
    are evaluated with the initial model. Returns (initial model, cohort)."""
    init = server.global_params.clone()
    cohort = run_round(server, 0).cohort
    for i in range(len(server.clients)):
        assert all(server.state.has(name, i) == (i in cohort) for name in names)
        if i not in cohort:
            assert torch.equal(server.eval_params(i), init)
    return init, cohort


def test_partial_participation_keeps_state_and_first_timers_start_from_init():
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=4)
    server = build_server(make_args("pFedEff", "-kf", "0.5", join_ratio=0.5, batch_size=50, drop_last=False), data)
    init, cohort0 = first_round_state(server, "mask", "known")
    before = {i: server.eval_params(i).clone() for i in range(4)}
    cohort1 = run_round(server, 1).cohort
    for i in set(range(4)) - set(cohort1):
        assert torch.equal(server.eval_params(i), before[i])
    for i in set(cohort1) - set(cohort0):  # a first timer's download fills in what changed since init
        package_known = server.state.get("known", i)
        assert int((package_known != init).sum()) > 0
    for i in cohort1:
        assert int(server.eval_params(i)[:12].ne(0).sum()) == 6  # ⌈0.5·12⌉ weights (4 features, 3 classes)


def test_bad_kept_fraction_is_one_line_and_exit_2(tmp_path, capsys):
    folder = make_dataset(tmp_path, num_clients=2, input_shape=(1, 8, 8))
    for bad in ("0", "1.5", "-0.25"):
        rc = main.main(["-data", str(folder), "--results_dir", str(tmp_path / "r"), "-dev", "cpu", "-gr", "1",
                        "-m", "DNN", "-algo", "pFedEff", f"--kept_fraction={bad}", "--progress", "False", "-q", "True"])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and "-kf" in err and "(0, 1]" in err
        assert not list((tmp_path / "r").glob("*.h5"))


def test_two_round_run_through_main_records_sparsity_and_volume(tmp_path):
    path = run_main_two_rounds(tmp_path, "pFedEff", "-kf", "0.25")
    with h5py.File(path, "r") as f:
        assert len(f["rs_test_acc"][:]) == 3 and len(f["rs_test_acc_global"][:]) == 3
        sparsity = f["rs_sparsity"][:]
        volume = f["rs_comm_volume"][:]
    assert len(sparsity) == 2 and all(0.7 <= s <= 0.76 for s in sparsity)  # ⌈0.25·size⌉ kept per tensor
    assert len(volume) == 2 and all(0 < v < 0.25 for v in volume)
