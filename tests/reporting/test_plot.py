"""Tests of the plotting CLI (``system/plot.py``) and its helpers (``system/reporting/``).

Small ``.h5`` files are written in both layouts: this platform's (extra series and attributes)
and PFLlib's (only ``rs_test_acc``, ``rs_test_auc``, ``rs_train_loss``).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import plot
from resultfiles import write_pfllib
from reporting.cli import default_results_dir
from reporting.loading import PlotError, ResultFileError, load_algorithm_runs, load_run
from reporting.names import find_runs, parse_result_name
from reporting.plots import draw_metric
from reporting.series import METRICS, group_runs, mean_std, metric_groups, moving_average
from reporting.stats import summarize_runs

SYSTEM = Path(__file__).resolve().parents[2] / "system"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Three runs of FedAvg with known values; run 2 is one evaluation longer than the others.
FEDAVG_ACC = [
    [0.10, 0.50, 0.70, 0.80],
    [0.20, 0.40, 0.60, 0.90],
    [0.30, 0.60, 0.80, 0.70, 0.95],
]


def write_ours(folder: Path, dataset: str, algo: str, goal: str, run: int, acc: list[float],
               eval_gap: int = 1, round_time: float = 0.5, personalized: bool | None = False) -> Path:
    """A result file as this platform writes it (extra series and attributes); ``personalized``
    None leaves that attribute out, as files written before it existed."""
    acc_arr = np.asarray(acc, dtype=float)
    n = acc_arr.size
    rounds = (n - 1) * eval_gap + 1
    path = folder / f"{dataset}_{algo}_{goal}_{run}.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("rs_test_acc", data=acc_arr)
        handle.create_dataset("rs_test_auc", data=np.clip(acc_arr + 0.05, 0, 1))
        handle.create_dataset("rs_train_loss", data=2.0 - acc_arr)
        handle.create_dataset("rs_eval_rounds", data=np.arange(n, dtype=np.int64) * eval_gap)
        handle.create_dataset("rs_round_time", data=np.full(rounds, round_time))
        handle.create_dataset("rs_test_acc_std", data=np.full(n, 0.01))
        handle.create_dataset("rs_client_acc", data=np.tile(acc_arr[:, None], (1, 4)))
        handle.create_dataset("rs_bytes_up", data=np.full(rounds, 1000.0))
        handle.create_dataset("rs_bytes_down", data=np.full(rounds, 2000.0))
        handle.attrs.update({
            "algorithm": algo, "dataset": dataset, "goal": goal, "run": run, "seed": run,
            "config": json.dumps({"dataset": dataset, "algorithm": algo, "eval_gap": eval_gap}),
            "peak_rss_mb": 123.4,
        })
        if personalized is not None:
            handle.attrs["personalized"] = personalized
    return path


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A results folder with 3 FedAvg runs (ours) and 2 FedProx runs (PFLlib layout)."""
    folder = tmp_path / "results"
    folder.mkdir()
    for run, acc in enumerate(FEDAVG_ACC):
        write_ours(folder, "MNIST", "FedAvg", "test", run, acc, eval_gap=2)
    write_pfllib(folder, "MNIST", "FedProx", "test", 0, [0.1, 0.3, 0.5, 0.6])
    write_pfllib(folder, "MNIST", "FedProx", "test", 1, [0.2, 0.4, 0.6, 0.7])
    return folder


def assert_png(path: Path) -> None:
    assert path.is_file(), path
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5000, path


# ------------------------------------------------------------------------------------ helpers

def test_parse_result_name() -> None:
    assert parse_result_name("MNIST_IGFL-S_test_x_12.h5") == ("MNIST", "IGFL-S", "test_x", 12)
    assert parse_result_name("MNIST_FedAvg_test_0.h5") == ("MNIST", "FedAvg", "test", 0)
    assert parse_result_name("MNIST_test_acc.png") is None
    assert parse_result_name("MNIST_FedAvg_test.h5") is None


