"""summarize.py and the summary figures it shares with plot.py, sweep.py, report.py and main.py.

The result files are written here with known values (tests/reporting/resultfiles.py): ours, a
PFLlib-style file without our keys, an unfinished run; one test makes real ones with main.py.
"""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import main
import summarize
from resultfiles import DITTO, DITTO_GLOBAL, FEDAVG, FEDPROX, write_folder, write_ours, write_pfllib
from toydata import make_dataset
from reporting.loading import find_all_runs, load_algorithm_runs
from reporting.stats import summarize_runs
from reporting.results import RunHistory, tail_gain, tail_means
from reporting.results import summarize as summarize_history

SYSTEM = Path(__file__).resolve().parents[2] / "system"


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return write_folder(tmp_path / "results")


def row_of(text: str, name: str) -> list[str]:
    """The cells of a row of the printed table (columns are separated by two spaces or more)."""
    line = next(line for line in text.splitlines() if line.startswith(name + " "))
    return [cell.strip() for cell in line.split("  ") if cell.strip()]


def test_tail_means_never_count_the_untrained_round_0() -> None:
    acc = np.array([0.1, 0.5, 0.7, 0.9])
    # Fewer evaluations than N: the mean of the three trained models, not of all four.
    assert tail_means(acc, np.arange(4), 10) == (pytest.approx(0.9), pytest.approx(0.7))
    assert tail_means(acc, np.arange(4), 2)[1] == pytest.approx(0.8)
    # A run with only the round-0 evaluation has nothing else to average.
    assert tail_means(np.array([0.1]), np.array([0]), 10) == (pytest.approx(0.1), pytest.approx(0.1))
    # main.py's summary uses the same definition.
    history = RunHistory(eval_rounds=[0, 1, 2, 3], test_acc=acc.tolist(), bytes_up=[5, 5, 5], round_time=[1.0] * 3)
    stored = summarize_history(history, 10, 0.7, model_bytes=5)
    assert stored["mean_acc_last_n"] == pytest.approx(0.7)
    assert stored["rounds_to_target"] == 2 and stored["bytes_up_to_target"] == 10


def test_tail_gain_says_whether_a_run_was_still_learning() -> None:
    """The last N trained evaluations' mean minus the N before: a climbing run gains, a flat one not;
    round 0 never counts, and fewer than 2N trained evaluations give none."""
    climbing = np.array([0.1, 0.2, 0.4, 0.5, 0.7])  # round 0, then four trained evaluations
    assert tail_gain(climbing, np.arange(5), 2) == pytest.approx(0.6 - 0.3)
    assert tail_gain(np.array([0.1, 0.8, 0.8, 0.8, 0.8]), np.arange(5), 2) == pytest.approx(0.0)
    assert tail_gain(climbing, np.arange(5), 3) is None  # 4 trained evaluations < 2 x 3
    assert tail_gain(climbing, np.arange(5), 0) is None


def test_figures_of_our_files(results: Path) -> None:
    runs = load_algorithm_runs(results, "MNIST", "FedAvg", "test")
    row = summarize_runs(runs, avg_last=3, target_acc=0.8)
    acc = np.array(FEDAVG)
    best, final = acc.max(axis=1), acc[:, -1]
    assert row.n_runs == 3 and row.unfinished == 0 and not row.personalized
    assert row.stats["best"].mean == pytest.approx(best.mean())
    assert row.stats["best"].std == pytest.approx(best.std())  # population std over the repeats
    assert row.stats["final"].mean == pytest.approx(final.mean())
    # 10 trained evaluations: the last 10% is the last one; the last 3 of each run, averaged.
    assert row.stats["last_10pct"].mean == pytest.approx(final.mean())
    assert row.stats["last_n"].mean == pytest.approx(acc[:, -3:].mean(axis=1).mean())
    assert row.stats["last_n"].std == pytest.approx(acc[:, -3:].mean(axis=1).std())
    gain = acc[:, -3:].mean(axis=1) - acc[:, -6:-3].mean(axis=1)
    assert row.stats["gain_last_n"].mean == pytest.approx(gain.mean())
    assert row.stats["gain_last_n"].std == pytest.approx(gain.std())
    # Each run first reaches 0.80 at round 7, after 7 rounds of 1, 2 and 3 MB uploads.
    assert row.stats["rounds_to_target"].mean == 7 and row.stats["rounds_to_target"].count == 3
    assert row.stats["mb_to_target"].mean == pytest.approx(14.0)
    assert row.stats["mb_to_target"].std == pytest.approx(np.std([7.0, 14.0, 21.0]))
    assert row.stats["s_per_round"].mean == pytest.approx(0.5)
    assert row.stats["peak_rss_mb"].mean == pytest.approx(110.0)
    assert row.stats["virtual_time"].mean == pytest.approx(20.0)  # the clock after 10 rounds of 2 s
    assert "global_best" not in row.stats and "dp_epsilon" not in row.stats


