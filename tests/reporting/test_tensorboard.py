"""``--tensorboard DIR``: per-round scalars that match the result file, or one line without the package."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import main
from toydata import make_dataset

SYSTEM = Path(__file__).resolve().parents[2] / "system"
HAVE_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data"), num_clients=4, input_shape=(1, 8, 8))


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.mark.skipif(not HAVE_TENSORBOARD, reason="the optional tensorboard package is not installed "
                                                 "(.ci/run installs it; pip install tensorboard)")
def test_scalars_per_round_match_the_result_file(toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    board = tmp_path / "tb"
    code = main.main(["-dev", "cpu", "--progress", "False", "-q", "-data", str(toy), "-m", "DNN", "-gr", "3",
                      "-eg", "2", "-t", "2", "-algo", "Ditto", "--results_dir", str(tmp_path / "res"),
                      "--tensorboard", str(board)])
    assert code == 0, capsys.readouterr().err
    for run in range(2):
        logged = scalars(board / f"Toy_Ditto_test_{run}")
        with h5py.File(tmp_path / "res" / f"Toy_Ditto_test_{run}.h5") as f:
            stored = {key: f[key][()] for key in f.keys()}
        # Evaluations at rounds 0, 2 and 3 (the last), at the round's step.
        assert [s for s, _ in logged["test/acc"]] == stored["rs_eval_rounds"].tolist() == [0, 2, 3]
        np.testing.assert_allclose([v for _, v in logged["test/acc"]], stored["rs_test_acc"], rtol=1e-6)
        np.testing.assert_allclose([v for _, v in logged["train/loss"]], stored["rs_train_loss"], rtol=1e-6)
        np.testing.assert_allclose([v for _, v in logged["test/acc_global"]], stored["rs_test_acc_global"], rtol=1e-6)
        # Training round t is step t + 1, the round whose accuracy it produced.
        assert [s for s, _ in logged["round/seconds"]] == [1, 2, 3]
        np.testing.assert_allclose([v for _, v in logged["round/seconds"]], stored["rs_round_time"], rtol=1e-6)
        np.testing.assert_allclose([v for _, v in logged["round/bytes_up"]], stored["rs_bytes_up"], rtol=1e-6)


def test_missing_package_is_one_line_before_any_work(toy: Path, tmp_path: Path) -> None:
    # A module named tensorboard that cannot be found: python -c hides the installed one.
    script = ("import importlib.util, sys; real = importlib.util.find_spec; "
              "importlib.util.find_spec = lambda name, *a: None if name == 'tensorboard' else real(name, *a); "
              "import main; sys.exit(main.main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", script, "-dev", "cpu", "-data", str(tmp_path / "absent"),
                           "-gr", "1", "--tensorboard", str(tmp_path / "tb")],
                          cwd=SYSTEM, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    # Refused when the flags are read: the missing dataset is not even looked at.
    assert "pip install tensorboard" in proc.stderr and "absent" not in proc.stderr
    assert not (tmp_path / "tb").exists()
