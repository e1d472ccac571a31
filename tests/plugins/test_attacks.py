"""Attacks (flcore/features/attacks.py): who attacks (seeded, fixed or per round), each model attack
against a hand computation, label flipping equal to training on flipped labels, the results'
series, and the one-line refusals."""
from __future__ import annotations

from statistics import NormalDist

import h5py
import numpy as np
import pytest
import torch

from fltest import build_server, image_dataset, make_args, random_dataset, run_main_two_rounds
from fltest import one_thread  # noqa: F401  (fixture)
from flcore.features import attacks
from flcore.protocol import ClientUpdate, RoundPackage
from fldata.loading import ClientData
from utils.errors import FLError
from utils.seeding import torch_generator

CLIENTS = 8


def rows(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def dataset(flip: np.ndarray | None = None):
    """Eight clients; those in ``flip`` get labels y -> C - 1 - y (what a label flipper trains on)."""
    data = random_dataset(num_clients=CLIENTS, dim=4, num_classes=3, seed=2)
    if flip is not None:
        data.clients = [ClientData(c.cid, c.train_x, 2 - c.train_y if flip[i] else c.train_y, c.test_x, c.test_y)
                        for i, c in enumerate(data.clients)]
    return data


def server(data=None, engine: str = "sequential", **flags):
    flags = {"batch_size": 4, "global_rounds": 2, **flags}
    return build_server(make_args("FedAvg", engine=engine, num_clients=CLIENTS, **flags), data or dataset())


def first_round(srv):
    start = srv.global_params.clone()
    return start, srv.run_round(0, evaluate=False).updates


# ----------------------------------------------------------------------------- who attacks
def test_attackers_are_drawn_from_the_seed_fixed_or_per_round():
    attacks.attacker_mask.cache_clear()
    fixed = [attacks.attacker_mask(5, 0.25, False, 20, 0) for _ in range(2)]
    attacks.attacker_mask.cache_clear()
    again = attacks.attacker_mask(5, 0.25, False, 20, 0)
    assert fixed[0].sum() == 5 and np.array_equal(fixed[0], again)  # round(0.25 x 20), the same draw
    assert not np.array_equal(again, attacks.attacker_mask(6, 0.25, False, 20, 0))  # another seed, others
    args = make_args("FedAvg", num_clients=20, attack="ipm", attack_fraction=0.25)
    assert all(np.array_equal(attacks.attackers_of(args, rnd), attacks.attackers_of(args, 0)) for rnd in range(5))
    args.attack_resample = True
    per_round = [attacks.attackers_of(args, rnd) for rnd in range(5)]
    assert all(mask.sum() == 5 for mask in per_round)
    assert len({mask.tobytes() for mask in per_round}) > 1
    assert np.array_equal(per_round[3], attacks.attacker_mask(0, 0.25, True, 20, 3))
    assert attacks.attacker_count(0.25, 10) == 3 and attacks.attacker_count(0.2, 10) == 2  # halves round up



def test_the_cohort_scope_draws_a_fixed_share_of_each_rounds_cohort():
    args = make_args("FedAvg", num_clients=20, attack="ipm", attack_fraction=0.25, attack_scope="cohort")
    cohort = [17, 2, 9, 4, 11, 0, 6, 13]
    masks = [attacks.attackers_of(args, rnd, cohort) for rnd in range(6)]
    for rnd, mask in enumerate(masks):  # round(0.25 x 8) = 2, inside the cohort, by hand from the seed
        members = sorted(cohort)
        chosen = attacks.numpy_rng(0, "cohort-attackers", rnd).choice(8, size=2, replace=False)
        assert np.flatnonzero(mask).tolist() == sorted(members[i] for i in chosen)
    assert len({mask.tobytes() for mask in masks}) > 1  # drawn anew every round
    assert attacks.attackers_of(args, 3, sorted(cohort)).tobytes() == masks[3].tobytes()  # the order does not matter
    assert attacks.attackers_of(args, 0, [5, 8, 1]).sum() == 1  # round(0.75) of a smaller cohort
    with pytest.raises(ValueError, match="pass them"):
        attacks.attackers_of(args, 0)


def test_with_the_cohort_scope_every_round_has_the_same_number_of_attackers(tmp_path):
    def attack_uploads(scope: str) -> list[int]:
        srv = server(attack="sign_flip", attack_fraction=0.25, attack_scope=scope, join_ratio=0.5, global_rounds=8)
        counts = []
        for rnd in range(8):
            start = srv.global_params.clone()
            result = srv.run_round(rnd, evaluate=False)
            bad = [u for u in result.updates if srv.plugin("attack").attackers(rnd)[u.index]]
            assert {u.index for u in bad} <= set(result.cohort)
            counts.append(len(bad))
            if scope == "cohort":
                for update in bad:  # poisoned as sign_flip says: far from the start, the other way
                    assert float((update.params - start).norm()) > 0
        return counts

    assert attack_uploads("cohort") == [1] * 8  # round(0.25 x 4) of each cohort of 4
    assert len(set(attack_uploads("clients"))) > 1  # 2 of the 8 clients: 0, 1 or 2 in a cohort of 4


def test_cohort_scope_label_flippers_train_on_flipped_labels():
    srv = server(attack="label_flip", attack_fraction=0.25, attack_scope="cohort", join_ratio=0.5)
    cohort = srv.select_clients(0)
    mask = attacks.attackers_of(srv.args, 0, cohort)
    _, flipped = first_round(server(dataset(flip=mask), join_ratio=0.5))
    _, poisoned = first_round(srv)
    assert [u.index for u in poisoned] == [u.index for u in flipped] == cohort and mask.sum() == 1
    for ours, reference in zip(poisoned, flipped):
        assert torch.equal(ours.params, reference.params), ours.index


def test_the_drawn_scope_draws_from_the_clients_drawn_before_busy_ones_sit_out():
    """The official Sageflow code's order: attackers among the sampled clients, then busy ones skipped."""
    args = make_args("FedAvg", num_clients=20, attack="ipm", attack_fraction=0.25, attack_scope="drawn")
    drawn, trains = [17, 2, 9, 4, 11, 0, 6, 13], [17, 9, 4, 0, 6]
    package = RoundPackage(3, torch.zeros(1), trains, drawn=drawn)
    cohort_args = make_args("FedAvg", num_clients=20, attack="ipm", attack_fraction=0.25, attack_scope="cohort")
    mask = attacks.package_attackers(args, package)  # round(0.25 x 8) = 2 of the 8 drawn, as the cohort scope draws them
    assert mask.tobytes() == attacks.attackers_of(cohort_args, 3, drawn).tobytes() and mask.sum() == 2
    assert attacks.package_attackers(cohort_args, package).sum() == 1  # the cohort scope: round(0.25 x 5) of those that train
    assert attacks.package_attackers(args, RoundPackage(3, torch.zeros(1), drawn)).tobytes() == mask.tobytes()  # drawn=None


def test_the_drawn_scope_is_the_cohort_scope_without_busy_clients_and_loses_busy_attackers_with_them():
    def run(scope: str, busy: str) -> tuple[torch.Tensor, list[int], list[int]]:
        srv = server(attack="sign_flip", attack_fraction=0.25, attack_scope=scope, join_ratio=0.5, global_rounds=8,
                     straggler_delay=2, straggler_busy=busy)
        drawn_attackers, uploads = [], []
        for rnd in range(8):
            result = srv.run_round(rnd, evaluate=False)
            mask = srv.plugin("attack").attackers(rnd)
            assert set(np.flatnonzero(mask)) <= set(result.package.drawn_cohort)
            drawn_attackers.append(int(mask.sum()))
            uploads.append(sum(1 for c in result.cohort if mask[c]))
        return srv.global_params, drawn_attackers, uploads

    same, counts, _ = run("drawn", "train")
    reference, reference_counts, _ = run("cohort", "train")
    assert torch.equal(same, reference) and counts == reference_counts == [1] * 8
    _, drawn_counts, drawn_uploads = run("drawn", "skip")
    _, _, cohort_uploads = run("cohort", "skip")
    assert drawn_counts == [1] * 8  # round(0.25 x 4) of every drawn cohort, busy or not
    assert 0 in drawn_uploads and min(cohort_uploads) >= 0  # a busy attacker sat its round out
    assert drawn_uploads != cohort_uploads


def test_cohort_attackers_of_late_uploads_are_remembered_across_a_resume():
    """Sageflow's filter scores late uploads against the attackers of the round they were trained in."""
    from runner import checkpoint

    def sageflow():
        args = make_args("Sageflow", engine="sequential", num_clients=CLIENTS, batch_size=4, global_rounds=6,
                         public_data=0.1, attack="sign_flip", attack_fraction=0.25, attack_scope="cohort",
                         join_ratio=0.5, straggler_delay=2)
        return build_server(args, dataset())

    whole = sageflow()
    for rnd in range(5):
        whole.run_round(rnd, evaluate=False)
    first = sageflow()
    for rnd in range(3):
        first.run_round(rnd, evaluate=False)
    assert sorted(first.plugin("attack").cohort_attackers) == [0, 1, 2]
    saved = checkpoint.server_state(first, 3)
    resumed = sageflow()
    assert checkpoint.load_server_state(resumed, saved) == 3
    for rnd in (3, 4):  # uploads trained in rounds 1-2 arrive now: their attackers come from the checkpoint
        resumed.run_round(rnd, evaluate=False)
    assert torch.equal(resumed.global_params, whole.global_params)
    staleness = whole.history.extra_series["staleness"][3:]
    assert any(s > 0 for row in staleness for s in row)  # late uploads did arrive in rounds 3-4
    for name in ("sageflow_precision", "sageflow_recall"):
        np.testing.assert_array_equal(resumed.history.extra_series[name], whole.history.extra_series[name])
    for rnd in range(5):
        assert np.array_equal(resumed.plugin("attack").attackers(rnd), whole.plugin("attack").attackers(rnd))

# ----------------------------------------------------------------------------- the rules by hand
def test_alie_ipm_and_minmax_by_hand():
    benign = rows([1.0, 2.0], [3.0, 2.0])
    # mean (2, 2), population std (1, 0)
    assert attacks.alie(benign, 1.5).tolist() == [0.5, 2.0]
    # n = 10 uploads, m = 2 attackers: s = floor(10/2 + 1) - 2 = 4, z = inverse normal cdf of (10 - 4)/10
    assert attacks.alie_z(10, 2) == pytest.approx(NormalDist().inv_cdf(0.6))
    assert attacks.ipm(benign, 0.5).tolist() == [-1.0, -1.0]
    # b = (0, 0), (2, 0): mean (1, 0), largest benign distance 2; pushing along -(1, 0) keeps both distances
    # within 2 while |1 - g| <= 2 and |1 + g| <= 2, so g = 1: the upload is (0, 0)
    line = rows([0.0, 0.0], [2.0, 0.0])
    assert attacks.minmax(line, "unit").tolist() == [0.0, 0.0]
    assert attacks.minmax(line, "std").tolist() == [0.0, 0.0]  # std (1, 0): the same push
    # three points: the result sits exactly at the benign maximum distance from the farthest one
    tri = rows([0.0, 0.0], [4.0, 0.0], [0.0, 3.0])
    bad = attacks.minmax(tri, "sign")
    assert float(torch.cdist(bad[None], tri).max()) == pytest.approx(5.0)
    push = bad - tri.mean(0)  # along -sign(mean) = (-1, -1)
    assert float(push[0]) < 0 and float(push[0]) == pytest.approx(float(push[1]))


def test_the_label_map():
    assert attacks.parse_label_map("", 4) == {0: 3, 1: 2, 2: 1, 3: 0}
    assert attacks.label_table("1:7,7:1", 10).tolist() == [0, 7, 2, 3, 4, 5, 6, 1, 8, 9]
    with pytest.raises(FLError, match="classes must be in 0..9"):
        attacks.parse_label_map("1:10", 10)
    with pytest.raises(FLError, match="write class pairs as 'from:to,from:to'"):
        attacks.parse_label_map("1-7", 10)


# ----------------------------------------------------------------------------- on a server
def test_sign_flip_uploads_minus_s_times_the_honest_update_and_only_for_attackers():
    start, honest = first_round(server())
    _, attacked = first_round(server(attack="sign_flip", attack_fraction=0.25, attack_scale=10))
    mask = attacks.attacker_mask(0, 0.25, False, CLIENTS, 0)
    assert mask.sum() == 2
    for good, bad in zip(honest, attacked):
        expected = start + (good.params - start) * -10.0 if mask[good.index] else good.params
        assert torch.equal(bad.params, expected)


def test_weight_flip_uploads_minus_s_times_the_trained_weights_as_the_official_sageflow_code():
    start, honest = first_round(server())
    _, attacked = first_round(server(attack="sign_flip", attack_flip="weights", attack_fraction=0.25, attack_scale=10))
    mask = attacks.attacker_mask(0, 0.25, False, CLIENTS, 0)
    for good, bad in zip(honest, attacked):
        expected = good.params * -10.0 if mask[good.index] else good.params
        assert torch.allclose(bad.params, expected, atol=1e-6)
        if mask[good.index]:  # not the update flip: that one keeps the shared start
            assert not torch.allclose(bad.params, start + (good.params - start) * -10.0, atol=1e-3)


def test_gaussian_uploads_seeded_noise():
    start, attacked = first_round(server(attack="gaussian", attack_fraction=0.25, attack_noise_std=0.5))
    mask = attacks.attacker_mask(0, 0.25, False, CLIENTS, 0)
    for update in attacked:
        if mask[update.index]:
            noise = torch.randn(start.shape, generator=torch_generator(0, "attack-noise", 0, update.index))
            assert torch.equal(update.params, start + noise * 0.5)


@pytest.mark.parametrize("name", ["alie", "ipm", "minmax"])
def test_colluding_attackers_send_the_rule_of_the_benign_updates(name):
    start, attacked = first_round(server(attack=name, attack_fraction=0.25))
    mask = attacks.attacker_mask(0, 0.25, False, CLIENTS, 0)
    benign = torch.stack([u.params - start for u in attacked if not mask[u.index]])
    rule = {"alie": lambda b: attacks.alie(b, attacks.alie_z(CLIENTS, 2)),
            "ipm": lambda b: attacks.ipm(b, 0.5), "minmax": lambda b: attacks.minmax(b, "std")}[name]
    for update in attacked:
        if mask[update.index]:
            assert torch.allclose(update.params, start + rule(benign), atol=1e-7)


@pytest.mark.parametrize("engine", ["sequential", "threaded"])
def test_label_flippers_train_exactly_as_on_flipped_labels(engine):
    mask = attacks.attacker_mask(0, 0.25, False, CLIENTS, 0)
    _, flipped = first_round(server(dataset(flip=mask), engine="sequential"))
    poisoned_server = server(engine=engine, attack="label_flip", attack_fraction=0.25)
    assert type(poisoned_server.clients[0].local_step) is attacks.PoisonedData
    _, poisoned = first_round(poisoned_server)
    assert [u.index for u in poisoned] == [u.index for u in flipped]
    for ours, reference in zip(poisoned, flipped):
        assert torch.equal(ours.params, reference.params), ours.index


def test_no_attacker_changes_nothing():
    plain = server()
    none = server(attack="label_flip", attack_fraction=0.0)
    assert none.clients[0].local_step is plain.clients[0].local_step  # plain SGD: no poisoning step
    for rnd in range(2):
        plain.run_round(rnd, evaluate=False)
        none.run_round(rnd, evaluate=False)
    assert torch.equal(plain.global_params, none.global_params)


def test_the_results_hold_who_attacked(tmp_path):
    path = run_main_two_rounds(tmp_path, "FedAvg", "--attack", "sign_flip", "--attack_fraction", "0.25")
    with h5py.File(path) as f:
        assert list(f["rs_attack_uploads"][()]) == [1, 1]  # round(0.25 x 4) = 1 attacker in every cohort
        attacker = int(np.flatnonzero(attacks.attacker_mask(0, 0.25, False, 4, 0))[0])
        assert f["rs_attackers"][()].reshape(-1).tolist() == [attacker, attacker]


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("flags, message", [
    (dict(attack="sign_flip", attack_fraction=1.0), "--attack_fraction must be in \\[0, 1\\)"),
    (dict(attack="sign_flip", attack_fraction=-0.1), "--attack_fraction must be in \\[0, 1\\)"),
    (dict(attack="sign_flp", attack_fraction=0.2), "--attack sign_flp: unknown attack"),
    (dict(attack="label_flip", attack_fraction=0.2, attack_label_map="3:0"), "classes must be in 0..2"),
])
def test_bad_attacks_are_refused_in_one_line(flags, message):
    with pytest.raises(FLError, match=message):
        server(**flags)


def test_label_flipping_refuses_clients_that_train_their_own_way():
    with pytest.raises(FLError, match="poisons the base local step, but Ditto's clients \\(DittoClient\\) train their own way"):
        build_server(make_args("Ditto", num_clients=CLIENTS, attack="label_flip", attack_fraction=0.25), dataset())


def test_attackers_need_the_number_of_clients():
    with pytest.raises(FLError, match="give -nc 8"):
        build_server(make_args("FedAvg", attack="ipm", attack_fraction=0.25), dataset())


def test_a_wrong_fraction_through_main_is_one_line(tmp_path, capsys):
    with pytest.raises(AssertionError, match="main exited with 2"):
        run_main_two_rounds(tmp_path, "FedAvg", "--attack", "ipm", "--attack_fraction", "1")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--attack_fraction must be in [0, 1)" in err[0]


# ----------------------------------------------------------------------------- the backdoor
class FlatLinear(torch.nn.Module):
    """A linear classifier on flattened images (flat vector: [W.flatten(), b])."""

    def __init__(self, pixels: int, classes: int):
        super().__init__()
        self.head = torch.nn.Linear(pixels, classes)

    def forward(self, x):
        return self.head(x.flatten(1))


def backdoor_server(**flags):
    data = image_dataset([12] * 4, shape=(1, 6, 8), num_classes=4, seed=3)
    flags = {"batch_size": 10, "global_rounds": 2, "attack": "backdoor", "attack_fraction": 0.25, **flags}
    torch.manual_seed(0)
    args = make_args("FedAvg", engine="sequential", num_clients=4, **flags)
    return build_server(args, data, FlatLinear(48, 4))


def test_the_trigger_is_sageflows_twelve_pixels_on_every_channel():
    stamped = attacks.stamp_trigger(torch.zeros(2, 3, 6, 8), 0.75)
    expected = torch.zeros(6, 8)
    for row, col in [(0, 0), (1, 0), (2, 0), (0, 1), (1, 2), (2, 3), (0, 5), (1, 4), (4, 0), (4, 1), (4, 2), (4, 3)]:
        expected[row, col] = 0.75
    assert torch.equal(stamped, expected.expand(2, 3, 6, 8))
    x, y = torch.zeros(10, 1, 6, 8), torch.zeros(10, dtype=torch.long)
    args = make_args("FedAvg")  # 20 of 64: int(10 x 0.3125) = 3 samples of a batch of 10, target 2
    px, py = attacks.backdoor_batch(args, x, y)
    assert py.tolist() == [2, 2, 2] + [0] * 7
    assert torch.equal(px[:3], attacks.stamp_trigger(x[:3], 1.0)) and torch.equal(px[3:], x[3:])
    assert torch.equal(x, torch.zeros(10, 1, 6, 8))  # the client's data is untouched


def test_a_backdoor_attacker_trains_on_stamped_batches_and_scales_its_update():
    srv = backdoor_server(backdoor_from_round=0, backdoor_scale=3.0)
    attacker = int(np.flatnonzero(attacks.attacker_mask(0, 0.25, False, 4, 0))[0])
    client = srv.clients[attacker]
    start = srv.global_params.clone()
    w = start.clone().requires_grad_(True)
    for idx in client.batch_plan(0):  # one local epoch of SGD on the poisoned minibatches, by hand
        x, y = attacks.backdoor_batch(srv.args, client.data.inputs("train", idx), client.data.train_y[idx])
        logits = x.flatten(1) @ w[:192].view(4, 48).T + w[192:]
        (grad,) = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, y), w)
        w = (w - srv.args.local_learning_rate * grad).detach().requires_grad_(True)
    uploads = {u.index: u for u in srv.run_round(0, evaluate=False).updates}
    assert torch.allclose(uploads[attacker].params, start + (w.detach() - start) * 3.0, atol=1e-6)


