"""Under an attack, a model that diverges is the measured outcome: the run is recorded as diverged
(from which round), exits 0 with one line, and the reports show it as collapsed; without an attack
divergence stays an error with the learning-rate advice."""
from __future__ import annotations

import numpy as np

import main
from reporting.grid import build_grid, cells_of, format_grid
from reporting.loading import find_all_runs
from reporting.stats import summarize_runs
from reporting.tables import format_summary_table
from toydata import make_dataset
from reporting.results import read_results

ATTACK = ["--attack", "sign_flip", "--attack_fraction", "0.34", "--attack_scale", "1e38"]


def run(folder, results, *flags):
    return main.main(["-data", str(folder), "--results_dir", str(results), "-dev", "cpu", "-m", "DNN", "-lbs", "4",
                      "-gr", "4", "--progress", "False", "--engine", "sequential", *flags])


def test_a_collapse_under_attack_is_recorded_as_diverged(tmp_path, capsys):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 8, 8))
    results = tmp_path / "res"
    assert run(folder, results, *ATTACK, "-go", "attacked") == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "collapsed" in line]
    assert len(lines) == 1 and "the model collapsed under --attack sign_flip" in lines[0], err
    assert "learning rate" not in err
    (path,) = results.glob("*_attacked_0.h5")
    h5 = read_results(path)
    collapsed = int(h5["attrs"]["diverged_round"])
    assert h5["attrs"]["finished"] and 0 <= collapsed < 4 and f"round {collapsed}:" in lines[0]
    assert np.isfinite(h5["rs_test_acc"]).all() and h5["rs_eval_rounds"].tolist() == list(range(collapsed + 1))
    assert path.with_suffix(".safetensors").exists()

    assert run(folder, results, "-go", "clean") == 0  # the same run without the attack, beside it
    runs = find_all_runs(results, [folder.name], ["FedAvg"])[folder.name]
    attacked = runs[("FedAvg", "attacked")]
    assert [r.diverged for r in attacked] == [True]
    table = format_summary_table([summarize_runs(attacked)], folder.name, "attacked")
    assert "collapsed" in table.splitlines()[1] and "1 of 1" in table
    grid = build_grid(cells_of([*attacked, *runs[("FedAvg", "clean")]], "attack", "robust"), "attack", "robust", "acc")
    assert "collapsed" in format_grid(grid)


def test_divergence_without_an_attack_is_still_an_error_with_advice(tmp_path, capsys):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 8, 8))
    assert run(folder, tmp_path / "res", "-lr", "1e30") == 2
    err = capsys.readouterr().err.strip()
    assert "lower the learning rate" in err and "collapsed" not in err


def test_record_divergence_makes_a_diverging_setting_the_runs_result(tmp_path, capsys):
    """--record_divergence: the same diverging run exits 0 with one line and a finished file that records
    the round, its accuracies those evaluated before it; the reports count it as collapsed."""
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 8, 8))
    results = tmp_path / "res"
    assert run(folder, results, "-lr", "1e30", "--record_divergence", "-go", "recorded") == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "--record_divergence" in line]
    assert len(lines) == 1 and "recorded as diverged from round" in lines[0] and "learning rate" not in err, err
    (path,) = results.glob("*_recorded_0.h5")
    h5 = read_results(path)
    diverged = int(h5["attrs"]["diverged_round"])
    assert h5["attrs"]["finished"] and 0 <= diverged < 4
    assert np.isfinite(h5["rs_test_acc"]).all() and h5["rs_eval_rounds"].tolist() == list(range(diverged + 1))
    (recorded,) = find_all_runs(results, [folder.name], ["FedAvg"])[folder.name][("FedAvg", "recorded")]
    assert recorded.diverged and "1 of 1" in format_summary_table([summarize_runs([recorded])], folder.name, "x")


def test_record_divergence_changes_nothing_in_a_run_that_does_not_diverge(tmp_path):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 8, 8))
    results = tmp_path / "res"
    assert run(folder, results, "-go", "plain") == 0
    assert run(folder, results, "--record_divergence", "-go", "flagged") == 0
    plain, flagged = (read_results(next(results.glob(f"*_{g}_0.h5"))) for g in ("plain", "flagged"))
    assert "diverged_round" not in flagged["attrs"]
    assert np.array_equal(plain["rs_test_acc"], flagged["rs_test_acc"])
