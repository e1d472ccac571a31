"""experiments/pfllib_side_by_side.py's pure parts: reading PFLlib's stdout, the two command lines,
the table, and the partition written in PFLlib's format (no PFLlib run here)."""
import argparse
import sys

import h5py
import numpy as np
import pytest
from conftest import REPO
from toydata import make_dataset

sys.path.insert(0, str(REPO / "experiments"))
import benchmark  # noqa: E402
import pfllib_side_by_side as sbs  # noqa: E402

PFLLIB_STDOUT = """
-------------Round number: 0-------------

Evaluate global model
Averaged Train Loss: 2.3012
Averaged Test Accuracy: 0.1001
Averaged Test AUC: 0.5012
Std Test Accuracy: 0.0931
------------------------- time cost ------------------------- 12.5

-------------Round number: 1-------------
Averaged Test Accuracy: 0.4567
------------------------- time cost ------------------------- 11.0
Averaged Test Accuracy: 0.5
-------------------------------------------------- 9.5

Average time cost per round.
11.75

Average time cost: 30.2s.
"""


def test_pfllib_stdout_gives_every_evaluation_and_round_time_but_not_the_summaries():
    times, accs = benchmark.parse_pfllib_stdout(PFLLIB_STDOUT)
    assert times == [12.5, 11.0, 9.5]  # FD's, FedProto's, ... line is '-' * 50 and the seconds
    assert accs == [0.1001, 0.4567, 0.5]  # "Std Test Accuracy" and "Average time cost" are not taken


def _args(**over):
    base = dict(model="DNN", num_clients=20, batch_size=10, local_epochs=1, lr=0.005, rounds=10, seed=0, threads=1)
    return argparse.Namespace(**(base | over))


def test_both_sides_get_the_same_flags_and_ours_the_split_dnn_where_pfllib_splits_it(tmp_path):
    args = _args()
    theirs = sbs.pfllib_argv("FedProto", ["-lam", "1.0"], args)
    ours = sbs.our_argv("FedProto", ["-lam", "1.0"], tmp_path / "data", tmp_path / "res", args)

    def value(argv, flag):
        return argv[argv.index(flag) + 1]

    for flag in ("-nc", "-lbs", "-ls", "-lr", "-jr", "-eg", "-gr", "-lam"):
        assert value(theirs, flag) == value(ours, flag), flag
    assert value(theirs, "-m") == "DNN" and value(ours, "-m") == "DNN-PFLlib"
    assert value(sbs.our_argv("FML", [], tmp_path, tmp_path, args), "-m") == "DNN"  # PFLlib keeps FML's DNN whole
    assert value(sbs.our_argv("FedProto", [], tmp_path, tmp_path, _args(model="CNN")), "-m") == "CNN"


def test_every_algorithm_of_the_issues_has_its_pfllib_defaults():
    assert set(sbs.DEFAULT_ALGORITHMS) <= set(sbs.ALGORITHM_FLAGS)
    assert sbs.ALGORITHM_FLAGS["FML"] == ["-al", "1.0", "-bt", "0.0"]


def test_table_shows_finals_difference_and_both_curves_and_failures():
    records = {
        "FD": {"flags": ["-lam", "1.0"], "our_model": "DNN",
               "pfllib": {"acc": [0.1, 0.5, 0.6], "round_s": [3.0, 2.0, 4.0]},
               "ours": {"acc": [0.1, 0.55, 0.65], "round_s": [1.0, 1.0]}},
        "FedPAC": {"flags": [], "our_model": "DNN-PFLlib",
                   "pfllib": {"error": "exit 1: ModuleNotFoundError: cvxpy"}, "ours": {"acc": [0.2, 0.3]}},
    }
    lines = sbs.table_lines(records, ["FedPAC", "FD"])
    assert lines[2].startswith("| FedPAC |") and "| 30.00 |" in lines[2] and "| – |" in lines[2]
    fd = lines[3]
    assert "| `-lam 1.0` | DNN | 60.00 | 65.00 | +5.00 | 60.00 | 65.00 | 4.00 | 1.00 |" in fd
    text = "\n".join(lines)
    assert "- PFLlib: 10.00 50.00 60.00" in text and "- ours: 10.00 55.00 65.00" in text
    assert "- PFLlib: failed (exit 1: ModuleNotFoundError: cvxpy)\n" in text
    records["FD"]["pfllib"]["error"] = "exit 1: NaN"
    assert "- PFLlib: failed (exit 1: NaN) after evaluating 10.00 50.00 60.00" in "\n".join(sbs.table_lines(records))