def test_the_attack_success_rate_counts_other_classes_put_in_the_target():
    srv = backdoor_server()
    plugin = srv.plugin("attack")
    always = torch.zeros_like(srv.global_params)
    always[192 + 2] = 10.0  # bias of class 2: every image goes to the target
    assert plugin.attack_success_rate(always) == 1.0
    always[192 + 2], always[192 + 1] = 0.0, 10.0
    assert plugin.attack_success_rate(always) == 0.0
    srv.train(progress=False)  # one entry per evaluation, aligned with the accuracy's
    asr = srv.history.extra_series["backdoor_asr"]
    assert len(asr) == len(srv.history.test_acc) == 3 and all(0.0 <= a <= 1.0 for a in asr)


@pytest.mark.parametrize("flags, message", [
    (dict(backdoor_target=4), "--backdoor_target must be a class in 0..3"),
    (dict(backdoor_fraction=0.0), "--backdoor_fraction must be in \\(0, 1\\]"),
])
def test_bad_backdoors_are_refused_in_one_line(flags, message):
    with pytest.raises(FLError, match=message):
        backdoor_server(**flags)


def test_a_backdoor_needs_images():
    with pytest.raises(FLError, match="stamps a pixel trigger on images of at least 5x6 pixels"):
        server(attack="backdoor", attack_fraction=0.25)


