"""``--eval_clients K``: a seeded sample of K clients at each evaluation, recorded in the history
and the h5 file; the metrics are those of the sampled clients (flcore/evaluation.py)."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from fltest import build_server, make_args, random_dataset, run_main_two_rounds
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from utils.seeding import numpy_rng

DATA = dict(num_clients=9, dim=4, num_classes=3, sizes=[6, 9, 12, 7, 10, 8, 11, 5, 13], seed=3)


def _run(algorithm: str = "FedAvg", **flags):
    server = build_server(make_args(algorithm, global_rounds=2, join_ratio=0.5, eval_auc=True, **flags),
                          random_dataset(**DATA))
    server.train(progress=False)
    return server


def test_each_evaluation_takes_the_sample_drawn_from_seed_and_round():
    server = _run(eval_clients=4, seed=5)
    samples = server.history.extra_series["eval_clients"]
    assert len(samples) == len(server.history.eval_rounds) == 3
    for rnd, sample in zip(server.history.eval_rounds, samples):
        expected = np.sort(numpy_rng(5, "eval_clients", rnd).choice(9, 4, replace=False))
        assert np.array_equal(sample, expected)
    assert len({tuple(s) for s in samples}) > 1  # a new sample each evaluation
    assert all(len(acc) == 4 for acc in server.history.client_acc)
    again = _run(eval_clients=4, seed=5)
    assert all(np.array_equal(a, b) for a, b in zip(samples, again.history.extra_series["eval_clients"]))
    assert again.history.test_acc == server.history.test_acc


def test_the_metrics_are_those_of_the_sampled_clients():
    server = _run(eval_clients=4)
    sample = server.history.extra_series["eval_clients"][-1]
    sampled = server.evaluate_models(server.eval_params)  # the last round's sample is still current
    server.evaluator.sample_size = 0
    server.evaluator.at_round(-1)
    every = server.evaluate_models(server.eval_params)
    assert server.evaluator.evaluated_clients() is None and len(every.client_acc) == 9
    correct = every.client_acc[sample] * every.client_test_samples[sample]
    assert sampled.test_acc == pytest.approx(correct.sum() / every.client_test_samples[sample].sum(), abs=1e-12)
    assert np.allclose(sampled.client_acc, every.client_acc[sample])
    assert sampled.test_acc == server.history.test_acc[-1]


def test_personalised_models_are_sampled_too():
    server = _run("FedPer", eval_clients=3)
    assert [len(s) for s in server.history.extra_series["eval_clients"]] == [3, 3, 3]


def test_a_sample_as_large_as_the_population_is_every_client():
    server = _run(eval_clients=9)
    assert "eval_clients" not in server.history.extra_series
    assert server.history.test_acc == _run().history.test_acc


def test_the_sample_is_saved_in_the_results_file_and_named_in_the_summary(tmp_path, capsys):
    path = run_main_two_rounds(tmp_path, "FedAvg", "--eval_clients", "2", "--seed", "7")
    with h5py.File(path) as f:
        saved = f["rs_eval_clients"][()]
        rounds = f["rs_eval_rounds"][()] if "rs_eval_rounds" in f else np.arange(len(saved))
    assert saved.shape == (3, 2)
    for rnd, row in zip(rounds, saved):
        assert np.array_equal(row, np.sort(numpy_rng(7, "eval_clients", int(rnd)).choice(4, 2, replace=False)))
    assert "evaluated: a seeded sample of 2 clients at each evaluation" in capsys.readouterr().out


def test_fedma_evaluates_its_matched_model_on_the_sample():
    from flcore.trainmodel.models import SplitModel
    from torch import nn
    torch_module = SplitModel(nn.Sequential(nn.Flatten(), nn.Linear(4, 6), nn.ReLU()), nn.Linear(6, 3))
    server = build_server(make_args("FedMA", global_rounds=2, join_ratio=0.5, batch_size=4, eval_clients=3, seed=5),
                          random_dataset(**DATA), torch_module)
    server.train(progress=False)
    samples = server.history.extra_series["eval_clients"]
    assert len(samples) == len(server.history.eval_rounds) == 3, "one sample recorded per evaluation"
    assert all(len(acc) == 3 for acc in server.history.client_acc), "the matched model is evaluated on the sample"
    assert np.array_equal(server.matched.evaluator.evaluated_clients(), samples[-1])


def test_left_unset_a_large_population_is_evaluated_on_a_sample(monkeypatch):
    """Without --eval_clients a population above ALL_CLIENTS_UP_TO is evaluated on DEFAULT_SAMPLE
    clients (both made small here), one at or below it whole; --eval_clients 0 asks for every client."""
    import flcore.evaluation as evaluation

    monkeypatch.setattr(evaluation, "DEFAULT_SAMPLE", 4)
    monkeypatch.setattr(evaluation, "ALL_CLIENTS_UP_TO", 9)
    assert "eval_clients" not in _run().history.extra_series  # 9 clients: every one
    monkeypatch.setattr(evaluation, "ALL_CLIENTS_UP_TO", 8)
    sampled = _run(seed=5)
    assert [len(s) for s in sampled.history.extra_series["eval_clients"]] == [4, 4, 4]
    assert sampled.history.test_acc == _run(eval_clients=4, seed=5).history.test_acc
    everyone = _run(eval_clients=0, seed=5)
    assert "eval_clients" not in everyone.history.extra_series
    monkeypatch.setattr(evaluation, "ALL_CLIENTS_UP_TO", 10_000)
    assert everyone.history.test_acc == _run(seed=5).history.test_acc