def test_our_results_file_is_read_back(tmp_path):
    path = tmp_path / "r.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("rs_test_acc", data=np.array([0.1, 0.7]))
        f.create_dataset("rs_round_time", data=np.array([2.5]))
        f.attrs["personalized"] = True
    assert sbs.read_our_results(path) == {"acc": [0.1, 0.7], "round_s": [2.5], "personalized": True}
    with h5py.File(path, "a") as f:
        f.create_dataset("rs_test_acc_proto", data=np.array([np.nan, 0.8]))
        f.create_dataset("rs_test_acc_std", data=np.array([0.0, 0.1]))
    again = sbs.read_our_results(path)
    assert again["acc_proto"][1] == 0.8 and "acc_std" not in again


def test_records_survive_a_rerun_and_a_corrupt_file_is_one_line(tmp_path):
    path = tmp_path / "records.json"
    sbs.save_records(path, {"FD": {"flags": []}})
    assert sbs.load_records(path) == {"FD": {"flags": []}}
    path.write_text("{")
    with pytest.raises(SystemExit, match="not valid JSON"):
        sbs.load_records(path)


def test_our_partition_is_written_in_pfllibs_format(tmp_path):
    data = make_dataset(tmp_path / "data", num_clients=2, input_shape=(1, 28, 28), train_sizes=[7, 9])
    assert benchmark.write_pfllib_partition(data, tmp_path / "MNIST") == 2
    with np.load(tmp_path / "MNIST" / "train" / "1.npz", allow_pickle=True) as archive:  # the file we just wrote
        written = archive["data"].tolist()
    with np.load(data / "train" / "1.npz", allow_pickle=False) as archive:
        assert np.array_equal(written["x"], archive["x"]) and np.array_equal(written["y"], archive["y"])
    assert written["x"].dtype == np.float32 and written["y"].dtype == np.int64


def test_dnn_pfllib_is_pfllibs_dnn_as_its_main_splits_it():
    import torch

    from flcore.registry import MODELS, load_all

    load_all()
    torch.manual_seed(0)
    model = MODELS.get("DNN-PFLlib")((1, 28, 28), 10)
    x = torch.randn(3, 1, 28, 28)
    hidden = torch.relu(x.flatten(1) @ model.body[1].weight.T + model.body[1].bias)
    features = torch.log_softmax(hidden, dim=1)  # DNN.forward's last line, left on the base by fc = Identity
    assert torch.allclose(model.body(x), features, atol=1e-6)
    assert torch.allclose(model(x), features @ model.head.weight.T + model.head.bias, atol=1e-6)


def test_capped_test_rows_keep_the_training_rows_and_say_so_in_the_config(tmp_path):
    import json

    from fldata.loading import load_federated_dataset

    data = make_dataset(tmp_path / "data", num_clients=2, input_shape=(1, 28, 28), train_sizes=[7, 9])
    capped = sbs.cap_test_rows(data, tmp_path / "capped", 2)
    for index in range(2):
        with np.load(capped / "train" / f"{index}.npz") as a, np.load(data / "train" / f"{index}.npz") as b:
            assert np.array_equal(a["x"], b["x"])
        with np.load(capped / "test" / f"{index}.npz") as a, np.load(data / "test" / f"{index}.npz") as b:
            assert len(a["y"]) == min(2, len(b["y"])) and set(a["y"]) <= set(b["y"])
    config = json.loads((capped / "config.json").read_text())
    assert config["test_rows_capped"]["per_client"] == 2
    assert len(load_federated_dataset(str(capped)).clients) == 2  # our loader takes the copy
    assert sbs.cap_test_rows(data, capped, 5) == capped  # an existing copy is kept


def test_fedproto_is_compared_on_pfllibs_metric_the_nearest_prototype():
    records = {"FedProto": {"flags": [], "our_model": "DNN-PFLlib", "pfllib": {"acc": [0.0, 0.9]},
                            "ours": {"acc": [0.1, 0.5], "acc_proto": [float("nan"), 0.92]}}}
    row = sbs.table_lines(records)[2]
    assert "(ours: rs_test_acc_proto) | 90.00 | 92.00 | +2.00 | 90.00 | 92.00 |" in row


def test_stand_ins_are_decided_by_the_interpreter_that_runs_pfllib():
    # a venv's python links to the same base interpreter as ours: it must be asked, not resolved
    assert not benchmark._module_missing("json", sys.executable)
    assert benchmark._module_missing("no_such_module_here_xyz", sys.executable)


def test_a_run_that_failed_shows_where_and_is_compared_only_when_its_curve_is_complete():
    records = {"FedAS": {"flags": [], "pfllib": {"acc": [0.1, 0.5, 0.8], "error": "exit 1: at the summary"},
                         "ours": {"acc": [0.1, 0.6, 0.82]}},
               "FD": {"flags": [], "pfllib": {"acc": [0.1, 0.7], "error": "exit 1: NaN"},
                      "ours": {"acc": [0.1, 0.6, 0.9]}}}
    fedas, fd = sbs.table_lines(records)[2:4]
    assert "| 80.00 (failed after entry 2) | 82.00 | +2.00 |" in fedas
    assert "| 70.00 (failed after entry 1) | 90.00 | – |" in fd