# ----------------------------------------------------------------------------- DBA and model replacement
def dba_server(**flags):
    data = image_dataset([12] * 4, shape=(1, 5, 10), num_classes=4, seed=3)
    flags = {"batch_size": 10, "global_rounds": 2, "attack": "dba", "attack_fraction": 0.5, **flags}
    torch.manual_seed(0)
    return build_server(make_args("FedAvg", engine="sequential", num_clients=4, **flags), data, FlatLinear(50, 4))


def test_dbas_local_patterns_split_the_global_trigger_stamped_on_a_known_image():
    bars = [[(0, 0), (0, 1), (0, 2), (0, 3)], [(0, 6), (0, 7), (0, 8), (0, 9)],
            [(3, 0), (3, 1), (3, 2), (3, 3)], [(3, 6), (3, 7), (3, 8), (3, 9)]]
    assert [list(part) for part in attacks.DBA_PARTS] == bars
    image = torch.arange(50, dtype=torch.float32).view(1, 1, 5, 10) / 100  # a known image, not all zeros
    stamped = attacks.stamp_trigger(image, -0.5, attacks.DBA_TRIGGER)
    expected = image.clone()
    for row, col in sum(bars, []):
        expected[0, 0, row, col] = -0.5
    assert torch.equal(stamped, expected)
    # attacker k (by client index) of the round stamps bar k mod 4 only
    args = make_args("FedAvg", num_clients=8, attack="dba", attack_fraction=0.75)
    attackers = np.flatnonzero(attacks.attackers_of(args, 0)).tolist()
    assert len(attackers) == 6
    parts = [attacks.dba_part(args, c, RoundPackage(0, torch.zeros(1), list(range(8)))) for c in attackers]
    assert parts == [attacks.DBA_PARTS[k % 4] for k in range(6)]
    x, y = torch.zeros(10, 1, 5, 10), torch.zeros(10, dtype=torch.long)
    px, py = attacks.DATA_ATTACKS["dba"](args, x, y, 4, attackers[1], RoundPackage(0, torch.zeros(1), list(range(8))))
    local = torch.zeros(5, 10)
    local[0, 6:10] = 1.0
    assert py.tolist() == [2, 2, 2] + [0] * 7 and torch.equal(px[:3], local.expand(3, 1, 5, 10))
    assert not px[3:].any()


