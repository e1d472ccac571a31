"""Every registered algorithm runs two rounds through main.py and writes a valid result file."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import h5py
import numpy as np
import pytest

import main
from flcore.registry import ALGORITHMS, list_algorithms
from fltest import REQUIRED_FLAGS
from toydata import make_dataset


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("all"), num_clients=4, input_shape=(1, 8, 8))


def test_registry_rejects_duplicates():
    list_algorithms()
    with pytest.raises(RuntimeError, match="registered twice"):
        ALGORITHMS.register("FedAvg")(type("Impostor", (), {}))


HAVE_RAY = importlib.util.find_spec("ray") is not None
HELPERS = str(Path(__file__).resolve().parent)


@pytest.fixture(scope="module")
def local_ray():
    """One Ray instance (127.0.0.1 only, 2 CPUs) for this module's ``--engine ray`` runs."""
    from flcore.engines.ray import start_local_ray
    import ray

    if ray.is_initialized():
        ray.shutdown()
    start_local_ray(2, extra_paths=(HELPERS,))
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def sequential_arrays():
    """algorithm -> the arrays of its result file with the default engine (filled by the first test)."""
    return {}


def result_arrays(path) -> dict:
    """Every dataset of a result file except timings."""
    with h5py.File(path) as f:
        return {name: f[name][()] for name in f if "time" not in name}


def two_rounds(algorithm, engine, toy, results):
    code = main.main(["-data", str(toy), "-m", "DNN", "-algo", algorithm, "-gr", "2", "-jr", "0.75",
                      "-dev", "cpu", "--progress", "False", "-q", "--results_dir", str(results), "--engine", engine,
                      *REQUIRED_FLAGS.get(algorithm, []),
                      *(["--ray_workers", "2"] if engine == "ray" else [])])
    assert code == 0
    return results / f"Toy_{algorithm}_test_0.h5"


@pytest.mark.parametrize("engine", [
    "auto",
    pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (./prepare.sh --ray)")]),
])
@pytest.mark.parametrize("algorithm", list_algorithms())
def test_two_rounds_write_a_valid_h5(algorithm, engine, toy, tmp_path, request, sequential_arrays):
    """Every algorithm through main.py; with ``--engine ray`` (2 actors) the result file's arrays equal
    those of the default engine (threaded here, itself bit-identical to sequential: tests/engines)."""
    if engine == "ray":
        request.getfixturevalue("local_ray")
    path = two_rounds(algorithm, engine, toy, tmp_path)
    with h5py.File(path) as f:
        acc = f["rs_test_acc"][()]
        assert acc.shape == (3,) and np.isfinite(acc).all() and ((acc >= 0) & (acc <= 1)).all()
        assert f.attrs["algorithm"] == algorithm
    if engine == "auto":
        sequential_arrays[algorithm] = result_arrays(path)
    else:
        if algorithm not in sequential_arrays:
            sequential_arrays[algorithm] = result_arrays(two_rounds(algorithm, "sequential", toy, tmp_path / "seq"))
        ref, out = sequential_arrays[algorithm], result_arrays(path)
        assert ref.keys() == out.keys()
        for name in ref:
            # equal_nan: a series may be undefined (NaN) in some rounds (FedProto's prototype accuracy in round 0)
            assert np.array_equal(ref[name], out[name], equal_nan=ref[name].dtype.kind == "f"), \
                f"{algorithm}: {name} differs under --engine ray"
