"""experiments/sparse_table.py (the slides' pFedEff table): the numbers it reads from results files and
the tables it writes, rounds to a target included (no training here)."""
import argparse
import sys

import h5py
import numpy as np
import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "experiments"))
import sparse_table as st  # noqa: E402


def table_args(**changes) -> argparse.Namespace:
    args = dict(datasets=["MNIST"], splits=["iid", "pat"], model="DNN", clients=20, samples=150, rounds=4,
                local_epochs=1, batch_size=10, lr=0.05, seed=0, times=2, target=0.95)
    return argparse.Namespace(**{**args, **changes})


def entry(curves, moved):
    curves = [np.asarray(c, dtype=float) for c in curves]
    return {"acc": [float(c.max()) for c in curves], "round": [float(np.argmax(c)) for c in curves],
            "bytes": list(moved), "curve": curves, "eval_rounds": [np.arange(len(c)) for c in curves]}


def section(lines, title_start):
    """The rows of the table whose heading starts with ``title_start``: label -> its cells."""
    start = next(i for i, line in enumerate(lines) if line.startswith("## " + title_start))
    rows = {}
    for line in lines[start + 4:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_rounds_to_is_the_first_evaluation_at_or_above_the_target():
    curve, every_round = np.array([0.10, 0.50, 0.80, 0.79, 0.90]), np.arange(5)
    assert st.rounds_to(curve, every_round, 0.80) == 2.0  # reaching it exactly counts; the later dip does not matter
    assert st.rounds_to(curve, every_round, 0.85) == 4.0
    assert st.rounds_to(curve, every_round, 0.95) is None
    assert st.rounds_to(curve, every_round * 3, 0.85) == 12.0  # -eg 3: the round of that evaluation, not its index


def test_run_numbers_reads_best_accuracy_its_round_bytes_and_curve(tmp_path):
    path = tmp_path / "MNIST_pFedEff_x_0.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("rs_test_acc", data=np.array([0.1, 0.6, 0.7, 0.65]))
        f.create_dataset("rs_bytes_up", data=np.array([10.0, 20.0, 30.0]))
        f.create_dataset("rs_bytes_down", data=np.array([1.0, 2.0, 3.0]))
        f.create_dataset("rs_eval_rounds", data=np.arange(4))
    numbers = st.run_numbers(path)
    assert (numbers["acc"], numbers["round"], numbers["bytes"]) == (0.7, 2.0, 66.0)
    assert numbers["curve"].tolist() == [0.1, 0.6, 0.7, 0.65]
    assert numbers["eval_rounds"].tolist() == [0, 1, 2, 3]
    with h5py.File(path, "a") as f:  # evaluated every 5 rounds: the best is round 10's, not evaluation 2's
        del f["rs_eval_rounds"]
        f.create_dataset("rs_eval_rounds", data=np.array([0, 5, 10, 15]))
    assert st.run_numbers(path)["round"] == 10.0


def test_tables_give_rounds_to_the_fraction_of_fedavgs_best_and_count_seeds_that_never_reach_it():
    # FedAvg's mean best accuracy is 0.80 on iid: the target is 0.95 * 0.80 = 0.76
    cells = {("MNIST", "iid"): {"FedAvg": entry([[0.1, 0.5, 0.7, 0.78, 0.80], [0.1, 0.6, 0.77, 0.79, 0.80]], [100, 100]),
                                "pFedEff-50": entry([[0.1, 0.76, 0.8, 0.8, 0.8], [0.1, 0.5, 0.6, 0.7, 0.75]], [28, 30])},
             ("MNIST", "pat"): {"FedAvg": {"note": "failed: main.main exited with 1"},
                                "pFedEff-50": entry([[0.1, 0.9, 0.95, 0.97, 0.98]] * 2, [28, 28])}}
    rows = [("FedAvg", "FedAvg", []), ("pFedEff-50", "pFedEff", ["-kf", "0.5"])]
    lines = st.table_lines(cells, rows, table_args())
    target = section(lines, "Rounds to 0.95 of FedAvg's mean best accuracy")
    assert target["FedAvg"] == ["2.5 ± 0.5", "failed: main.main exited with 1"]  # rounds 3 and 2 (0.78, 0.77)
    assert target["pFedEff-50"] == ["1.0 ± 0.0 (1/2)", "–"]  # its second seed never reaches 0.76; no FedAvg on pat
    volume = section(lines, "Communication volume")
    assert volume["pFedEff-50"] == ["0.2900 ± 0.0100", "–"]
    assert section(lines, "Accuracy")["pFedEff-50"][0] == "77.50 ± 2.50"


def test_a_target_outside_zero_to_one_is_refused_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["sparse_table.py", "--target", "1.5"])
    with pytest.raises(SystemExit) as exc:
        st.parse_args()
    assert exc.value.code == 2
    assert "--target 1.5" in capsys.readouterr().err
