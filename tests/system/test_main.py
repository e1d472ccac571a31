"""main.py end to end: result files, repeated runs, boolean flags and one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys

import h5py
import numpy as np
import pytest

import main
from conftest import PFLLIB_SAMPLE, REPO
from toydata import make_dataset


def run_main(capsys, *argv):
    code = main.main(["-dev", "cpu", "--progress", "False", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("data"), num_clients=4, input_shape=(1, 8, 8))


def test_run_writes_pfllib_compatible_h5(toy, tmp_path, capsys):
    code, out, _ = run_main(capsys, "-data", str(toy), "-m", "DNN", "-gr", "3", "--results_dir", str(tmp_path),
                            "-go", "smoke", "--target_acc", "0.2")
    assert code == 0
    path = tmp_path / "Toy_FedAvg_smoke_0.h5"
    assert path.exists() and str(path) in out
    assert not list(tmp_path.glob(".*.tmp"))
    with h5py.File(path) as f:
        for key in ("rs_test_acc", "rs_test_auc", "rs_train_loss"):
            assert f[key].shape == (4,)  # rounds 0..gr, as PFLlib
        assert list(f["rs_eval_rounds"][()]) == [0, 1, 2, 3]
        assert f["rs_round_time"].shape == (3,) and (f["rs_round_time"][()] > 0).all()
        assert f["rs_client_acc"].shape == (4, 4)
        assert (f["rs_bytes_up"][()] > 0).all() and (f["rs_bytes_down"][()] > 0).all()
        assert f.attrs["peak_rss_mb"] > 0
        assert f.attrs["best_acc"] == pytest.approx(f["rs_test_acc"][()].max())
        assert "rounds_to_target" in f.attrs
        config = json.loads(f.attrs["config"])
        assert config["algorithm"] == "FedAvg" and config["seed"] == 0 and f.attrs["seed"] == 0


def test_same_command_same_numbers(toy, tmp_path, capsys):
    accs = []
    for name in ("a", "b"):
        assert run_main(capsys, "-data", str(toy), "-m", "DNN", "-gr", "3", "-jr", "0.5",
                        "--results_dir", str(tmp_path / name))[0] == 0
        with h5py.File(tmp_path / name / "Toy_FedAvg_test_0.h5") as f:
            accs.append((f["rs_test_acc"][()], f["rs_train_loss"][()]))
    assert np.array_equal(accs[0][0], accs[1][0]) and np.array_equal(accs[0][1], accs[1][1])


def test_repeated_runs_report_mean_and_std(toy, tmp_path, capsys):
    code, out, _ = run_main(capsys, "-data", str(toy), "-m", "MLR", "-gr", "2", "-t", "2",
                            "--results_dir", str(tmp_path))
    assert code == 0
    assert sorted(p.name for p in tmp_path.glob("*.h5")) == ["Toy_FedAvg_test_0.h5", "Toy_FedAvg_test_1.h5"]
    assert "Best accuracy over 2 runs: mean" in out
    with h5py.File(tmp_path / "Toy_FedAvg_test_1.h5") as f:
        assert f.attrs["seed"] == 1


def test_boolean_flags_switch_both_ways():
    assert main.parse_args(["-ab"]).auto_break is True
    assert main.parse_args(["-ab", "False"]).auto_break is False
    assert main.parse_args(["-ab", "True"]).auto_break is True
    assert main.parse_args(["--eval-auc", "0"]).eval_auc is False
    assert main.parse_args(["--global-rounds", "7"]).global_rounds == 7  # dashed alias


def test_help_lists_algorithms_and_models(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main.parse_args(["-h"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "FedAvg" in out and "Local" in out and "CNN" in out and "(default: 0.005)" in out


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["-data", "NoSuchData"], "no generator makes 'NoSuchData'"),
        (["-nc", "7"], "-nc 7 does not match"),
        (["-algo", "FedAvgg"], "did you mean FedAvg"),
        (["-m", "ResNet999"], "unknown model"),
        (["-m", "CNN", "--target_shape"], "unrecognized"),
        (["-jr", "0"], "-jr must be in (0, 1]"),
        (["-jr", "1.5"], "-jr must be in (0, 1]"),
        (["-ncl", "3"], "-ncl 3 does not match"),
        (["-lr", "1e9", "-m", "DNN"], "lower the learning rate"),
        (["-nnc", "4"], "-nnc 4 leaves no client to train"),
        (["-nnc", "1", "-nc", "2"], "pass -nc 3"),
        (["-ften", "2"], "give -nnc N"),
        (["-dlg", "-dlgg", "0"], "-dlgg must be >= 1"),
    ],
)
def test_errors_are_one_line_with_exit_2(toy, tmp_path, capsys, argv, needle):
    argv = [a if a != "--target_shape" else "--no-such-flag" for a in argv]
    if "-data" not in argv:
        argv = ["-data", str(toy), "-m", "DNN", *argv]
    try:
        code, _, err = run_main(capsys, *argv, "-gr", "2", "--results_dir", str(tmp_path))
    except SystemExit as exc:  # argparse's own usage error
        code, err = exc.code, capsys.readouterr().err
    assert code == 2
    assert needle in err
    if "unrecognized" not in needle:
        assert len(err.strip().splitlines()) == 1, err
    results = list(tmp_path.glob("*.h5"))
    if needle == "lower the learning rate":  # a diverged run keeps its results so far, marked unfinished
        assert len(results) == 1 and "kept in" in err
        with h5py.File(results[0]) as f:
            assert not f.attrs["finished"] and f.attrs["stopped_at_round"] >= 0
    else:
        assert not results, "a failed run must not leave a result file"
    assert not list(tmp_path.glob(".*")), "no temporary or lock file is left behind"


def test_a_missing_safetensors_is_refused_before_any_data_is_read(tmp_path, capsys, monkeypatch):
    # the model is written after the last round: without the package a whole run used to end in this error
    real = main.importlib.util.find_spec
    monkeypatch.setattr(main.importlib.util, "find_spec", lambda name, *a: None if name == "safetensors" else real(name, *a))
    code, _, err = run_main(capsys, "-data", str(tmp_path / "absent"), "-m", "DNN", "-gr", "1",
                            "--results_dir", str(tmp_path / "res"))
    assert code == 2 and err.strip().splitlines() == [f"error: {main.SAVE_MODEL_NEEDS_SAFETENSORS}"]
    assert not (tmp_path / "res").exists()
    code, _, err = run_main(capsys, "-data", str(tmp_path / "absent"), "-m", "DNN", "-gr", "1", "--save_model", "False",
                            "--results_dir", str(tmp_path / "res"))
    assert code == 2 and "no config.json" in err  # without a model to write, the flags pass and the data is read


def test_model_that_does_not_fit_the_data(tmp_path, capsys):
    vectors = make_dataset(tmp_path, name="Vec", num_clients=2, input_shape=(12,))
    code, _, err = run_main(capsys, "-data", str(vectors), "-m", "CNN", "-gr", "1", "--results_dir", str(tmp_path))
    assert code == 2 and "model CNN does not fit dataset" in err and len(err.strip().splitlines()) == 1


def test_cuda_request_falls_back_to_cpu_with_one_warning(toy, tmp_path):
    result = subprocess.run(
        [sys.executable, "main.py", "-data", str(toy), "-m", "MLR", "-gr", "1", "-dev", "cuda",
         "--results_dir", str(tmp_path), "--progress", "False", "-q"],
        cwd=REPO / "system", capture_output=True, text=True, timeout=120,
    )
    if "cuda" in result.stdout and "device cuda" in result.stdout:
        pytest.skip("a GPU is present")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "no GPU" in line]
    assert len(warnings) == 1
    assert "Traceback" not in result.stderr


def test_corrupt_client_file_is_one_line(tmp_path, capsys):
    data = make_dataset(tmp_path, name="Broken", num_clients=2, input_shape=(4,))
    (data / "train" / "1.npz").write_bytes(b"not a zip file")
    code, _, err = run_main(capsys, "-data", str(data), "-m", "MLR", "--results_dir", str(tmp_path))
    assert code == 2 and "corrupt" in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(not PFLLIB_SAMPLE.exists(), reason="the PFLlib sample in ../shared/data is absent")
def test_pfllib_pickle_files_need_the_explicit_opt_in(tmp_path, capsys):
    code, _, err = run_main(capsys, "-data", str(PFLLIB_SAMPLE), "-m", "MLR", "-gr", "1",
                            "--results_dir", str(tmp_path))
    assert code == 2 and "convert_pfllib.py" in err and "--legacy-pickle" in err
    code, out, err = run_main(capsys, "-data", str(PFLLIB_SAMPLE), "-m", "CNN", "-gr", "1", "-lbs", "50",
                              "--results_dir", str(tmp_path))
    assert code == 2  # still refused without the flag
    code, out, err = run_main(capsys, "-data", str(PFLLIB_SAMPLE), "-m", "MLR", "-gr", "1", "-lbs", "50",
                              "--legacy_pickle", "--results_dir", str(tmp_path))
    assert code == 0, err
    assert "can execute code" in err
    with h5py.File(next(tmp_path.glob("*.h5"))) as f:
        assert f["rs_test_acc"].shape == (2,)


@pytest.mark.skipif(not PFLLIB_SAMPLE.exists(), reason="the PFLlib sample in ../shared/data is absent")
def test_legacy_label_counts_match_pfllib_config():
    import warnings

    from fldata.loading import load_federated_dataset

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = load_federated_dataset(str(PFLLIB_SAMPLE), legacy_pickle=True)
    stats = json.loads((PFLLIB_SAMPLE / "config.json").read_text())["Size of samples for labels in clients"]
    assert [c.cid for c in dataset.clients] == [1, 2, 6, 7]
    for client in dataset.clients:
        labels = np.concatenate([client.train_y.numpy(), client.test_y.numpy()])
        counts = [[int(k), int(v)] for k, v in zip(*np.unique(labels, return_counts=True))]
        assert counts == [[int(k), int(v)] for k, v in stats[client.cid]]


def test_algorithm_short_flags_are_not_taken_for_generic_prefixes():
    assert main.parse_args(["-algo", "APFL", "-al", "0.5"]).alpha == 0.5  # not "-algo 0.5"
    assert main.parse_args(["-al", "0.5", "--algorithm=APFL"]).algorithm == "APFL"
    args = main.parse_args(["-algo", "FedAdam", "-tau", "0.1"])
    assert args.tau == 0.1 and args.times == 1  # not "-t au"
