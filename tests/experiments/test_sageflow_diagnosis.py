"""experiments/sageflow_diagnosis.py: the row it runs is sageflow_mnist.py's Sageflow row plus the
diagnostics, and the numbers its report reads from results files (no training here)."""
import argparse
import sys

import h5py
import numpy as np
import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "experiments"))
import common  # noqa: E402
import sageflow_diagnosis as sd  # noqa: E402
import sageflow_mnist as sf  # noqa: E402
from flcore.registry import load_all  # noqa: E402
import main  # noqa: E402


def test_the_row_is_sageflow_mnists_with_the_diagnostics_added():
    load_all()
    algo, flags = sd.sageflow_row(150, 0)
    _, sf_algo, sf_flags = next(row for row in sf.variants("stragglers", 0.1, halving=0) if row[0] == "Sageflow")
    assert algo == sf_algo == "Sageflow"
    assert flags == ["-jr", "0.2", *sf.public(150), *sf_flags, "--sageflow_diagnostics", "True"]
    args = main.parse_args(["-algo", algo, "-m", "CNN", *flags])
    assert args.sageflow_diagnostics is True and args.sageflow_gamma_halving == 0 and args.straggler_delay == 2


def test_damped_ignoring_drops_the_late_uploads_and_damps_fedavgs_fresh_mean():
    load_all()
    algo, flags = sd.sageflow_row(150, 15, damped_ignoring=0.5)
    args = main.parse_args(["-algo", algo, "-m", "CNN", *flags])
    assert (args.straggler_policy, args.sageflow_eth, args.sageflow_delta) == ("ignore", float("inf"), 0.0)
    assert (args.sageflow_gamma, args.sageflow_gamma_halving, args.sageflow_diagnostics) == (0.5, 15, True)
    named = argparse.Namespace(dataset="MNIST", samples=150, local_epochs=5, rounds=40, damped_ignoring=0.5)
    assert sd.experiment_name(named, 15) == "sageflow_diagnosis_MNIST_150s_E5_40r_ignoring_gamma0.5"
    named.damped_ignoring = 0.0
    assert sd.experiment_name(named, 0) == "sageflow_diagnosis_MNIST_150s_E5_40r_gamma_halving0"


def fake_run(path, next_acc, fresh_acc, curve_rounds, curve):
    rounds = len(next_acc)
    with h5py.File(path, "w") as f:
        for name in sd.SERIES:
            f.create_dataset("rs_sageflow_" + name, data=np.full(rounds, 0.5))
        del f["rs_sageflow_next_acc"], f["rs_sageflow_fresh_only_acc"]
        f.create_dataset("rs_sageflow_next_acc", data=np.asarray(next_acc))
        f.create_dataset("rs_sageflow_fresh_only_acc", data=np.asarray(fresh_acc))
        f.create_dataset("rs_staleness", data=np.array([[0, 0, np.nan], [0, 1, 2], [1, 2, 2], [0, 2, 1]])[:rounds])
        f.create_dataset("rs_test_acc", data=np.asarray(curve))
        f.create_dataset("rs_eval_rounds", data=np.asarray(curve_rounds))


def test_the_report_reads_each_seed_and_counts_the_rounds_the_fresh_only_model_wins(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(common, "OUT", tmp_path)
    args = argparse.Namespace(seeds=[0, 1], every=2, dataset="MNIST", samples=150, local_epochs=5, damped_ignoring=0.0)
    for seed, fresh in ((0, [0.6, 0.5, 0.8, 0.7]), (1, [0.5, 0.7, 0.8, 0.9])):
        folder = common.results_folder("diag", sd.label_of(seed))
        folder.mkdir(parents=True)
        # w_(t+1) is evaluated after round t: the curve at rounds 0, 2 and 4 holds next_acc[1] and [3]
        fake_run(folder / "run_0.h5", [0.5, 0.6, 0.7, 0.8], fresh, [0, 2, 4], [0.1, 0.6, 0.8])
    sd.report(args, "diag", halving=2)
    table = (tmp_path / "diag.md").read_text()
    assert table == capsys.readouterr().out
    rows = {line.split(" | ")[0].strip("| "): line.strip("|").split(" | ") for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| round") and not line.startswith("| rounds")}
    assert sorted(rows) == ["0", "0-0", "1-1", "2", "2-2", "3-3"]  # every 2nd round, then one-round windows
    # round 0: f − Sageflow is +10 and 0 points; round 2: +10 and +10
    assert rows["0"][1:4] == ["50.00 ± 0.00", "55.00 ± 5.00", "5.00 ± 5.00"]
    assert rows["2"][1:4] == ["70.00 ± 0.00", "80.00 ± 0.00", "10.00 ± 0.00"]
    assert [c.strip() for c in rows["2"][-2:]] == ["0.5", "0.0/1.0/2.0"]  # γ halved at round 2; the staleness mix
    assert [c.strip() for c in rows["0"][-2:]] == ["1", "2.0/0.0/0.0"]
    # f better / worse / level over both seeds, window by window
    assert [rows[w][2] for w in ("0-0", "1-1", "2-2", "3-3")] == ["1 / 0 / 1", "1 / 1 / 0", "2 / 0 / 0", "1 / 1 / 0"]


def test_a_curve_that_is_not_the_diagnostics_next_model_is_reported(tmp_path):
    path = tmp_path / "run.h5"
    fake_run(path, [0.5, 0.6], [0.5, 0.5], [0, 2], [0.1, 0.7])  # round 2 is w_2 = next_acc[1] = 0.6, not 0.7
    with pytest.raises(SystemExit, match="round 2"):
        sd.check_curve(0, sd.read_seed(path))
