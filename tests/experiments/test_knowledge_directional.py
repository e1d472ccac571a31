"""experiments/knowledge_directional.py: its rows and the numbers it reads from results files (no run here)."""
import sys

import h5py
import numpy as np
import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "experiments"))
import knowledge_directional as kd  # noqa: E402
from flcore.registry import ALGORITHMS, load_all  # noqa: E402


def test_rows_are_the_seven_knowledge_transfer_methods_against_local_and_fedavg_and_all_registered():
    load_all()
    assert set(kd.ROWS) == {"Local", "FedAvg", "FedProto", "FD", "FedPCL", "FedGH", "FedPAC", "FML", "FedKD"}
    assert all(algo in ALGORITHMS for algo, _ in kd.ROWS.values())


def write_curves(folder, curves):
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, values in enumerate(curves):
        path = folder / f"r{i}.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("rs_test_acc", data=np.array(values))
        paths.append(path)
    return paths


def test_final_best_and_tail_skip_nan_and_missing_series(tmp_path, monkeypatch):
    monkeypatch.setattr(kd, "TAIL", 2)
    paths = write_curves(tmp_path, ([0.1, 0.8, 0.7], [np.nan, 0.5, 0.9]))
    assert kd.curve_stats(paths) == ([0.7, 0.9], [0.8, 0.9], [0.75, 0.7])
    assert kd.curve_stats(paths, "rs_test_acc_proto") == ([None, None], [None, None], [None, None])


def test_tabulate_reads_the_results_already_there_without_running(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kd, "TAIL", 2)
    monkeypatch.setattr(kd, "OUT", tmp_path)
    monkeypatch.setattr(kd, "write_table", lambda name, lines: print(name, *lines, sep="\n"))
    monkeypatch.setattr(kd, "results_folder", lambda experiment, label: tmp_path / label)
    monkeypatch.setattr(kd, "run_variant", None)  # a run would fail loudly
    write_curves(tmp_path / "FD", ([0.2, 0.6, 0.8], [0.2, 0.4, 0.6]))
    kd.main_(["--only", "FD", "Local", "--tabulate"])
    out = capsys.readouterr().out
    assert "knowledge_directional_FD_Local_tabulated" in out
    assert "| FD | 70.00 ± 10.00 | 70.00 ± 10.00 | 60.00 ± 10.00 | 2 |  |  |" in out
    assert "| Local | no results |" in out


def test_public_rows_withhold_the_same_public_data_in_all_three():
    load_all()
    assert {algo for algo, _ in kd.PUBLIC_ROWS.values()} == {"KT-pFL", "Local", "FD"}
    for label in kd.PUBLIC_ROWS:
        algo, flags = kd.row(label, 0.025)
        assert algo in ALGORITHMS
        assert flags[flags.index("--public_data") + 1] == "0.02", label
    assert kd.row("FD (public 0.02)", 0.025)[1][:2] == kd.row("FD", 0.025)[1]  # FD's own flags unchanged


def test_fedkd_mentee_learns_at_the_runs_lr():
    algo, flags = kd.row("FedKD", 0.025)
    assert algo == "FedKD" and flags[flags.index("-mlr") + 1] == "0.025"


def test_an_unknown_row_is_one_line_and_exit_2_before_any_run(capsys):
    with pytest.raises(SystemExit) as exc:
        kd.main_(["--only", "FedAvg", "Nope", "--data", "/nonexistent"])
    assert exc.value.code == 2
    assert "unknown row(s) 'Nope'" in capsys.readouterr().err
