"""AdaFL (arXiv:2108.05765): score updates, the fraction schedule, the reduction to uniform
sampling, the distance hook, and two-round runs through ``main`` (alone and composed)."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import main
from flcore.registry import ALGORITHMS, load_all
from flcore.selectors.adafl import attention_update, clients_for_fraction, scheduled_fraction
from fltest import build_server, make_args, random_dataset, run_main_two_rounds, run_round
from toydata import make_dataset


# ------------------------------------------------------------------ score update
def test_mass_rule_matches_spec_example():
    new = attention_update(np.full(4, 0.25), [0, 1], [1.0, 3.0], beta=0.5, rule="mass")
    np.testing.assert_allclose(new, [0.1875, 0.3125, 0.25, 0.25], rtol=0, atol=1e-12)
    assert new.sum() == pytest.approx(1.0, abs=1e-15)
    assert new[2] == 0.25 and new[3] == 0.25  # unselected: bitwise unchanged


def test_renorm_rule_matches_spec_example():
    new = attention_update(np.full(4, 0.25), [0, 1], [1.0, 3.0], beta=0.5, rule="renorm")
    np.testing.assert_allclose(new, [0.2, 0.4, 0.2, 0.2], rtol=0, atol=1e-12)
    assert new.sum() == pytest.approx(1.0, abs=1e-15)


def test_random_updates_stay_a_probability_vector():
    rng = np.random.default_rng(3)
    scores = rng.dirichlet(np.ones(10))
    for _ in range(50):
        chosen = rng.choice(10, size=4, replace=False)
        new = attention_update(scores, chosen, rng.random(4) * 5, beta=0.3, rule="mass")
        others = np.setdiff1d(np.arange(10), chosen)
        assert new.sum() == pytest.approx(1.0, abs=1e-12)
        assert (new > 0).all()
        np.testing.assert_array_equal(new[others], scores[others])
        # the selected set keeps its mass; a larger distance gets a larger share
        assert new[chosen].sum() == pytest.approx(scores[chosen].sum(), abs=1e-12)
        scores = new


def test_zero_distances_and_floor():
    scores = np.array([0.5, 0.3, 0.2])
    np.testing.assert_array_equal(attention_update(scores, [0, 1], [0.0, 0.0], 0.5), scores)
    # β = 0 with a zero distance would give probability 0; the floor keeps it drawable
    new = attention_update(scores, [0, 1], [0.0, 2.0], beta=0.0, min_prob=1e-12)
    assert new[0] >= 1e-12 * 0.99 and new.sum() == pytest.approx(1.0)


# ------------------------------------------------------------- fraction schedule
def test_fraction_schedule_paper_rounds():
    # Paper round r (1-indexed) is our round t = r - 1 and uses C_r.
    expected = {1: 0.1, 200: 0.1, 201: 0.2, 400: 0.2, 401: 0.3, 801: 0.5, 1500: 0.5}
    for paper_round, frac in expected.items():
        got = scheduled_fraction(paper_round - 1, 0.1, 0.5, 5, 200)
        assert got == pytest.approx(frac, abs=1e-12), paper_round
        assert clients_for_fraction(got, 100) == round(frac * 100)
    assert scheduled_fraction(700, 0.1, 0.5, 5, 200) == pytest.approx(0.4)
    assert scheduled_fraction(10, 0.2, 0.2, 1, 5) == 0.2  # one fraction: constant
    # cumulative uploads to round 423 equal the paper's 6690 (spec §3)
    assert sum(clients_for_fraction(scheduled_fraction(t, 0.1, 0.5, 5, 200), 100) for t in range(423)) == 6690
    assert clients_for_fraction(0.01, 6) == 1


def test_selector_uses_schedule_and_records_series():
    data = random_dataset(num_clients=10, dim=3, sizes=[8] * 10)
    args = make_args("AdaFL", "--adafl_frac_step", "2", "--adafl_frac_start", "0.2", "--adafl_frac_end", "0.6",
                     "--adafl_num_fracs", "3", batch_size=4)
    server = build_server(args, data)
    sizes = [len(run_round(server, t)[0]) for t in range(6)]
    assert sizes == [2, 2, 4, 4, 6, 6]
    fr = server.history.extra_series["join_fraction"]
    np.testing.assert_allclose(fr, [0.2, 0.2, 0.4, 0.4, 0.6, 0.6])
    probs = np.asarray(server.history.extra_series["selection_probs"])
    assert probs.shape == (6, 10)
    np.testing.assert_allclose(probs.sum(1), 1.0)
    np.testing.assert_allclose(probs[0], 0.1)  # balanced data: n_k / n = 1/K


def test_initial_scores_follow_dataset_sizes():
    data = random_dataset(num_clients=3, dim=3, sizes=[10, 20, 70])
    server = build_server(make_args("AdaFL"), data)
    np.testing.assert_allclose(server.selector.probabilities(), [0.1, 0.2, 0.7])


# ------------------------------------------------------------------ reduction
@pytest.mark.parametrize("extra", [[], ["-rjr", "True"]])
def test_attention_and_dynamic_off_is_uniform_selection(extra):
    data = random_dataset(num_clients=9, dim=3)
    common = ["-jr", "0.34", "--seed", "5", *extra]
    uniform = build_server(make_args("FedAvg", *common), data)
    adafl = build_server(make_args("FedAvg", "--select", "adafl", "--adafl_attention", "False",
                                   "--adafl_dynamic", "False", *common), data)
    for t in range(5):
        c_uni, _, u_uni = run_round(uniform, t)
        c_ada, _, u_ada = run_round(adafl, t)
        assert c_uni == c_ada
        assert torch.equal(uniform.global_params, adafl.global_params)
    np.testing.assert_allclose(adafl.history.extra_series["selection_probs"][0], 1 / 9)


def test_dynamic_only_is_uniform_draw_of_scheduled_size():
    data = random_dataset(num_clients=10, dim=3)
    args = make_args("FedAvg", "--select", "adafl", "--adafl_attention", "False", "--adafl_frac_step", "1")
    server = build_server(args, data)
    reference = build_server(make_args("FedAvg", "--seed", "0"), data)
    for t in range(3):
        cohort = server.select_clients(t)
        reference.args.join_ratio = [0.1, 0.2, 0.3][t]
        assert cohort == reference.select_clients(t)


def test_attention_only_keeps_jr_and_adapts_scores():
    data = random_dataset(num_clients=8, dim=3, sizes=[12] * 8)
    # (With two equal-size clients the new global model is their midpoint, so both distances are
    # equal and the scores cannot move: use four.)
    server = build_server(make_args("AdaFL", "-jr", "0.5", "--adafl_dynamic", "False", batch_size=4), data)
    for t in range(3):
        assert len(run_round(server, t)[0]) == 4
    probs = np.asarray(server.history.extra_series["selection_probs"])
    np.testing.assert_allclose(server.history.extra_series["join_fraction"], 0.5)
    assert np.abs(probs[-1] - probs[0]).max() > 1e-3


def test_draw_with_replacement_gives_distinct_sorted_cohort():
    data = random_dataset(num_clients=6, dim=3)
    server = build_server(make_args("AdaFL", "--adafl_replace", "True", "--adafl_frac_start", "1.0",
                                    "--adafl_frac_end", "1.0"), data)
    server.selector.scores = np.array([0.9, 0.02, 0.02, 0.02, 0.02, 0.02])
    cohort = server.select_clients(0)
    assert cohort == sorted(set(cohort)) and 0 in cohort and len(cohort) < 6


# --------------------------------------------------------------- distance hook
@pytest.mark.parametrize("ref", ["new_global", "sent_global"])
def test_observe_uses_distance_to_reference_model(ref):
    data = random_dataset(num_clients=5, dim=3, sizes=[12] * 5)
    args = make_args("AdaFL", "--adafl_frac_start", "0.6", "--adafl_frac_end", "0.6", "--adafl_dist_ref", ref,
                     "--adafl_beta", "0.25", batch_size=4)
    server = build_server(args, data)
    before = server.selector.probabilities()
    sent = server.global_params.clone()
    cohort, package, updates = run_round(server, 0)
    assert len(cohort) == 3
    reference = server.global_params if ref == "new_global" else sent
    d = np.array([float((u.params.double() - reference.double()).norm()) for u in updates])
    want = attention_update(before, cohort, d, 0.25, "mass")
    after = server.selector.probabilities()
    np.testing.assert_allclose(after, want, rtol=0, atol=1e-12)
    others = [k for k in range(5) if k not in cohort]
    np.testing.assert_array_equal(after[others], before[others])
    assert after.sum() == pytest.approx(1.0)


def test_dropped_uploads_count_as_unselected():
    data = random_dataset(num_clients=6, dim=3, sizes=[12] * 6)
    args = make_args("AdaFL", "-cdr", "0.5", "--adafl_frac_start", "1.0", "--adafl_frac_end", "1.0", batch_size=4)
    server = build_server(args, data)
    before = server.selector.probabilities()
    cohort, _, updates = run_round(server, 0)
    received = {u.index for u in updates}
    assert len(cohort) == 6 and 0 < len(received) < 6
    after = server.selector.probabilities()
    for k in set(cohort) - received:
        assert after[k] == before[k]
    assert after[sorted(received)].sum() == pytest.approx(before[sorted(received)].sum())


# ------------------------------------------------------------------ main runs
def _run_main(tmp_path, algo, *extra):
    path = run_main_two_rounds(tmp_path, algo, "--target_acc", "0.0", "--adafl_frac_step", "1",
                               "--adafl_frac_start", "0.3", "--adafl_frac_end", "0.5", "--adafl_num_fracs", "3",
                               *extra, num_clients=6)
    with h5py.File(path, "r") as f:
        probs = f["rs_selection_probs"][()]
        frac = f["rs_join_fraction"][()]
        attrs = dict(f.attrs)
        clients = f["rs_clients_per_round"][()]
    assert probs.shape == (2, 6)
    np.testing.assert_allclose(probs.sum(1), 1.0)
    np.testing.assert_allclose(frac, [0.3, 0.4])
    assert list(clients) == [2, 2]  # round(0.3*6)=2, round(0.4*6)=2 (half up: 2.4 -> 2)
    assert attrs["rounds_to_target"] == 0
    assert attrs["uploads_to_target"] == 0
    assert "bytes_up_to_target" in attrs
    return attrs


def test_main_adafl_two_rounds(tmp_path):
    attrs = _run_main(tmp_path, "AdaFL")
    assert attrs["algorithm"] == "AdaFL"


def test_main_fedavg_select_adafl(tmp_path):
    attrs = _run_main(tmp_path, "FedAvg", "--select", "adafl")
    assert '"select": "adafl"' in attrs["config"]


@pytest.mark.parametrize("algo, extra", [("FedProx", ["-mu", "0.01"]), ("SCAFFOLD", [])])
def test_main_composes_with_other_algorithms(tmp_path, algo, extra):
    load_all()
    if algo not in ALGORITHMS:
        pytest.skip(f"{algo} not registered yet")
    attrs = _run_main(tmp_path, algo, "--select", "adafl", *extra)
    assert attrs["algorithm"] == algo


def test_bad_flags_are_reported(tmp_path, capsys):
    root = tmp_path / "data"
    make_dataset(root, num_clients=4, input_shape=(1, 8, 8))
    argv = ["-data", str(root / "Toy"), "-m", "DNN", "-algo", "AdaFL", "-dev", "cpu", "-gr", "1", "-q", "True",
            "--results_dir", str(tmp_path), "--adafl_frac_start", "0.6", "--adafl_frac_end", "0.2"]
    assert main.main(argv) == 2
    assert "--adafl_frac_start" in capsys.readouterr().err
