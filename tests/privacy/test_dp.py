"""Differential privacy (``-dp``, DP-FedAvg): accounting against opacus, clipping measured, the
no-noise limits equal the non-private runs, noise drawn from (seed, round, client), engines agree,
and what is refused is refused with one line."""
from __future__ import annotations

import math
import sys

import h5py
import numpy as np
import pytest
import torch

pytest.importorskip("opacus", reason="the DP accountant needs opacus (requirements.txt pins it)")
from opacus.accountants import PRVAccountant, RDPAccountant  # noqa: E402

import main  # noqa: E402
from fltest import (assert_same_training, build_server, engine_run, image_dataset, make_args,  # noqa: E402
                    random_dataset, run_main_two_rounds, run_round)
from fltest import notices, one_thread  # noqa: E402,F401  (fixtures)
from flcore.clients.clientbase import Client  # noqa: E402
from flcore.flat import FlatModel  # noqa: E402
from flcore.features.privacy import accounting  # noqa: E402
from flcore.features.privacy.dpsgd import clip_factors, per_sample_gradients  # noqa: E402
from flcore.registry import MODELS  # noqa: E402
from toydata import make_dataset  # noqa: E402
from utils.errors import FLError  # noqa: E402
from utils.seeding import torch_generator  # noqa: E402


def opacus_epsilon(cls, sigma: float, q: float, steps: int, delta: float) -> float:
    """opacus's accountant as its users call it: one ``step`` per optimiser step."""
    accountant = cls()
    for _ in range(steps):
        accountant.step(noise_multiplier=sigma, sample_rate=q)
    return accountant.get_epsilon(delta=delta)


def dp_data():
    return random_dataset(num_clients=4, dim=6, num_classes=3, sizes=[20, 35, 12, 41], seed=3)


def dp_server(data=None, algorithm="FedAvg", *extra, **flags):
    settings = dict(batch_size=5, local_learning_rate=0.1, global_rounds=3, eval_auc=False, save_model=False)
    settings.update(flags)
    return build_server(make_args(algorithm, *extra, **settings), data or dp_data())


# ------------------------------------------------------------------------------ accounting
@pytest.mark.parametrize("q, sigma, steps, delta", [(0.01, 1.0, 500, 1e-5), (0.2, 0.7, 37, 1e-4), (1.0, 2.0, 10, 1e-5)])
def test_rdp_epsilon_equals_opacus_called_directly(q, sigma, steps, delta):
    ours = accounting.epsilon("rdp", sigma, [(q, steps)], delta)
    assert ours == opacus_epsilon(RDPAccountant, sigma, q, steps, delta)
    assert 0 < ours < math.inf


def test_prv_epsilon_equals_opacus_called_directly():
    ours = accounting.epsilon("prv", 1.0, [(0.05, 60)], 1e-5)
    assert ours == pytest.approx(opacus_epsilon(PRVAccountant, 1.0, 0.05, 60, 1e-5), rel=1e-9)


def test_epsilon_grows_with_steps_and_sampling_rate_and_falls_with_noise():
    eps = lambda q, n, s=1.0: accounting.epsilon("rdp", s, [(q, n)], 1e-5)  # noqa: E731
    assert eps(0.1, 10) < eps(0.1, 100) < eps(0.1, 1000)
    assert eps(0.01, 100) < eps(0.05, 100) < eps(0.2, 100)
    assert eps(0.1, 100, 2.0) < eps(0.1, 100, 1.0) < eps(0.1, 100, 0.5)
    assert eps(0.1, 0) == 0.0 and eps(0.1, 10, 0.0) == math.inf


def test_worst_client_front_equals_the_maximum_over_every_client():
    clients = [(0.5, 4), (0.1, 40), (0.25, 8), (0.1, 10), (0.5, 2), (0.05, 80), (0.3, 0)]
    # each client's ε as accounting.epsilon gives it (equal to opacus's, tested above)
    brute = max(accounting.epsilon("rdp", 0.9, [(q, n)], 1e-5) for q, n in clients if n)
    cache: dict = {}
    assert accounting.worst_client_epsilon("rdp", 0.9, 1e-5, clients, cache) == brute
    assert set(cache) == {(0.5, 4), (0.25, 8), (0.1, 40), (0.05, 80)}  # dominated pairs are never evaluated