def test_personalised_and_global_accuracy_side_by_side(results: Path) -> None:
    row = summarize_runs(load_algorithm_runs(results, "MNIST", "Ditto", "test"))
    assert row.personalized
    assert row.stats["best"].mean == pytest.approx(np.max(DITTO, axis=1).mean())
    assert row.stats["global_best"].mean == pytest.approx(np.max(DITTO_GLOBAL, axis=1).mean())
    assert row.stats["global_final"].mean == pytest.approx(np.array(DITTO_GLOBAL)[:, -1].mean())
    assert row.stats["dp_epsilon"].mean == pytest.approx(2.0)  # the last ε of each run: 1.5 and 2.5


def test_target_reached_by_some_runs_only(tmp_path: Path) -> None:
    write_ours(tmp_path, "MNIST", "FedAvg", "test", 0, [0.1, 0.5, 0.9])
    write_ours(tmp_path, "MNIST", "FedAvg", "test", 1, [0.1, 0.5, 0.6])
    row = summarize_runs(load_algorithm_runs(tmp_path, "MNIST", "FedAvg", "test"), target_acc=0.85)
    assert row.stats["rounds_to_target"].count == 1
    text = summarize.format_summary_table([row], "MNIST", "test", target_acc=0.85)
    assert "2.0 ± 0.0 (1/2)" in row_of(text, "FedAvg")
    none = summarize_runs(load_algorithm_runs(tmp_path, "MNIST", "FedAvg", "test"), target_acc=0.95)
    cells = row_of(summarize.format_summary_table([none], "MNIST", "test", target_acc=0.95), "FedAvg")
    assert cells.count("not reached (0/2)") == 2  # rounds and MB: computable, never reached
    pfllib = write_pfllib(tmp_path, "MNIST", "FedProx", "test", 0, [0.1, 0.9])
    prox = summarize_runs(load_algorithm_runs(tmp_path, "MNIST", "FedProx", "test"), target_acc=0.5)
    assert prox.stats["rounds_to_target"].mean == 1 and "mb_to_target" not in prox.stats and pfllib.exists()


