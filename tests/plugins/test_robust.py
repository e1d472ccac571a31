"""Robust aggregation (flcore/features/robust.py): each rule against a hand computation on small
vectors, the reduction to FedAvg, filtering's precision/recall, exact resume, and the one-line
refusals."""
from __future__ import annotations

import math

import pytest
import torch

import main
from fltest import build_server, make_args, random_dataset, run_round
from fltest import one_thread  # noqa: F401  (fixture)
from flcore.features import robust
from toydata import make_dataset
from runner import checkpoint
from utils.errors import FLError


def rows(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).reshape(len(values), -1)


# ----------------------------------------------------------------------------- the rules by hand
def test_krum_scores_and_choice_by_hand():
    points = rows(0.0, 1.0, 3.0, 10.0)
    # f = 0: each point sums its n - f - 2 = 2 nearest squared distances
    # 0: {1, 9, 100} -> 1 + 9; 1: {1, 4, 81} -> 1 + 4; 3: {9, 4, 49} -> 4 + 9; 10: {100, 81, 49} -> 49 + 81
    assert robust.krum_scores(points, 0).tolist() == [10.0, 5.0, 13.0, 130.0]
    assert robust.krum_order(points, 0) == [1, 0, 2, 3]
    # f = 1: one nearest each: 1, 1, 4, 49
    assert robust.krum_scores(points, 1).tolist() == [1.0, 1.0, 4.0, 49.0]
    assert robust.krum_order(points, 1)[:2] == [0, 1]  # a tie keeps upload order


def test_trimmed_mean_and_median_by_hand():
    points = rows([1.0, 10.0], [2.0, -4.0], [3.0, 0.0], [100.0, 2.0], [-50.0, 1.0])
    # column 0 sorted: -50 1 2 3 100 -> trim 1 each side -> mean(1, 2, 3) = 2; column 1: -4 0 1 2 10 -> 1
    assert robust.trimmed_mean(points, 1).tolist() == [2.0, 1.0]
    assert robust.coordinate_median(points).tolist() == [2.0, 1.0]
    assert robust.coordinate_median(rows(1.0, 4.0, 2.0, 3.0)).tolist() == [2.5]  # even n: the two middle values


def test_the_median_of_identical_updates_is_the_update():
    update = torch.randn(50, generator=torch.Generator().manual_seed(3))
    assert torch.equal(robust.coordinate_median(update.repeat(5, 1)), update)
    assert torch.equal(robust.trimmed_mean(update.repeat(5, 1), 2), update)