def test_a_dba_attacker_trains_on_its_own_local_pattern():
    srv = dba_server(backdoor_from_round=5)
    attacker = int(np.flatnonzero(attacks.attacker_mask(0, 0.5, False, 4, 0))[1])  # the second: bar 1
    client = srv.clients[attacker]
    start = srv.global_params.clone()
    w = start.clone().requires_grad_(True)
    for idx in client.batch_plan(0):
        x, y = attacks.backdoor_batch(srv.args, client.data.inputs("train", idx), client.data.train_y[idx],
                                      attacks.DBA_PARTS[1])
        logits = x.flatten(1) @ w[:200].view(4, 50).T + w[200:]
        (grad,) = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, y), w)
        w = (w - srv.args.local_learning_rate * grad).detach().requires_grad_(True)
    uploads = {u.index: u for u in srv.run_round(0, evaluate=False).updates}
    assert torch.allclose(uploads[attacker].params, w.detach(), atol=1e-6)  # round 0 < 5: not scaled


def test_dbas_success_rate_uses_the_global_trigger():
    srv = dba_server()
    plugin = srv.plugin("attack")
    detector = torch.zeros_like(srv.global_params)
    # class 2 fires when the 16 trigger pixels sum above 15.5: all of them white (value 1); one local bar
    # (4 white pixels, 12 standard normal ones) almost never does
    for row, col in attacks.DBA_TRIGGER:
        detector[2 * 50 + row * 10 + col] = 100.0
    detector[200 + 2] = -1550.0
    assert plugin.attack_success_rate(detector) == 1.0
    x = srv.dataset.split("test")[0]
    bar_only = attacks.stamp_trigger(x, 1.0, attacks.DBA_PARTS[0]).flatten(1) @ detector[100:150] - 1550
    assert float((bar_only > 0).float().mean()) < 0.1


