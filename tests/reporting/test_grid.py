"""The attack × defence heatmaps (reporting/grid.py, ``plot.py --grid``) from tiny result files
with known final values, and the virtual-time-to-target column."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import plot
from resultfiles import write_ours
from reporting.grid import build_grid, cells_of, format_grid, parse_grid_flags
from reporting.loading import PlotError, load_algorithm_runs, load_run
from reporting.stats import summarize_runs


def write_cell(folder: Path, attack: str | None, robust: str | None, run: int, acc: list[float],
               asr: list[float] | None = None, lr: float = 0.05) -> Path:
    """One run of a sweep's setting, with the goal sweep.py gives it."""
    goal = "grid" + "".join(f"-{k}={v}" for k, v in (("attack", attack), ("robust", robust)) if v)
    config = {"dataset": "MNIST", "algorithm": "FedAvg", "goal": goal, "seed": run, "attack": attack,
              "robust": robust, "local_learning_rate": lr}
    extra = {"rs_backdoor_asr": asr} if asr is not None else None
    return write_ours(folder, "MNIST", "FedAvg", goal, run, acc, extra_series=extra,
                      attrs={"config": json.dumps(config)})


def cells_in(table: str) -> dict[str, list[str]]:
    """A printed grid's rows: the row label's cells (after the title and the header line)."""
    return {line.split()[0]: line.split()[1:] for line in table.strip().splitlines()[2:]}


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    folder = tmp_path / "results"
    folder.mkdir()
    write_cell(folder, None, None, 0, [0.1, 0.9])
    write_cell(folder, None, "median", 0, [0.1, 0.8])
    write_cell(folder, "sign_flip", None, 0, [0.1, 0.2])
    write_cell(folder, "sign_flip", None, 1, [0.1, 0.4])  # two repeats: their mean
    write_cell(folder, "sign_flip", "median", 0, [0.1, 0.7])
    write_cell(folder, "backdoor", None, 0, [0.1, 0.85], asr=[0.0, 0.9])
    write_cell(folder, "backdoor", "median", 0, [0.1, 0.75], asr=[0.0, 0.25])
    write_ours(folder, "MNIST", "FedAvg", "other", 0, [0.5, 0.5])  # another goal: not in the grid
    return folder


def test_the_grid_by_hand(sweep: Path) -> None:
    runs = [load_run(path) for path in sorted(sweep.glob("MNIST_FedAvg_grid*.h5"))]
    cells = cells_of(runs, "attack", "robust")
    acc = build_grid(cells, "attack", "robust", "acc")
    assert acc.rows == ["none", "backdoor", "sign_flip"] and acc.cols == ["none", "median"]
    expected = np.array([[0.9, 0.8], [0.85, 0.75], [0.3, 0.7]])
    assert np.allclose(acc.values, expected) and acc.counts.tolist() == [[1, 1], [1, 1], [2, 1]]
    asr = build_grid(cells, "attack", "robust", "asr")
    assert asr.counts.tolist() == [[0, 0], [1, 1], [0, 0]] and np.allclose(asr.values[1], [0.9, 0.25])
    assert np.isnan(asr.values[0, 0])
    assert cells_in(format_grid(asr)) == {"none": ["–", "–"], "backdoor": ["90.00", "25.00"], "sign_flip": ["–", "–"]}


