"""Property test of ``main.py``'s command line: random flag combinations either run a
one-round experiment on tiny data (exit 0, one result file per run) or fail with one ``error:``
line and exit status 2; never a traceback, never a partial file.

The examples are drawn by Hypothesis, derandomised (the same examples on every run, so CI is
reproducible) and bounded (``MAX_EXAMPLES``, each under a deadline): about 20-40 s on a 2-core CPU.
The partitioners' property tests are in ``tests/dataset/test_datagen_partition_skew.py``.
"""
from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from toydata import make_dataset

import main

MAX_EXAMPLES = 40

def floats(low: float, high: float) -> st.SearchStrategy:
    return st.floats(low, high, allow_nan=False).map(repr)


def ints(low: int, high: int) -> st.SearchStrategy:
    return st.integers(low, high).map(str)


def one_of(*values: str) -> st.SearchStrategy:
    return st.sampled_from(values)


#: flag -> (values a run accepts, values past its range or unreadable); mostly good values are
#: drawn, so that most examples run and every bad value still meets the others
FLAGS: dict[str, tuple[st.SearchStrategy, st.SearchStrategy]] = {
    "-algo": (one_of("FedAvg", "FedProx", "SCAFFOLD", "Ditto", "FedPer", "Local"), one_of("FedAvgg", "")),
    "-m": (one_of("MLR", "DNN", "mlr"), one_of("CNN", "NoSuchModel")),  # CNN needs 28x28 inputs
    "-gr": (ints(1, 2), one_of("0", "-1", "two")),
    "-lbs": (ints(1, 60), one_of("0", "-3", "1e9", "ten")),
    "-ls": (ints(1, 2), one_of("0", "-1", "1.5")),
    "-eg": (ints(1, 3), one_of("0", "-2")),
    "-lr": (floats(1e-4, 1.0), one_of("0", "-0.1", "nan", "inf", "1e6", "fast")),
    "-jr": (floats(0.25, 1.0), one_of("0.1", "0", "1.5", "nan", "-1")),
    "-cdr": (floats(0.0, 0.9), one_of("-0.1", "1", "nan")),
    "-tsr": (floats(0.0, 1.0), one_of("-0.5", "1.5", "inf")),
    "-ldg": (floats(0.5, 1.0), one_of("0", "-1", "nan")),
    "-ld": (one_of("True", "False", "1", "no"), one_of("perhaps",)),
    "-rjr": (one_of("True", "False"), one_of("2",)),
    "-t": (ints(1, 2), one_of("0", "-1")),
    "-pv": (one_of("0"), one_of("-1", "2")),
    "-fs": (ints(0, 3), one_of("-1",)),
    "-nc": (one_of("4"), one_of("3", "5", "0")),
    "-ncl": (one_of("10"), one_of("9", "0")),
    "--drop_last": (one_of("True", "False", "0"), one_of("sometimes",)),
    "--engine": (one_of("auto", "sequential", "threaded", "batched"), one_of("warp",)),
    "--avg_last": (ints(1, 3), one_of("0", "-1")),
    "--target_acc": (floats(0.0, 1.0), one_of("1.5", "-0.5", "nan")),
    "--eval_auc": (one_of("True", "False"), one_of("auc",)),
    "--compact_inputs": (one_of("True", "False"), one_of("7",)),
    "--seed": (ints(0, 2**32 - 2), one_of("seed", "1.5", "-1", str(2**32))),  # -t 2 adds 1
}


@st.composite
def command_lines(draw) -> list[str]:
    argv: list[str] = []
    for flag in draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=6, unique=True)):
        good, bad = FLAGS[flag]
        argv += [flag, draw(bad if draw(st.integers(0, 7)) == 0 else good)]
    if draw(st.integers(0, 15)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), "--no-such-flag")
    return argv


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("properties")
    data = make_dataset(root / "data", num_clients=4, input_shape=(1, 8, 8), test_size=6)
    return data, root / "results"


@settings(max_examples=MAX_EXAMPLES, deadline=timedelta(seconds=30), derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(argv=command_lines())
def test_any_command_line_runs_or_is_one_error_line(tiny, capsys, argv):
    data, results_root = tiny
    results_root.mkdir(exist_ok=True)
    results = Path(tempfile.mkdtemp(dir=results_root))
    # -gr 1 first, so that a drawn -gr overrides it; the model is saved nowhere
    base = ["-data", str(data), "-m", "DNN", "-gr", "1", "-dev", "cpu", "--progress", "False", "-q", "True",
            "--results_dir", str(results), "--save_model", "False"]
    try:
        code = main.main([*base, *argv])
    except SystemExit as exc:  # argparse's own errors (unknown flag, unreadable value)
        code = exc.code
    out, err = capsys.readouterr()
    event(f"exit status {code}")  # pytest --hypothesis-show-statistics shows how many examples ran
    assert "Traceback" not in err and "Traceback" not in out
    written = sorted(p.name for p in results.iterdir())
    if code == 0:
        assert written and all(name.endswith(".h5") for name in written), written
        return
    assert code == 2, (code, err)
    lines = err.strip().splitlines()
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert written == [], "a failed run must not leave a result file"