def upload(index: int, samples: int, params: torch.Tensor) -> ClientUpdate:
    return ClientUpdate(index=index, num_samples=samples, num_steps=1, params=params, loss=0.0)


def test_model_replacement_scales_by_the_samples_over_the_attackers():
    updates = [upload(i, n, torch.zeros(2)) for i, n in enumerate([10, 20, 30, 40])]
    mask = np.array([False, True, False, True])
    assert attacks.replacement_scale(updates, mask) == 100 / 60
    # one attacker of n equal clients: the paper's n / eta with eta = 1
    equal = [upload(i, 5, torch.zeros(2)) for i in range(4)]
    assert attacks.replacement_scale(equal, np.array([False, False, True, False])) == 4.0


def test_model_replacement_replaces_the_global_model_under_fedavg():
    data = image_dataset([12, 12, 6, 10], shape=(1, 6, 8), num_classes=4, seed=3)
    torch.manual_seed(0)
    args = make_args("FedAvg", engine="sequential", num_clients=4, batch_size=10, global_rounds=1,
                     attack="model_replacement", attack_fraction=0.25, backdoor_from_round=0)
    srv = build_server(args, data, FlatLinear(48, 4))
    attacker = int(np.flatnonzero(attacks.attacker_mask(0, 0.25, False, 4, 0))[0])
    start = srv.global_params.clone()
    torch.manual_seed(0)
    plain = build_server(make_args("FedAvg", engine="sequential", num_clients=4, batch_size=10, global_rounds=1,
                                   attack="backdoor", attack_fraction=0.25, backdoor_from_round=99),
                         data, FlatLinear(48, 4))
    trained = {u.index: u.params for u in plain.run_round(0, evaluate=False).updates}  # X: unscaled
    uploads = {u.index: u for u in srv.run_round(0, evaluate=False).updates}
    gamma = 40 / data.clients[attacker].num_train
    assert torch.allclose(uploads[attacker].params, start + gamma * (trained[attacker] - start), atol=1e-6)
    # FedAvg of G + Γ(X − G) with benign uploads equal to G gives X exactly (by hand, on small vectors)
    g, x = torch.tensor([1.0, -2.0]), torch.tensor([3.0, 0.5])
    sizes = [12, 12, 6, 10]
    ups = [upload(i, n, g.clone()) for i, n in enumerate(sizes)]
    ups[2].params = g + attacks.replacement_scale(ups, np.array([False, False, True, False])) * (x - g)
    assert torch.allclose(sum(u.params * u.num_samples for u in ups) / sum(sizes), x)


def test_model_replacement_honours_a_given_scale():
    data = image_dataset([12] * 4, shape=(1, 6, 8), num_classes=4, seed=3)
    flags = dict(engine="sequential", num_clients=4, batch_size=10, global_rounds=1, attack_fraction=0.25,
                 backdoor_from_round=0)
    torch.manual_seed(0)
    fixed = build_server(make_args("FedAvg", attack="model_replacement", replacement_scale=3.0, **flags), data,
                         FlatLinear(48, 4))
    torch.manual_seed(0)
    boosted = build_server(make_args("FedAvg", attack="backdoor", backdoor_scale=3.0, **flags), data, FlatLinear(48, 4))
    a = {u.index: u.params for u in fixed.run_round(0, evaluate=False).updates}
    b = {u.index: u.params for u in boosted.run_round(0, evaluate=False).updates}
    assert all(torch.equal(a[i], b[i]) for i in a)  # a fixed Γ is the backdoor's boost


def test_dba_needs_images_wide_enough_for_its_bars():
    with pytest.raises(FLError, match="--attack dba stamps a pixel trigger on images of at least 4x10 pixels"):
        backdoor_server(attack="dba")
