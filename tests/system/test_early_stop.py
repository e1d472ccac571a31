"""A run that stops early evaluates the model it stops with and says why: FLChain's stopping rule and
-ab both end with the evaluation a run of exactly that many training rounds ends with."""
from __future__ import annotations

import numpy as np

import main
from toydata import make_dataset
from reporting.results import read_results


def run(folder, results, *flags):
    code = main.main(["-data", str(folder), "--results_dir", str(results), "-dev", "cpu", "-m", "DNN", "-lbs", "4",
                      "--progress", "False", "--save_model", "False", "--engine", "sequential", *flags])
    assert code == 0
    (path,) = results.glob("*.h5")
    return read_results(path)


def test_flchain_stopping_rule_evaluates_the_model_it_stops_with(tmp_path, capsys):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 8, 8))
    stopped = run(folder, tmp_path / "stopped", "-algo", "FLChain", "-gr", "5", "--flchain_epsilon", "1e9")
    out = capsys.readouterr()
    one = run(folder, tmp_path / "one", "-algo", "FLChain", "-gr", "1")
    assert stopped["rs_eval_rounds"].tolist() == [0, 1] == one["rs_eval_rounds"].tolist()
    np.testing.assert_array_equal(stopped["rs_test_acc"], one["rs_test_acc"])  # the trained model is scored
    assert stopped["attrs"]["early_stop"].startswith("stopped after round 0: FLChain's stopping rule")
    assert "early_stop" not in one["attrs"]
    assert "stopped after round 0: FLChain's stopping rule" in out.out + out.err


def test_auto_break_evaluates_the_model_it_stops_with(tmp_path):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 8, 8))
    stopped = run(folder, tmp_path / "stopped", "-gr", "30", "-ab", "-tc", "1", "-lr", "0.5")
    reason = stopped["attrs"]["early_stop"]
    assert "auto-break (-ab)" in reason
    last = int(stopped["rs_eval_rounds"][-1])
    assert last < 30 and reason.startswith(f"stopped after round {last - 1}:")
    exact = run(folder, tmp_path / "exact", "-gr", str(last), "-lr", "0.5")
    assert exact["rs_eval_rounds"].tolist() == stopped["rs_eval_rounds"].tolist()
    np.testing.assert_array_equal(stopped["rs_test_acc"], exact["rs_test_acc"])