def test_recorded_epsilon_is_the_worst_clients_and_grows_every_round():
    server = dp_server(None, "FedAvg", "-dp", "-dps", "1.1", global_rounds=4, join_ratio=0.5)
    server.train(progress=False)
    series = server.history.extra_series["dp_epsilon"]
    # the worst client's ε never falls, and rises in every round where a worst-placed client trains
    assert len(series) == 4 and all(a <= b for a, b in zip(series, series[1:])) and series[0] < series[-1]
    # each client's steps counted independently: participations x floor(n / B) (one epoch, --drop_last)
    per_client = [(min(1.0, 5 / c.num_train), c.participations * (c.num_train // 5)) for c in server.clients]
    assert [c.dp_steps for c in server.clients] == [n for _, n in per_client]
    worst = max(per_client, key=lambda c: accounting.epsilon("rdp", 1.1, [c], 1e-5))
    assert series[-1] == opacus_epsilon(RDPAccountant, 1.1, *worst, 1e-5)


def test_dp_fedavg_epsilon_accounts_rounds_at_cohort_rate():
    server = dp_server(None, "FedAvg", global_rounds=3, join_ratio=0.5, dp_update_clip=1.0, dp_server_sigma=1.3)
    server.train(progress=False)
    series = server.history.extra_series["dp_user_epsilon"]
    assert series == [opacus_epsilon(RDPAccountant, 1.3, 0.5, t, 1e-5) for t in (1, 2, 3)]


# ------------------------------------------------------------------------------ the DP-SGD step
def test_per_sample_gradients_are_each_samples_own_and_clipping_bounds_their_norms():
    data = image_dataset([12], shape=(1, 28, 28))
    torch.manual_seed(0)
    model = FlatModel(MODELS.get("CNN")(data.input_shape, data.num_classes, None))
    client = Client(0, data.clients[0], make_args("FedAvg"), None)
    x, y = data.clients[0].train_x[:6], data.clients[0].train_y[:6]
    grads, _ = per_sample_gradients(client, model, x, y, {})
    for i in range(6):  # by hand: one backward per sample
        model.zero_grad()
        client.local_loss(model.net, x[i:i + 1], y[i:i + 1], {}).backward()
        assert torch.allclose(grads[i], model.grad, atol=1e-6, rtol=1e-5)
    clip = 0.5 * float(grads.norm(dim=1).median())
    clipped = clip_factors(grads, clip)[:, None] * grads
    norms = clipped.norm(dim=1)
    assert bool((norms <= clip * (1 + 1e-5)).all())
    assert bool((norms >= clip * 0.999).any())  # some were clipped, to the bound


def test_dp_step_is_the_mean_of_clipped_per_sample_gradients_plus_the_seeded_noise():
    data = random_dataset(num_clients=1, dim=4, num_classes=3, sizes=[10], seed=5)
    server = dp_server(data, "FedAvg", "-dp", "-dps", "0.8", dp_clip=0.3, dp_sampling="shuffle", batch_size=5)
    client, model = server.clients[0], server.model
    idx = torch.tensor([0, 3, 4, 7, 9])
    x, y = data.clients[0].train_x[idx], data.clients[0].train_y[idx]
    want = torch.zeros(model.num_params)
    for i in range(5):
        model.zero_grad()
        client.local_loss(model.net, x[i:i + 1], y[i:i + 1], {}).backward()
        want += model.grad * min(1.0, 0.3 / (float(model.grad.norm()) + 1e-6))
    noise = torch.randn(model.num_params, generator=torch_generator(0, "dp", 7, client.cid, 2))
    want = (want + 0.8 * 0.3 * noise) / 5
    client.step_gradient(model, idx, {}, server.package(7, [client.index]), 2)
    assert torch.allclose(model.grad, want, atol=1e-6, rtol=1e-5)


def test_poisson_batches_come_from_seed_round_client_with_rate_b_over_n():
    server = dp_server(None, "FedAvg", "-dp", "-dps", "1")
    client = server.clients[3]  # 41 samples, B = 5: 8 steps per epoch, q = 5/41
    plan = client.batch_plan(4)
    again = client.batch_plan(4)
    assert len(plan) == 41 // 5 and all(torch.equal(a, b) for a, b in zip(plan, again))
    assert not all(torch.equal(a, b) for a, b in zip(plan, client.batch_plan(5)))
    sizes = [len(b) for b in plan]
    assert len(set(sizes)) > 1  # variable batch sizes: independent inclusion
    draws = torch.cat([torch.cat(client.batch_plan(t)) for t in range(200)])
    assert abs(draws.numel() / (200 * 8 * 41) - 5 / 41) < 0.01  # empirical inclusion rate ≈ q


# ------------------------------------------------------------------------------ no-noise limits
def test_sigma_zero_and_huge_clip_reproduce_the_non_dp_run_exactly(tmp_path):
    plain = run_main_two_rounds(tmp_path / "plain", "FedAvg")
    dp = run_main_two_rounds(tmp_path / "dp", "FedAvg", "-dp", "--dp_clip", "1e9", "--dp_sampling", "shuffle")
    with h5py.File(plain) as a, h5py.File(dp) as b:
        for key in ("rs_test_acc", "rs_test_auc", "rs_train_loss", "rs_client_acc", "rs_test_acc_std"):
            assert np.array_equal(a[key][()], b[key][()]), key
        assert list(b["rs_dp_epsilon"][()]) == [math.inf, math.inf]  # no noise: no guarantee
        assert "rs_dp_epsilon" not in a


def test_dp_fedavg_with_huge_clip_and_no_noise_is_fedavg():
    data = dp_data()
    ref = dp_server(data, "FedAvg")
    ref.train(progress=False)
    dp = dp_server(data, "FedAvg", dp_update_clip=1e9)
    dp.train(progress=False)
    assert torch.allclose(ref.global_params, dp.global_params, atol=1e-6, rtol=1e-5)
    assert dp.history.extra_series["dp_user_epsilon"] == [math.inf] * 3


def test_dp_fedavg_round_by_hand():
    data = dp_data()
    server = dp_server(data, "FedAvg", join_ratio=0.5, dp_update_clip=0.05, dp_server_sigma=0.7, dp_weight_cap=30)
    start = server.global_params.clone()
    result = server.run_round(0, evaluate=False)
    n = [c.num_train for c in data.clients]
    weights = [min(k / 30, 1.0) for k in n]
    total = torch.zeros_like(start)
    for update in result.updates:
        delta = update.params - start
        total += weights[update.index] * delta * min(1.0, 0.05 / float(delta.norm()))
    noise = torch.randn(start.shape, generator=torch_generator(0, "dp-server", 0))
    want = start + (total + 0.7 * 0.05 * noise) / (len(result.cohort) / 4 * sum(weights))
    assert torch.allclose(server.global_params, want, atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------ reproducibility
def test_noise_depends_only_on_seed_round_and_client():
    flags = ("-dp", "-dps", "1.0")
    one = dp_server(None, "FedAvg", *flags)
    alone = run_round(one, 2, cohort=[1]).updates[0]
    two = dp_server(None, "FedAvg", *flags)
    with_others = run_round(two, 2, cohort=[0, 1, 3]).updates[1]
    assert torch.equal(alone.params, with_others.params)
    other_seed = dp_server(None, "FedAvg", *flags, seed=1)
    assert not torch.equal(alone.params, run_round(other_seed, 2, cohort=[1]).updates[0].params)
    later = dp_server(None, "FedAvg", *flags)
    assert not torch.equal(alone.params, run_round(later, 3, cohort=[1]).updates[0].params)


# ------------------------------------------------------------------------------ engines
@pytest.mark.parametrize("algo", ["FedAvg", "FedProx", "SCAFFOLD"])
def test_threaded_engine_gives_the_sequential_numbers_with_dp(algo):
    flags = dict(privacy=True, dp_sigma=1.0, dp_clip=0.5, dp_update_clip=0.5, dp_server_sigma=0.5)
    if algo == "SCAFFOLD":
        del flags["dp_update_clip"], flags["dp_server_sigma"]  # SCAFFOLD aggregates its own way
    ref = engine_run(algo, "sequential", **flags)
    out = engine_run(algo, "threaded", workers=2, **flags)
    assert out.engine.stats["threaded_clients"] > 0
    assert_same_training(ref, out, exact=True)
    for name in ("dp_epsilon", "dp_user_epsilon"):
        assert ref.history.extra_series.get(name) == out.history.extra_series.get(name)


def test_batched_engine_declines_dp_with_one_notice_and_matches(notices):
    ref = engine_run("FedAvg", "sequential", privacy=True, dp_sigma=1.0)
    out = engine_run("FedAvg", "batched", privacy=True, dp_sigma=1.0)
    assert_same_training(ref, out, exact=True)
    lines = [r.getMessage() for r in notices if "DP-SGD" in r.getMessage()]
    assert len(lines) == 1 and "trained sequentially" in lines[0]


# ------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("algo, flags, words", [
    ("MOON", ("-dp",), "overrides local_loss"),
    ("Ditto", ("-dp",), "overrides train_job"),
    ("FedAvgM", ("--dp_update_clip", "1"), "aggregates its own way"),
    ("SCAFFOLD", ("--dp_update_clip", "1"), "aggregates its own way"),
])
def test_algorithms_that_do_not_compose_are_refused(algo, flags, words):
    with pytest.raises(FLError, match=words):
        build_server(make_args(algo, *flags), random_dataset(num_clients=3))


def test_models_without_per_sample_gradients_are_refused():
    data = image_dataset([8, 8])
    args = make_args("FedAvg", "-dp")
    torch.manual_seed(0)
    with pytest.raises(FLError, match="BatchNorm or dropout"):
        build_server(args, data, MODELS.get("CNN-BN")(data.input_shape, data.num_classes, args))


@pytest.mark.parametrize("flags, words", [
    (["-dps", "1"], "needs -dp"),
    (["--dp_server_sigma", "1"], "needs --dp_update_clip"),
    (["-dp", "--dp_clip", "0"], "--dp_clip must be a finite number > 0"),
    (["-dp", "--dp_clip", "inf"], "--dp_clip must be a finite number > 0"),
    (["-dp", "--dp_delta", "1"], "--dp_delta must be in (0, 1)"),
    (["-dp", "-dps", "-1"], "-dps must be a finite number >= 0"),
    (["--dp_update_clip", "nan"], "--dp_update_clip must be a finite number >= 0"),
    (["-dp", "--dp_accountant", "gdp"], "invalid choice"),
])
def test_bad_settings_are_one_line_and_exit_2(tmp_path, capsys, flags, words):
    folder = make_dataset(tmp_path, num_clients=2, input_shape=(1, 8, 8))
    try:
        status = main.main(["-data", str(folder), "-dev", "cpu", "-gr", "1", "-m", "DNN", "-q", *flags])
    except SystemExit as stop:  # argparse's own errors (a bad choice) exit from the parser
        status = stop.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err


def test_missing_opacus_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "opacus.accountants", None)  # `import` of it now fails
    with pytest.raises(FLError, match="pip install opacus"):
        dp_server(None, "FedAvg", "-dp")


def test_main_records_and_prints_epsilon(tmp_path, capsys):
    path = run_main_two_rounds(tmp_path, "FedAvg", "-dp", "-dps", "1.0", "--dp_update_clip", "2",
                               "--dp_server_sigma", "1")
    out = capsys.readouterr().out
    with h5py.File(path) as f:
        eps, user = f["rs_dp_epsilon"][()], f["rs_dp_user_epsilon"][()]
        assert len(eps) == 2 and 0 < eps[0] < eps[1] < math.inf and 0 < user[0] < user[1]
        assert f.attrs["dp_epsilon"] == eps[-1] and f.attrs["dp_delta"] == 1e-5
    assert f"privacy (sample-level DP-SGD): epsilon {eps[-1]:.3f} at delta 1e-05" in out
    assert f"privacy (user-level DP-FedAvg): epsilon {user[-1]:.3f} at delta 1e-05" in out


# ------------------------------------------------------------------------------ checkpoint and resume
def test_resume_of_a_dp_run_is_exact(tmp_path, monkeypatch):
    """Each client's step count and DP-FedAvg's round rates are restored: ε and the model go on as
    if the run had never stopped."""
    from test_resume import interrupted_and_resumed, read

    data = make_dataset(tmp_path / "data", num_clients=4, input_shape=(1, 8, 8), train_sizes=[24, 31, 18, 40])
    flags = ("-dp", "-dps", "1.0", "--dp_update_clip", "1", "--dp_server_sigma", "0.5")
    _, resumed = interrupted_and_resumed(data, tmp_path, monkeypatch, "FedAvg", *flags)
    assert len(read(resumed)[0]["rs_dp_epsilon"]) == 4
