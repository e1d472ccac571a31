"""experiments/all_algorithms_table.py: its rows, the numbers it reads from results files and the table
(no run here)."""
import sys

import h5py
import numpy as np
from conftest import REPO

sys.path.insert(0, str(REPO / "experiments"))
import all_algorithms_table as table_script  # noqa: E402
from flcore.registry import list_algorithms, load_all  # noqa: E402
from fltest import make_args  # noqa: E402


def test_own_flags_and_first_rows_are_registered_algorithms_whose_flags_parse():
    load_all()
    names = set(list_algorithms())
    assert set(table_script.OWN_FLAGS) <= names and set(table_script.FIRST) <= names
    for algo, (flags, why) in table_script.OWN_FLAGS.items():
        assert why
        args = make_args(algo, *flags)
        assert args.ignored_flags == [], f"{algo} ignores {args.ignored_flags}"


def test_final_and_best_skip_nan(tmp_path):
    path = tmp_path / "r.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("rs_test_acc", data=np.array([0.1, np.nan, 0.8, 0.7]))
        f.attrs["personalized"] = True
    assert table_script.curve_numbers(path) == {"final": 0.7, "best": 0.8, "personalised": True}


def run(*finals, personalised=True):
    return {"flags": [], "runs": [{"final": v, "best": v, "personalised": personalised} for v in finals], "s_per_run": 3.0}


def test_table_lists_every_registered_name_with_differences_to_the_strongest_reference():
    load_all()
    records = {"Local": run(0.9, 0.9), "FedAvg": run(0.5, 0.7, personalised=False), "Ditto": run(0.8, 0.8),
               "FedRep": run(0.85, 0.85), "APPLE": {"flags": ["-dlr", "0.01"], "failed": "error: diverged"}}
    lines = table_script.table(records)
    assert "− FedRep" in lines[0]  # FedRep (0.85) is stronger than Ditto (0.80) here
    rows = {line.split(" | ")[0][2:]: line for line in lines[2:]}
    assert set(rows) == set(list_algorithms())
    assert "| FedAvg | global | – | 60.00 ± 10.00 | 60.00 ± 10.00 | -30.00 | +0.00 | -25.00 | 3 |" == rows["FedAvg"]
    assert "failed: error: diverged" in rows["APPLE"] and "`-dlr 0.01`" in rows["APPLE"]
    assert "not run" in rows["FedCP"]


def test_each_name_keeps_its_own_rows_and_table(tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(table_script, "OUT", tmp_path)
    small, large = table_script.parse([]), table_script.parse(["--name", "fmnist_300s", "--samples", "300"])
    assert small.name == "all_algorithms"
    for args, final in ((small, 0.7), (large, 0.8)):
        table_script.rows_dir(args.name).mkdir(parents=True)
        (table_script.rows_dir(args.name) / "FedAvg.json").write_text(json.dumps(
            run(final, personalised=False) | {"scale": table_script.scale_text(args)}))
    assert table_script.load_records()["FedAvg"]["runs"][0]["final"] == 0.7
    assert table_script.load_records("fmnist_300s")["FedAvg"]["runs"][0]["final"] == 0.8
    assert table_script.is_done("FedAvg", large) and not table_script.is_done("Local", large)
    table_script.main_(["--name", "fmnist_300s", "--table-only"])
    assert "| FedAvg | global | – | 80.00 ± 0.00 |" in (tmp_path / "fmnist_300s_table.md").read_text()