def test_cli_tables_csv_and_markdown(results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv_path, md_path = tmp_path / "out" / "table.csv", tmp_path / "out" / "table.md"
    code = summarize.main(["--results_dir", str(results), "--last", "3", "--target_acc", "0.8",
                           "--csv", str(csv_path), "--md", str(md_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    # One table per dataset.
    assert "Cifar10 (goal: test)" in out and "MNIST (goal: test)" in out
    fedavg, fedprox, ditto = row_of(out, "FedAvg"), row_of(out, "FedProx"), row_of(out, "Ditto")
    best = 100 * np.max(FEDAVG, axis=1)
    assert fedavg[:4] == ["FedAvg", "3", "11", "10"]
    assert f"{best.mean():.2f} ± {best.std():.2f}" in fedavg
    # The PFLlib file: accuracies from its rs_test_acc, "–" for what it does not store.
    prox = 100 * np.max(FEDPROX, axis=1)
    assert f"{prox.mean():.2f} ± {prox.std():.2f}" in fedprox
    # the last 3 gain (3 trained evaluations, fewer than 2 x 3), global best and final, MB and
    # virtual seconds to the target (no traffic or clock recorded), s/round, peak RSS, DP ε, virtual time
    assert fedprox.count("–") == 9 and "not reached (0/2)" in fedprox  # rounds: computable
    gain = 100 * (np.mean(FEDAVG, axis=0)[-3:].mean() - np.mean(FEDAVG, axis=0)[-6:-3].mean())
    assert "last 3 gain (points)" in out and f"+{gain:.2f} ± " in " ".join(fedavg)
    assert "20 ± 0" in fedavg and "virtual time (s)" in out  # the clock's reading at the end
    assert "personal models" in ditto and "global model" in fedavg
    # The unfinished run is marked.
    assert "1 of 1" in row_of(out, "SCAFFOLD") and "finished = False" in out
    # CSV: numbers as stored (fractions), empty where missing.
    rows = {r["algorithm"]: r for r in csv.DictReader(csv_path.open())}
    assert float(rows["FedAvg"]["best_mean"]) == pytest.approx(np.max(FEDAVG, axis=1).mean())
    assert rows["FedProx"]["s_per_round_mean"] == "" and rows["SCAFFOLD"]["unfinished"] == "1"
    assert float(rows["Ditto"]["global_final_mean"]) == pytest.approx(0.61)
    # Markdown: the tables and how each figure was computed.
    md = md_path.read_text()
    assert "| FedAvg | 3 | 11 | 10 |" in md and "round 0 never counted" in md
    assert str(csv_path) in out and str(md_path) in out


def test_cli_filters_and_default_outputs(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert summarize.main(["--results_dir", str(results), "-data", "MNIST", "-algo", "FedProx"]) == 0
    out = capsys.readouterr().out
    assert "FedProx" in out and "FedAvg" not in out and "Cifar10" not in out
    assert (results / "summary.csv").is_file() and (results / "summary.md").is_file()


def test_several_goals_are_named_in_the_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_pfllib(tmp_path, "MNIST", "FedAvg", "a", 0, [0.1, 0.2])
    write_pfllib(tmp_path, "MNIST", "FedAvg", "b", 0, [0.1, 0.3])
    assert summarize.main(["--results_dir", str(tmp_path), "--csv", "", "--md", ""]) == 0
    out = capsys.readouterr().out
    assert "FedAvg [a]" in out and "FedAvg [b]" in out and not (tmp_path / "summary.csv").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--results_dir", "/nonexistent/folder"], "does not exist"),
    (["--target_acc", "90"], "between 0 and 1"),
    (["--last", "0"], "positive integer"),
    (["-algo", "NoSuchAlgorithm"], "no result files"),
])
def test_cli_errors_are_one_line(results: Path, argv: list[str], needle: str) -> None:
    if "--results_dir" not in argv:
        argv = ["--results_dir", str(results), *argv]
    proc = subprocess.run([sys.executable, "summarize.py", *argv], cwd=SYSTEM, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_a_corrupt_file_is_left_out_with_a_note(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (results / "MNIST_FedAvg_test_9.h5").write_bytes(b"\x00" * 64)
    assert summarize.main(["--results_dir", str(results), "--csv", "", "--md", ""]) == 0
    captured = capsys.readouterr()
    assert "MNIST_FedAvg_test_9.h5" in captured.err and row_of(captured.out, "FedAvg")[1] == "3"


def test_real_runs_of_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Files main.py writes: a global and a personalised algorithm, two repeats each."""
    toy = make_dataset(tmp_path / "data", num_clients=4, input_shape=(1, 8, 8))
    out_dir = tmp_path / "results"
    for algorithm in ("FedAvg", "Ditto"):
        assert main.main(["-dev", "cpu", "--progress", "False", "-q", "-data", str(toy), "-m", "DNN",
                          "-gr", "3", "-t", "2", "-algo", algorithm, "--results_dir", str(out_dir)]) == 0
    capsys.readouterr()
    runs = find_all_runs(out_dir)["Toy"]
    assert set(runs) == {("FedAvg", "test"), ("Ditto", "test")}
    assert summarize.main(["--results_dir", str(out_dir), "--target_acc", "0.05"]) == 0
    out = capsys.readouterr().out
    fedavg, ditto = row_of(out, "FedAvg"), row_of(out, "Ditto")
    assert fedavg[:4] == ["FedAvg", "2", "4", "3"] and "personal models" in ditto
    rows = {r["algorithm"]: r for r in csv.DictReader((out_dir / "summary.csv").open())}
    stored = [run.attrs for run in runs[("FedAvg", "test")]]
    # The table's figures are main.py's own summary attributes, recomputed from the series.
    assert float(rows["FedAvg"]["best_mean"]) == pytest.approx(np.mean([a["best_acc"] for a in stored]))
    assert float(rows["FedAvg"]["last_n_mean"]) == pytest.approx(np.mean([a["mean_acc_last_n"] for a in stored]))
    assert float(rows["FedAvg"]["s_per_round_mean"]) > 0 and float(rows["FedAvg"]["peak_rss_mb_mean"]) > 0
    assert float(rows["Ditto"]["global_best_runs"]) == 2  # Ditto records its shared model's accuracy
    # main.py says in each file whose model the accuracy is, so reporting needs no registry.
    assert [run.attrs["personalized"] for run in runs[("Ditto", "test")]] == [True, True]
    assert [run.attrs["personalized"] for run in runs[("FedAvg", "test")]] == [False, False]