def test_weiszfeld_reaches_the_weighted_median_and_its_fixed_point():
    # on a line the geometric median is the weighted median: a point holding 0.6 of the weight
    weights = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    median = robust.geometric_median(rows(0.0, 1.0, 2.0), weights, iters=200)
    assert abs(float(median) - 2.0) < 1e-5  # Weiszfeld stops once the objective gains < 1e-6 relative
    # in the plane: no point of a fine grid does better than the iteration's result
    cloud = torch.randn(7, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    even = torch.full((7,), 1 / 7, dtype=torch.float64)
    z = robust.geometric_median(cloud, even, iters=500)
    axis = torch.linspace(-3, 3, 601, dtype=torch.float64)
    grid = torch.cartesian_prod(axis, axis)
    best = float((torch.cdist(grid, cloud) * even).sum(1).min())
    objective = lambda p: float(((cloud - p).norm(dim=1) * even).sum())  # noqa: E731
    assert objective(z) <= best + 1e-6
    # 10 iterations (the default) already improve on the mean's objective
    assert objective(robust.geometric_median(cloud, even, iters=10)) < objective(cloud.mean(0))


def test_bulyan_selects_by_repeated_krum_then_averages_around_the_median():
    points = rows(0.0, 1.0, 2.0, 3.0, 4.0, 50.0, 1000.0)  # n = 7 = 4f + 3 with f = 1
    # round 1 (4 neighbours): 2 scores 1+1+4+4; round 2 (3): 1 and 3 tie at 1+4+9, 1 is earlier;
    # round 3 (2): 3 scores 1+9; round 4 (1): 0 and 4 tie at 16; round 5 (no neighbour left): 4
    assert robust.bulyan_selection(points, 1) == [2, 1, 3, 0, 4]
    value, chosen = robust.bulyan(points, 1)
    # beta = 5 - 2 = 3 chosen values closest to their median 2: 2, 1, 3
    assert chosen == [2, 1, 3, 0, 4] and value.tolist() == [2.0]


def test_clipping_and_centered_clipping_by_hand():
    assert robust.clip_norms(rows([3.0, 4.0], [0.3, 0.4]), 1.0).flatten().tolist() == pytest.approx([0.6, 0.8, 0.3, 0.4])
    points, weights = rows([2.0, 0.0], [0.0, 0.5]), torch.tensor([0.5, 0.5], dtype=torch.float64)
    # v = 0 + 0.5 (2, 0) min(1, 1/2) + 0.5 (0, 0.5) min(1, 1/0.5)
    once = robust.centered_clip(points, weights, torch.zeros(2, dtype=torch.float64), tau=1.0, iters=1)
    assert once.tolist() == pytest.approx([0.5, 0.25])
    # a radius no update reaches: the weighted mean
    far = robust.centered_clip(points, weights, torch.zeros(2, dtype=torch.float64), tau=1e9, iters=1)
    assert far.tolist() == pytest.approx([1.0, 0.25])


def test_the_defence_list_is_parsed_and_checked():
    assert robust.parse_robust("clip,multi_krum") == (["clip"], "multi_krum")
    assert robust.parse_robust("clip") == (["clip"], "mean")
    assert robust.parse_robust("median") == ([], "median")
    with pytest.raises(FLError, match="unknown defence 'krumm'"):
        robust.parse_robust("clip,krumm")
    with pytest.raises(FLError, match="krum is an aggregator; name the pre-steps first"):
        robust.parse_robust("krum,median")
    assert robust.parse_robust("clip+fltrust") == (["clip"], "fltrust")  # a sweep axis cannot hold commas


def test_fltrust_trust_scores_by_hand():
    root = rows([1.0, 0.0])  # g0 = (1, 0), norm 1
    points = rows([2.0, 0.0], [0.0, 3.0], [-1.0, 1.0], [1.0, 1.0])
    aggregate, trust = robust.fltrust(points, root[0])
    # cosines 1, 0, -1/sqrt 2, 1/sqrt 2; ReLU: 1, 0, 0, 1/sqrt 2
    s = 1 / math.sqrt(2)
    assert trust.tolist() == pytest.approx([1.0, 0.0, 0.0, s])
    # rescaled to norm 1: (1, 0) and (s, s); weighted by trust over the trust sum
    expected = [(1.0 + s * s) / (1 + s), (s * s) / (1 + s)]
    assert aggregate.tolist() == pytest.approx(expected)
    # no upload trusted: no update
    none, zero = robust.fltrust(rows([-1.0, 0.0], [0.0, 2.0]), root[0])
    assert none.tolist() == [0.0, 0.0] and zero.tolist() == [0.0, 0.0]


def test_fltrust_of_identical_honest_updates_is_their_direction_at_the_root_norm():
    update = torch.randn(20, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    root = update * 0.3 + torch.randn(20, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 0.01
    aggregate, trust = robust.fltrust(update.repeat(5, 1), root)
    assert bool((trust > 0).all())
    assert torch.allclose(aggregate, update / update.norm() * root.norm())


# ----------------------------------------------------------------------------- on a server
def server(*extra, clients: int = 8, **flags):
    data = random_dataset(num_clients=clients, dim=4, num_classes=3, seed=1)
    flags = {"batch_size": 4, "global_rounds": 2, **flags}  # every client takes steps (-lbs <= 8 samples)
    return build_server(make_args("FedAvg", *extra, engine="sequential", num_clients=clients, **flags), data)


def test_no_attackers_and_the_mean_aggregator_are_fedavg_bit_for_bit():
    plain = server()
    defended = server(robust="mean", attack="sign_flip", attack_fraction=0.0)
    assert defended.plugin("robust").takes_aggregation
    for rnd in range(2):
        run_round(plain, rnd)
        run_round(defended, rnd)
        assert torch.equal(plain.global_params, defended.global_params)


def test_multi_krum_keeping_everyone_is_the_mean_of_the_updates():
    plain = server()
    defended = server(robust="multi_krum", robust_keep=8, robust_f=0)
    run_round(plain, 0)
    run_round(defended, 0)
    assert torch.allclose(plain.global_params, defended.global_params, atol=1e-6)


def test_krum_moves_the_model_to_the_chosen_update():
    defended = server(robust="krum", robust_f=1)
    start = defended.global_params.clone()
    result = defended.run_round(0, evaluate=False)
    deltas = torch.stack([u.params - start for u in result.updates])
    chosen = robust.krum_order(deltas, 1)[0]
    assert torch.equal(defended.global_params, start + deltas[chosen])
    assert defended.plugin("robust")._filtered[0] == [(result.updates[chosen].index, 0)]


def test_the_aggregate_is_the_rule_applied_to_the_updates():
    defended = server(robust="clip,median", robust_clip=0.05)
    start = defended.global_params.clone()
    result = defended.run_round(0, evaluate=False)
    deltas = torch.stack([u.params - start for u in result.updates])
    expected = start + robust.coordinate_median(robust.clip_norms(deltas, 0.05))
    assert torch.allclose(defended.global_params, expected, atol=1e-7)


def test_filtering_defences_record_precision_and_recall_of_the_attackers_left_out():
    defended = server(robust="multi_krum", attack="sign_flip", attack_fraction=0.25, attack_scale=50)
    defended.train(progress=False)
    series = defended.history.extra_series
    assert series["attack_uploads"][0] == 2
    # the two attackers' updates are 50 times as long and point the other way: both left out, nothing else
    assert series["robust_precision"] == [1.0] * len(series["attack_uploads"])
    assert series["robust_recall"] == [1.0] * len(series["attack_uploads"])


def test_fltrust_on_a_server_trains_the_root_data_like_a_client_and_aggregates_by_trust():
    from fltest import gradient_descent
    defended = server(robust="fltrust", public_data=0.1, local_epochs=2, batch_size=16)
    public = defended.dataset.public
    assert len(public) == 15  # <= -lbs: one full batch per epoch, so shuffling does not matter
    start = defended.global_params.clone()
    result = defended.run_round(0, evaluate=False)
    root = gradient_descent(start.double(), public.x.double(), public.y, 3, steps=2,
                            lr=defended.args.local_learning_rate) - start.double()
    deltas = torch.stack([u.params - start for u in result.updates])
    aggregate, _ = robust.fltrust(deltas, root.float())
    assert torch.allclose(defended.global_params, start + aggregate, atol=1e-6)


def test_fltrust_filters_and_records_precision_and_recall():
    data = random_dataset(num_clients=8, dim=4, num_classes=3, sizes=[24] * 8, seed=1)
    concept = torch.randn(4, 3, generator=torch.Generator().manual_seed(9))  # one labelling rule for all
    for client in data.clients:
        client.train_y.copy_((client.train_x @ concept).argmax(1))
        client.test_y.copy_((client.test_x @ concept).argmax(1))
    args = make_args("FedAvg", engine="sequential", num_clients=8, batch_size=4, global_rounds=2, robust="fltrust",
                     public_data=0.1, attack="sign_flip", attack_fraction=0.25, attack_scale=5)
    defended = build_server(args, data)
    defended.train(progress=False)
    series = defended.history.extra_series
    # a sign-flipped update points against the honest ones, so against the root update: trust 0
    assert series["robust_recall"] == [1.0] * len(series["attack_uploads"])
    assert all(p == 1.0 or math.isnan(p) for p in series["robust_precision"])


def test_centered_clipping_resumes_exactly_from_its_checkpointed_center():
    whole = server(robust="centered_clip", robust_iters=2)
    for rnd in range(3):
        run_round(whole, rnd)
    first = server(robust="centered_clip", robust_iters=2)
    run_round(first, 0)
    saved = checkpoint.server_state(first, 1)
    resumed = server(robust="centered_clip", robust_iters=2)
    assert checkpoint.load_server_state(resumed, saved) == 1
    assert torch.equal(resumed.plugin("robust").center, first.plugin("robust").center)
    for rnd in (1, 2):
        run_round(resumed, rnd)
    assert torch.equal(resumed.global_params, whole.global_params)


def test_a_round_with_too_few_uploads_uses_the_largest_f_they_admit(caplog):
    defended = server(robust="krum", robust_f=2)  # 8 uploads admit f = 2 (8 > 6)
    plugin = defended.plugin("robust")
    assert plugin.admissible_f(8, 0) == 2 and plugin.admissible_f(6, 1) == 1
    with pytest.raises(FLError, match="needs n > 2f \\+ 2 uploads, and only 2 arrived"):
        plugin.admissible_f(2, 2)


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("flags, message", [
    (dict(robust="krum", robust_f=3), "krum needs n > 2f \\+ 2 uploads for f = 3 attackers, but a round has n = 8"),
    (dict(robust="bulyan", attack="ipm", attack_fraction=0.25), "bulyan needs n >= 4f \\+ 3 uploads for f = 2"),
    (dict(robust="trimmed_mean", robust_f=4), "trimmed_mean needs n > 2f uploads for f = 4"),
    (dict(robust="geomed"), "unknown defence 'geomed'"),
    (dict(robust="rfa", robust_iters=0), "--robust_iters must be >= 1"),
    (dict(robust="clip,fltrust"), "--robust fltrust needs a public dataset held by the server: pass --public_data"),
])
def test_bad_defences_are_refused_in_one_line(flags, message):
    with pytest.raises(FLError, match=message):
        server(**flags)


def test_dp_fedavg_and_a_defence_exclude_each_other():
    pytest.importorskip("opacus", reason="the privacy plug-in needs opacus (requirements.txt pins it)")
    with pytest.raises(FLError, match="replace the aggregation and exclude each other: privacy, robust"):
        server(robust="median", dp_update_clip=1.0)


def test_an_algorithm_that_aggregates_its_own_way_is_refused():
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=1)
    with pytest.raises(FLError, match="FedAvgM aggregates its own way"):
        build_server(make_args("FedAvgM", robust="median", num_clients=4), data)


@pytest.mark.parametrize("flags, message", [
    (["--robust", "krum", "--robust_f", "1"], "krum needs n > 2f + 2 uploads for f = 1"),
    (["--robust", "fltrust"], "--robust fltrust needs a public dataset held by the server: pass --public_data 0.02"),
])
def test_main_exits_with_status_2_and_one_line(tmp_path, capsys, flags, message):
    folder = make_dataset(tmp_path, num_clients=4, input_shape=(1, 8, 8))
    rc = main.main(["-data", str(folder), "--results_dir", str(tmp_path / "res"), "-dev", "cpu", "-gr", "1",
                    "-m", "DNN", *flags, "--progress", "False", "-q", "True"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0]
    assert not list((tmp_path / "res").glob("*.h5"))


def test_every_rule_gives_a_finite_model_with_an_attack_on():
    for name in robust.AGGREGATORS:
        more = {"public_data": 0.1} if name == "fltrust" else {}
        defended = server(robust=f"clip,{name}", attack="alie", attack_fraction=0.125, robust_f=1, **more)
        run_round(defended, 0)
        assert math.isfinite(float(defended.global_params.sum())), name


def test_a_late_upload_is_judged_by_the_round_it_was_trained_in():
    """With attackers drawn anew each round and uploads arriving late, an upload counts as an attacker's
    by the round it was trained (and poisoned) in, not by the round it reaches the server (as Sageflow's
    filter counts it)."""
    from flcore.features.attacks import attacker_mask
    from flcore.features.stragglers import delay_of
    defended = server(robust="multi_krum", attack="sign_flip", attack_fraction=0.25, attack_scale=50,
                      attack_resample=True, straggler_delay=1, global_rounds=6, clients=16)
    robust_plugin = defended.plugin("robust")
    late_and_judged_otherwise = 0
    for rnd in range(6):
        run_round(defended, rnd)
        if robust_plugin._filtered is None:
            continue
        kept, dropped = robust_plugin._filtered
        for client, trained in kept + dropped:  # arrival = training round + its drawn delay (no waiting)
            assert trained + delay_of(0, 1, trained, client) == rnd
            if trained != rnd:
                late_and_judged_otherwise += bool(attacker_mask(0, 0.25, True, 16, trained)[client]
                                                  != attacker_mask(0, 0.25, True, 16, rnd)[client])
        caught = sum(bool(attacker_mask(0, 0.25, True, 16, trained)[client]) for client, trained in dropped)
        present = caught + sum(bool(attacker_mask(0, 0.25, True, 16, trained)[client]) for client, trained in kept)
        series = defended.history.extra_series
        assert series["robust_precision"][-1] == pytest.approx(caught / len(dropped), nan_ok=True)
        assert series["robust_recall"][-1] == (pytest.approx(caught / present) if present else pytest.approx(math.nan, nan_ok=True))
    assert late_and_judged_otherwise > 0  # the case this test is about occurred