def test_pfllib_runs_unchanged_at_seed_0_and_offsets_every_torch_seed_otherwise(tmp_path):
    import subprocess

    assert sbs.pfllib_argv("FedAvg", [], _args())[0] == "main.py"  # seed 0: exactly PFLlib's own command
    argv = sbs.pfllib_argv("FedAvg", [], _args(seed=2))
    assert argv[:3] == ["-c", sbs.SEEDED_LAUNCHER, "2"] and argv[3:] == sbs.pfllib_argv("FedAvg", [], _args())
    # a stand-in main.py that seeds torch with 0 as PFLlib's does, and prints its argv and first draw
    (tmp_path / "main.py").write_text("import sys, torch\ntorch.manual_seed(0)\n"
                                      "print(sys.argv[1:], torch.rand(1).item())\n")
    outputs = {}
    for seed in (0, 2):
        done = subprocess.run([sys.executable, *sbs.pfllib_argv("FedAvg", [], _args(seed=seed))], cwd=tmp_path,
                              capture_output=True, text=True, check=True)
        outputs[seed] = done.stdout.split("] ")
    import torch

    def first_draw(seed):
        torch.manual_seed(seed)
        return torch.rand(1).item()

    assert outputs[0][0] == outputs[2][0]  # main.py sees the same arguments
    assert float(outputs[0][1]) == pytest.approx(first_draw(0))
    assert float(outputs[2][1]) == pytest.approx(first_draw(2))


def test_seed_summary_gives_mean_std_over_seeds_and_whether_the_gap_is_within_pfllibs_spread():
    def rec(theirs, ours):
        return {"flags": [], "pfllib": {"acc": [0.1, theirs]}, "ours": {"acc": [0.1, ours]}}

    records = {"FedAvg": rec(0.70, 0.75), "FedAvg seed=1": rec(0.72, 0.73), "FedAvg seed=2": rec(0.74, 0.74),
               "Local": rec(0.9, 0.95), "Local seed=1": rec(0.92, 0.96),
               "FD": rec(0.5, 0.5)}  # one seed: no summary row
    records["Local seed=1"]["pfllib"] = {"acc": [0.1], "error": "exit 1"}  # stopped early: left out
    lines = sbs.seed_summary_lines(records, ["FedAvg", "Local"])
    assert len(lines) == 4 and lines[2].startswith("| FedAvg | 3 / 3 |")
    assert "| 72.00 ± 1.63 | 74.00 ± 0.82 | +2.00 | 4.00 | yes |" in lines[2]
    assert lines[3].startswith("| Local | 1 / 2 | 90.00 ± 0.00 | 95.50 ± 0.50 | +5.50 | – | – |")  # one PFLlib seed
    records["FedAvg seed=2"]["ours"]["acc"][-1] = 0.9  # ours 79.33 on average: 7.33 points over PFLlib, spread 4
    assert "| +7.33 | 4.00 | no |" in sbs.seed_summary_lines(records)[2]
    assert sbs.seed_summary_lines({"FD": rec(0.5, 0.5)}) == []


def test_one_side_at_a_time_keeps_the_other_side_of_the_record(tmp_path, monkeypatch):
    (tmp_path / "pfllib" / "system").mkdir(parents=True)
    (tmp_path / "pfllib" / "system" / "main.py").write_text("")
    monkeypatch.setattr(sbs, "OUT", tmp_path / "out")
    monkeypatch.setattr(benchmark, "pfllib_workspace", lambda *a, **k: {})
    monkeypatch.setattr(benchmark, "pfllib_commit", lambda path: "abc")
    monkeypatch.setattr(sbs, "run_pfllib", lambda *a: {"argv": a[3], "acc": [0.1, 0.5]})
    monkeypatch.setattr(sbs, "run_ours", lambda argv, *a: {"argv": argv, "acc": [0.1, 0.6]})
    records = tmp_path / "records.json"
    common = ["--pfllib", str(tmp_path / "pfllib"), "--data", str(tmp_path), "--records", str(records),
              "--only", "FedAvg", "--seed", "1"]
    sbs.main([*common, "--side", "pfllib"])
    record = sbs.load_records(records)["FedAvg seed=1"]
    assert record["pfllib"]["acc"] == [0.1, 0.5] and record["ours"] == {}
    sbs.main([*common, "--side", "ours"])
    record = sbs.load_records(records)["FedAvg seed=1"]
    assert record["pfllib"]["acc"] == [0.1, 0.5] and record["ours"]["acc"] == [0.1, 0.6]
    assert record["pfllib"]["argv"][:3] == ["-c", sbs.SEEDED_LAUNCHER, "1"] and "--seed" in record["ours"]["argv"]