def test_find_runs_matches_exactly(tmp_path: Path) -> None:
    for run in (10, 2, 0):
        write_pfllib(tmp_path, "MNIST", "FedAvg", "test", run, [0.1])
    write_pfllib(tmp_path, "MNIST", "FedAvg-S", "test", 0, [0.1])
    write_pfllib(tmp_path, "MNIST", "FedAvg", "test_long", 0, [0.1])
    write_pfllib(tmp_path, "Cifar10", "FedAvg", "test", 0, [0.1])
    names = [p.name for p in find_runs(tmp_path, "MNIST", "FedAvg", "test")]
    assert names == ["MNIST_FedAvg_test_0.h5", "MNIST_FedAvg_test_2.h5", "MNIST_FedAvg_test_10.h5"]
    assert [p.name for p in find_runs(tmp_path, "MNIST", "FedAvg", "test_long")] == [
        "MNIST_FedAvg_test_long_0.h5"]
    assert find_runs(tmp_path / "nowhere", "MNIST", "FedAvg", "test") == []


def test_load_both_formats(results: Path) -> None:
    ours = load_run(results / "MNIST_FedAvg_test_1.h5")
    assert not ours.is_pfllib_format
    assert (ours.dataset, ours.algorithm, ours.goal, ours.run) == ("MNIST", "FedAvg", "test", 1)
    assert ours.eval_rounds.tolist() == [0, 2, 4, 6]
    assert ours.config["eval_gap"] == 2
    # Evaluation at round r comes after rounds 0..r-1 (0.5 s each).
    assert ours.elapsed_at_evals().tolist() == [0.0, 1.0, 2.0, 3.0]

    pfl = load_run(results / "MNIST_FedProx_test_1.h5")
    assert pfl.is_pfllib_format
    assert (pfl.dataset, pfl.algorithm, pfl.goal, pfl.run) == ("MNIST", "FedProx", "test", 1)
    assert pfl.eval_rounds.tolist() == [0, 1, 2, 3]
    assert pfl.get("rs_round_time") is None and pfl.elapsed_at_evals() is None


def test_attributes_win_over_file_name(tmp_path: Path) -> None:
    path = write_ours(tmp_path, "MNIST", "FedAvg", "test", 0, [0.1, 0.2])
    with h5py.File(path, "a") as handle:
        handle.attrs["run"] = 7
    assert load_run(path).run == 7
    with h5py.File(path, "a") as handle:
        handle.attrs["algorithm"] = "FedProx"
    notes: list[str] = []
    assert load_algorithm_runs(tmp_path, "MNIST", "FedAvg", "test", note=notes.append) == []
    assert len(notes) == 1 and "FedProx" in notes[0]


def test_moving_average() -> None:
    np.testing.assert_allclose(moving_average(np.array([1.0, 3.0, 5.0, 7.0]), 2), [1, 2, 4, 6])
    np.testing.assert_allclose(moving_average(np.array([1.0, 3.0]), 1), [1, 3])


def test_mean_std_truncates_and_uses_population_std() -> None:
    mean, std, length = mean_std([np.array(a) for a in FEDAVG_ACC])
    assert length == 4
    np.testing.assert_allclose(mean, [0.2, 0.5, 0.7, 0.8])
    # Population std (ddof=0) of {0.1, 0.2, 0.3} etc.
    np.testing.assert_allclose(std, [np.sqrt(2 / 300), np.sqrt(2 / 300), np.sqrt(2 / 300),
                                     np.sqrt(2 / 300)])