def test_plot_grid_draws_both_heatmaps_and_prints_the_tables(sweep: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    rc = plot.main(["-data", "MNIST", "-algo", "FedAvg", "-go", "grid", "--grid", "attack,robust",
                    "--results_dir", str(sweep), "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    for metric in ("acc", "asr"):
        png = out / f"MNIST_grid_FedAvg_grid_{metric}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and str(png) in printed
    assert cells_in(printed.split("\n\n")[0])["sign_flip"] == ["30.00", "70.00"]  # the repeats' 20% and 40%


@pytest.mark.parametrize("flags, message", [
    (["--grid", "attack"], "give two different flags as ROWS,COLUMNS"),
    (["--grid", "attack,nosuchflag"], "no run stores the flag 'nosuchflag'"),
    (["--grid", "attack,robust", "-go", "nothing"], "no results for FedAvg on MNIST with goal nothing"),
])
def test_bad_grids_are_one_line(sweep: Path, capsys, flags, message) -> None:
    rc = plot.main(["-data", "MNIST", "-algo", "FedAvg", "-go", "grid", "--results_dir", str(sweep), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0]


def test_a_cell_mixing_settings_is_refused(sweep: Path, capsys) -> None:
    write_cell(sweep, "sign_flip", "median", 1, [0.1, 0.5], lr=0.1)
    rc = plot.main(["-data", "MNIST", "-algo", "FedAvg", "-go", "grid", "--grid", "attack,robust",
                    "--results_dir", str(sweep)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "cell attack=sign_flip, robust=median: its 2 runs differ in local_learning_rate" in err[0]
    with pytest.raises(PlotError):
        parse_grid_flags("attack,attack")


def test_virtual_time_to_the_target(tmp_path: Path) -> None:
    write_ours(tmp_path, "MNIST", "FedAsync", "test", 0, [0.1, 0.5, 0.9],
               extra_series={"rs_virtual_time": [3.0, 7.0]})
    row = summarize_runs(load_algorithm_runs(tmp_path, "MNIST", "FedAsync", "test"), target_acc=0.5)
    assert row.stats["virtual_to_target"].mean == 3.0  # reached at round 1: the clock after round 0
    never = summarize_runs(load_algorithm_runs(tmp_path, "MNIST", "FedAsync", "test"), target_acc=0.95)
    assert never.stats["virtual_to_target"].count == 0


# ------------------------------------------- the flags as sweep.py spells them, ranks per attack
@pytest.fixture
def lr_sweep(tmp_path: Path) -> Path:
    """A learning rate × defence sweep under one attack: final accuracy 0.1 + 10·lr (+0.2 for median)."""
    folder = tmp_path / "lr"
    folder.mkdir()
    for lr in (0.01, 0.05):
        for robust, bonus in ((None, 0.0), ("median", 0.2)):
            goal = f"grid-lr={lr}" + (f"-robust={robust}" if robust else "")
            config = {"dataset": "MNIST", "algorithm": "FedAvg", "goal": goal, "seed": 0, "attack": "sign_flip",
                      "robust": robust, "local_learning_rate": lr}
            write_ours(folder, "MNIST", "FedAvg", goal, 0, [0.1, 0.1 + 10 * lr + bonus],
                       attrs={"config": json.dumps(config)})
    return folder


@pytest.mark.parametrize("spelling", ["lr", "-lr", "local_learning_rate", "--local-learning-rate"])
def test_the_grid_takes_the_spellings_sweep_takes(lr_sweep: Path, tmp_path: Path, capsys, spelling: str) -> None:
    rc = plot.main(["-data", "MNIST", "-algo", "FedAvg", "-go", "grid", f"--grid={spelling},robust",
                    "--results_dir", str(lr_sweep), "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert cells_in(out.split("\n\n")[0]) == {"0.01": ["20.00", "40.00"], "0.05": ["60.00", "80.00"]}
    assert out.splitlines()[1].startswith("local_learning_rate \\ robust")


def test_two_spellings_of_one_flag_are_not_a_grid(lr_sweep: Path, capsys) -> None:
    assert plot.main(["-data", "MNIST", "-algo", "FedAvg", "-go", "grid", "--grid", "lr,local_learning_rate",
                      "--results_dir", str(lr_sweep)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "are one flag (local_learning_rate)" in err


def test_the_sweeps_best_setting_is_chosen_within_each_attack(tmp_path: Path, capsys) -> None:
    """sign_flip's best defence scores below gaussian's worst: ranking across attacks would keep
    one gaussian row; within each attack there is one row per attack, each its attack's best."""
    import sweep
    from toydata import make_dataset

    data = make_dataset(tmp_path / "data", num_clients=4, input_shape=(4,))
    results = tmp_path / "results"
    own, jobs = sweep.plan(["-data", str(data), "-m", "MLR", "--attack_fraction", "0.25", "--results_dir",
                            str(results), "-go", "g", "--grid", "attack=sign_flip,gaussian",
                            "robust=median,trimmed_mean"])
    finals = {("sign_flip", "median"): 0.4, ("sign_flip", "trimmed_mean"): 0.3,
              ("gaussian", "median"): 0.7, ("gaussian", "trimmed_mean"): 0.9}
    results.mkdir()
    for job in jobs:
        key = (job.settings["attack"], job.settings["robust"])
        config = {k: v for k, v in job.settings.items() if k in ("dataset", "algorithm", "goal", "attack", "robust")}
        write_ours(results, "Toy", "FedAvg", job.settings["goal"], job.run, [0.1, finals[key]],
                   attrs={"config": json.dumps(config)})
    sweep.print_summary(jobs, own.goal, "final")
    out = capsys.readouterr().out
    head, best = out.split("Best setting per algorithm and attack (highest mean final accuracy):\n")
    rows = [line for line in best.splitlines() if line.startswith("FedAvg")]
    assert len(rows) == 2, best
    assert "attack=sign_flip robust=median" in rows[0] + rows[1] and "attack=gaussian robust=trimmed_mean" in best
    assert "trimmed_mean" not in [r for r in rows if "sign_flip" in r][0]
