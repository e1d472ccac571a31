"""experiments/protocol_families.py: its run plan and one real run per kind of metric on a toy dataset."""
import sys

import numpy as np
import pytest
from conftest import REPO
from toydata import make_dataset

sys.path.insert(0, str(REPO / "experiments"))
import common  # noqa: E402
import protocol_families as pf  # noqa: E402
from flcore.registry import load_all  # noqa: E402


def test_plan_runs_fedavg_once_for_both_families_and_cnn_first():
    load_all()
    rows = [row for row in pf.ROWS if row.algo in ("FedAvg", "Local")]
    jobs = pf.plan_jobs(rows, range(0, 2))
    # FedAvg on the main set-up serves the global and the personalised table: one job per seed.
    assert sum(job.algo == "FedAvg" and job.setup == "main" for job in jobs) == 2
    assert len(jobs) == len(set(jobs)) == 8
    assert [job.setup for job in jobs[:4]] == ["bn"] * 4


def test_plan_skips_unregistered_algorithms():
    load_all()
    ghost = pf.Row("global", "Ghost", "NoSuchAlgorithm", (), "main")
    assert pf.plan_jobs([ghost], range(1)) == []


@pytest.mark.parametrize("algo", ["FedAvg", "Local"])
def test_run_job_reads_its_own_result_file(tmp_path, monkeypatch, algo):
    monkeypatch.setattr(common, "OUT", tmp_path / "out")  # run_variant writes its results under OUT
    data = make_dataset(tmp_path, num_clients=3, eight_bit=True)
    args = pf.parse_args(["--model", "MLR", "--lr", "0.1"])
    outcomes = [pf.run_job(pf.Job(algo, (), "main", seed), args, {"main": data}, rounds=2) for seed in (0, 1)]
    for outcome in outcomes:
        assert not isinstance(outcome, str), outcome
        assert 0 <= outcome["last10"] <= 1 and outcome["best"] >= outcome["final"] - 1e-12
        assert 0 <= outcome["client_last10"] <= 1 and outcome["time"] > 0
    assert len(list((tmp_path / "out" / "results" / pf.EXPERIMENT).rglob("*.h5"))) == 2
    cells = pf.row_cells(outcomes, personal=True)
    last10 = [o["last10"] for o in outcomes]
    assert cells[0] == f"{100 * np.mean(last10):.2f} ± {100 * np.std(last10):.2f}"
    assert cells[4] == "–"  # neither FedAvg nor Local records a shared model besides its evaluated one
    assert len(cells) == 6 and len(pf.row_cells(outcomes, personal=False)) == 4


def test_a_failed_run_fills_the_row_with_its_note():
    note = "failed: main.main exited with 2"
    assert pf.row_cells([{"last10": 0.5}, note], personal=False) == [note, "", "", ""]


def test_reuse_takes_a_matching_results_file_and_only_that(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "OUT", tmp_path / "out")
    data = make_dataset(tmp_path, num_clients=3, eight_bit=True)
    job = pf.Job("FedAvg", (), "main", 0)
    first = pf.run_job(job, pf.parse_args(["--model", "MLR"]), {"main": data}, rounds=1)
    (path,) = (tmp_path / "out" / "results" / pf.EXPERIMENT).rglob("*.h5")
    stamp = path.stat().st_mtime_ns
    again = pf.run_job(job, pf.parse_args(["--model", "MLR", "--reuse"]), {"main": data}, rounds=1)
    assert again == first and path.stat().st_mtime_ns == stamp  # read back, not run again
    assert pf.earlier_run(path.parent, {"algorithm": "FedAvg", "seed": 0, "global_rounds": 1}) == path
    assert pf.earlier_run(path.parent, {"algorithm": "FedAvg", "local_learning_rate": 0.01}) is None
    # A different setting is a new run, which replaces the old file.
    other = pf.run_job(job, pf.parse_args(["--model", "MLR", "--reuse", "--lr", "0.01"]), {"main": data}, rounds=1)
    assert other != first and path.stat().st_mtime_ns != stamp


def test_rows_are_chosen_by_family_label_or_algorithm_less_the_skipped():
    rows = pf.choose_rows(["global", "personalised"], ["FedGen"])
    assert [row.label for row in rows] == ["FedAvg", "MOON", "FedDyn", "FedCross", "FedAvg", "Local", "FedPer",
                                           "FedRep", "FedRoD"]
    assert [(row.family, row.label) for row in pf.choose_rows(["FedROD", "FedBN"], [])] == [
        ("personalised", "FedRoD"), ("batchnorm", "FedBN")]
    assert pf.choose_rows(None, ["global", "personalised"]) == [row for row in pf.ROWS if row.setup == "bn"]


def test_run_variant_starts_afresh_over_an_interrupted_run(tmp_path, monkeypatch):
    # A row's folder holding an interrupted run (its checkpoint, no finished result) must not make
    # the rerun fail with "already holds an interrupted run": the folder is emptied, locks aside.
    monkeypatch.setattr(common, "OUT", tmp_path / "out")
    data = make_dataset(tmp_path, num_clients=3, eight_bit=True)
    args = pf.parse_args(["--model", "MLR"])
    args.times = 1
    folder = common.results_folder("scarce", "Fed Avg")
    folder.mkdir(parents=True)
    stale = folder / f"{data.name}_FedAvg_Fed_Avg_0.ckpt"
    stale.write_bytes(b"interrupted")
    lock = folder / f".{data.name}_FedAvg_Fed_Avg_0.h5.lock"
    lock.write_text("")
    run = common.run_variant("scarce", "Fed Avg", "FedAvg", [], data, args, "MLR", 1, quiet=True)
    assert not isinstance(run, str), run
    assert [p.name for p in run.paths] == [f"{data.name}_FedAvg_Fed_Avg_0.h5"]
    assert not stale.exists()


def test_only_keeps_the_rows_of_the_families_not_run_now(tmp_path, monkeypatch):
    """Two calls with --only, each of one row: the table holds both, each in its family's table."""
    from concurrent.futures import Future

    class InProcess:  # the pool, without processes: each job's outcome is made up from its algorithm
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, job, *args):
            future = Future()
            value = {"FedBN": 0.8, "FedDyn": 0.7}[job.algo]
            future.set_result({"last10": value, "best": value, "final": value, "client_last10": value,
                               "shared_last10": value, "time": 1.0})
            return future

    monkeypatch.setattr(common, "OUT", tmp_path)
    monkeypatch.setattr(pf, "ProcessPoolExecutor", InProcess)
    monkeypatch.setattr(pf, "ensure_data", lambda given, samples: tmp_path / "data")
    for only in ("FedBN", "FedDyn"):
        monkeypatch.setattr(sys, "argv", ["protocol_families.py", "--only", only, "--times", "1", "--rounds", "2"])
        pf.main_script()
    lines = (tmp_path / f"{pf.EXPERIMENT}.md").read_text().splitlines()
    rows = [line.split("|")[1].strip() for line in lines if line.startswith("| Fed")]
    assert rows == ["FedDyn", "FedBN"]  # the global family's table comes first
    assert sum(line.startswith("Written ") for line in lines) == 1