def test_group_runs_three_runs(results: Path) -> None:
    runs = load_algorithm_runs(results, "MNIST", "FedAvg", "test")
    notes: list[str] = []
    group = group_runs(runs, METRICS["acc"], note=notes.append)
    truncated = np.array([a[:4] for a in FEDAVG_ACC])
    assert group.n_runs == 3 and group.label == "FedAvg (3 runs)"
    assert group.truncated and group.lengths == [4, 4, 5]
    np.testing.assert_allclose(group.x, [0, 2, 4, 6])
    np.testing.assert_allclose(group.mean, 100 * truncated.mean(axis=0))
    np.testing.assert_allclose(group.std, 100 * truncated.std(axis=0, ddof=0))
    assert any("truncated" in n for n in notes)

    loss = group_runs(runs, METRICS["loss"])
    np.testing.assert_allclose(loss.mean, (2.0 - truncated).mean(axis=0))

    by_time = group_runs(runs, METRICS["acc"], x_mode="time")
    np.testing.assert_allclose(by_time.x, [0.0, 1.0, 2.0, 3.0])

    # Training round i produces the model the accuracy curve shows at round i + 1: the time of
    # the first training round is plotted at round 1, as its accuracy is.
    per_round = group_runs(runs, METRICS["time"])
    np.testing.assert_allclose(per_round.x, np.arange(1, 8))
    np.testing.assert_allclose(per_round.mean, 0.5)


def test_group_runs_pfllib_has_no_time(results: Path) -> None:
    runs = load_algorithm_runs(results, "MNIST", "FedProx", "test")
    assert group_runs(runs, METRICS["time"]) is None
    with pytest.raises(PlotError, match="rs_round_time"):
        group_runs(runs, METRICS["acc"], x_mode="time")


def test_summary_best_and_final(results: Path) -> None:
    summary = summarize_runs(load_algorithm_runs(results, "MNIST", "FedAvg", "test"))
    best = np.array([0.8, 0.9, 0.95])
    final = np.array([0.8, 0.9, 0.95])
    assert summary.n_runs == 3 and summary.n_evals == (4, 5) and summary.last_round == 6
    assert summary.best_mean == pytest.approx(best.mean())
    assert summary.best_std == pytest.approx(best.std())
    assert summary.final_mean == pytest.approx(final.mean())
    assert summary.time_per_round == pytest.approx(0.5)


def test_corrupt_file_raises(tmp_path: Path) -> None:
    bad = tmp_path / "MNIST_FedAvg_test_0.h5"
    bad.write_bytes(b"not an hdf5 file")
    with pytest.raises(ResultFileError, match="MNIST_FedAvg_test_0.h5"):
        load_run(bad)


# ---------------------------------------------------------------------------------------- CLI

def test_cli_in_process(results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plots"
    code = plot.main(["-data", "MNIST", "-algo", "FedAvg", "FedProx", "--results-dir", str(results),
                      "--out", str(out), "--metric", "acc", "loss", "auc", "time"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    for metric in ("acc", "loss", "auc", "time"):
        assert_png(out / f"MNIST_test_{metric}.png")
        assert str(out / f"MNIST_test_{metric}.png") in captured.out
    # The summary table: FedAvg best accuracy 88.33 ± 6.24 %, FedProx 65.00 ± 5.00 %.
    fedavg = next(line for line in captured.out.splitlines() if line.startswith("FedAvg"))
    fedprox = next(line for line in captured.out.splitlines() if line.startswith("FedProx"))
    assert "88.33 ± 6.24" in fedavg and fedavg.split()[1] == "3"
    assert "65.00 ± 5.00" in fedprox and fedprox.split()[1] == "2"
    # Truncation and the PFLlib files without round times are mentioned.
    assert "truncated" in captured.err
    assert "FedProx: no 'rs_round_time'" in captured.err


def test_cli_default_out_is_results_dir(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert plot.main(["-data", "MNIST", "-algo", "FedAvg", "--results-dir", str(results),
                      "--smooth", "2", "--x", "time"]) == 0
    assert_png(results / "MNIST_test_acc_vs_time.png")
    assert_png(results / "MNIST_test_loss_vs_time.png")


def test_cli_pfllib_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for run in range(2):
        write_pfllib(tmp_path, "Cifar10", "FedALA", "test", run, [0.1, 0.2 + run / 10, 0.4])
    assert plot.main(["-data", "Cifar10", "-algo", "FedALA", "--results-dir", str(tmp_path)]) == 0
    assert_png(tmp_path / "Cifar10_test_acc.png")
    assert_png(tmp_path / "Cifar10_test_loss.png")
    assert "FedALA" in capsys.readouterr().out


def test_cli_missing_results(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = plot.main(["-data", "MNIST", "-algo", "FedAvg", "SCAFFOLD", "--results-dir", str(results)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "MNIST_SCAFFOLD_test_<run>.h5" in err
    assert "python main.py -data MNIST -algo SCAFFOLD" in err


def test_cli_missing_results_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = plot.main(["-data", "MNIST", "-algo", "FedAvg", "--results-dir", str(tmp_path / "no")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "does not exist" in err


def test_cli_corrupt_repeat_is_left_out_with_a_note(results: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """As summarize.py and report.py: one note naming the file, the other repeats plotted."""
    good = (results / "MNIST_FedAvg_test_2.h5").read_bytes()
    (results / "MNIST_FedAvg_test_3.h5").write_bytes(b"\x00" * 100)
    (results / "MNIST_FedAvg_test_4.h5").write_bytes(good[: len(good) // 2])  # truncated
    code = plot.main(["-data", "MNIST", "-algo", "FedAvg", "--results-dir", str(results), "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err
    for run in (3, 4):
        (line,) = [n for n in err.splitlines() if f"MNIST_FedAvg_test_{run}.h5" in n]
        assert line.startswith(f"note: {results / f'MNIST_FedAvg_test_{run}.h5'}: not a readable HDF5 result file")
        assert line.endswith("; left out of FedAvg")
    assert (tmp_path / "MNIST_test_acc.png").is_file()
    (row,) = [line.split() for line in out.splitlines() if line.startswith("FedAvg ")]
    assert row[1] == "3"  # runs 0-2


def test_cli_an_algorithm_without_a_readable_file_is_an_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "MNIST_FedAvg_test_0.h5").write_bytes(b"\x00" * 100)
    code = plot.main(["-data", "MNIST", "-algo", "FedAvg", "--results-dir", str(tmp_path)])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 2
    assert "MNIST_FedAvg_test_0.h5: not a readable HDF5 result file" in err[0]
    assert err[1].startswith("plot.py: error: no results for algorithm FedAvg on MNIST")


def test_cli_x_time_needs_round_time(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = plot.main(["-data", "MNIST", "-algo", "FedProx", "--results-dir", str(results), "--x", "time"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "rs_round_time" in err


def test_default_results_dir_is_repo_results() -> None:
    assert Path(default_results_dir()).resolve() == SYSTEM.parent / "results"


def test_cli_subprocess(results: Path, tmp_path: Path) -> None:
    out = tmp_path / "sub"
    proc = subprocess.run(
        [sys.executable, "plot.py", "-data", "MNIST", "-algo", "FedAvg", "FedProx",
         "--results-dir", str(results), "--out", str(out)],
        cwd=SYSTEM, capture_output=True, text=True, encoding="utf-8", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert_png(out / "MNIST_test_acc.png")
    assert_png(out / "MNIST_test_loss.png")
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ plot bugs fixed

def test_round_axis_has_whole_number_ticks(tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    runs = [load_run(write_ours(tmp_path, "MNIST", "FedAvg", "test", 0, [0.1, 0.5, 0.7]))]
    for metric in ("acc", "time"):
        axes = Figure().add_subplot(1, 1, 1)
        draw_metric(axes, [group_runs(runs, METRICS[metric])])
        ticks = axes.get_xticks()
        assert len(ticks) >= 2 and np.array_equal(ticks, np.round(ticks)), ticks


def test_personalised_and_global_accuracy_are_told_apart(tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    path = write_ours(tmp_path, "MNIST", "Ditto", "test", 0, [0.1, 0.6, 0.8], personalized=True)
    with h5py.File(path, "a") as handle:
        handle.create_dataset("rs_test_acc_global", data=[0.1, 0.3, 0.4])
    write_ours(tmp_path, "MNIST", "FedAvg", "test", 0, [0.1, 0.5, 0.7])
    loaded = {algo: load_algorithm_runs(tmp_path, "MNIST", algo, "test") for algo in ("Ditto", "FedAvg")}
    groups = metric_groups(loaded, METRICS["acc"])
    assert [g.label for g in groups] == ["Ditto, personalised: own model, own data (1 run)",
                                         "Ditto, global model (1 run)", "FedAvg (1 run)"]
    np.testing.assert_allclose(groups[1].mean, [10, 30, 40])
    axes = Figure().add_subplot(1, 1, 1)
    draw_metric(axes, groups)
    lines = axes.get_lines()
    assert [line.get_linestyle() for line in lines] == ["-", "--", "-"]
    assert lines[0].get_color() == lines[1].get_color() != lines[2].get_color()
    # A personalised algorithm without a shared model (Local) is marked by the attribute main.py
    # writes; a file from before that attribute does not say, so it is not marked.
    write_ours(tmp_path, "MNIST", "Local", "test", 0, [0.1, 0.6], personalized=True)
    local = metric_groups({"Local": load_algorithm_runs(tmp_path, "MNIST", "Local", "test")}, METRICS["acc"])
    assert [g.label for g in local] == ["Local, personalised: own model, own data (1 run)"]
    write_ours(tmp_path, "MNIST", "FedPer", "test", 0, [0.1, 0.6], personalized=None)
    old = load_algorithm_runs(tmp_path, "MNIST", "FedPer", "test")
    assert old[0].personalized is None
    assert [g.label for g in metric_groups({"FedPer": old}, METRICS["acc"])] == ["FedPer (1 run)"]


def test_time_per_round_and_accuracy_number_rounds_alike(results: Path) -> None:
    runs = load_algorithm_runs(results, "MNIST", "FedAvg", "test")
    accuracy, per_round = group_runs(runs, METRICS["acc"]), group_runs(runs, METRICS["time"])
    # The first training round produces the model evaluated at round 1 (round 0 is the initial model).
    assert accuracy.x[0] == 0 and accuracy.x[1] == 2  # evaluated every 2 rounds
    np.testing.assert_allclose(per_round.x, np.arange(1, len(per_round.x) + 1))


def test_x_bytes_is_the_traffic_uploaded_before_each_evaluation(results: Path, tmp_path: Path) -> None:
    runs = load_algorithm_runs(results, "MNIST", "FedAvg", "test")
    group = group_runs(runs, METRICS["acc"], x_mode="bytes")
    np.testing.assert_allclose(group.x, [0.0, 0.002, 0.004, 0.006])  # 1000 bytes per round, eval_gap 2
    assert plot.main(["-data", "MNIST", "-algo", "FedAvg", "--results-dir", str(results), "--out",
                      str(tmp_path), "--x", "bytes"]) == 0
    assert_png(tmp_path / "MNIST_test_acc_vs_bytes.png")


def test_hints_name_only_what_exists(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert plot.main(["-data", "MNIST", "-algo", "NoSuchAlgo", "--results-dir", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "python main.py" not in err and "no algorithm 'NoSuchAlgo'" in err
    assert "MOON" in err  # the list of algorithms that do exist
    # A registered algorithm on a dataset that is not generated: its generator first, if there is one.
    assert plot.main(["-data", "Cifar100", "-algo", "MOON", "--results-dir", str(results)]) == 2
    err = capsys.readouterr().err
    assert "python generate_Cifar100.py" in err and "python main.py -data Cifar100 -algo MOON" in err
    assert plot.main(["-data", "NoSuchData", "-algo", "MOON", "--results-dir", str(results)]) == 2
    err = capsys.readouterr().err
    assert "python generate_" not in err and "no generate_NoSuchData.py" in err and "MNIST" in err


def test_x_virtual_is_the_clock_before_each_evaluation(tmp_path: Path) -> None:
    import resultfiles

    folder = resultfiles.write_folder(tmp_path / "results")
    runs = load_algorithm_runs(folder, "MNIST", "FedAvg", "test")
    group = group_runs(runs, METRICS["acc"], x_mode="virtual")
    np.testing.assert_allclose(group.x, 2.0 * np.arange(11))  # 2 virtual seconds per round
    with pytest.raises(PlotError, match="rs_virtual_time"):
        group_runs(load_algorithm_runs(folder, "MNIST", "Ditto", "test"), METRICS["acc"], x_mode="virtual")
