"""Every registered algorithm runs two rounds through main.py and writes a valid result file; each of
PFLlib's 40 ``-algo`` names does so from the command line a PFLlib user writes for it."""
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
from cli.flags import IGNORED_DEST, PFLLIB_ALGORITHM_FLAGS

#: PFLlib's 40 ``-algo`` names (d832e76's main.py) -> the algorithm's own flags as a PFLlib user writes them
#: (PFLlib's short spellings; every flag the algorithm's PFLlib code reads, with a value that switches
#: the method on where PFLlib's default switches it off). Run as PFLlib's README example,
#: ``-data D -m M -algo NAME -gr R -did 0 -nc N -ncl 10`` followed by these (see :func:`pfllib_command`).
PFLLIB_COMMANDS: dict[str, list[str]] = {
    "FedAvg": [], "Local": [], "FedPer": [], "LG-FedAvg": [], "FedBN": [], "FedROD": [], "FedAS": [],
    "FedMTL": ["-itk", "4000"],
    "PerAvg": ["-bt", "0.001"],
    "pFedMe": ["-lam", "15", "-K", "5", "-lrp", "0.01", "-bt", "1"],
    "FedProx": ["-mu", "0.01"],
    "FedFomo": ["-M", "5"],
    "FedAMP": ["-alk", "1.0", "-lam", "1.0", "-sg", "1.0"],
    "APFL": ["-al", "0.5"],
    "Ditto": ["-mu", "0.1", "-pls", "1"],
    "FedRep": ["-pls", "5"],
    "FedPHP": ["-lam", "1.0", "-mu", "0.9"],
    "FedProto": ["-lam", "1.0"],
    "FedDyn": ["-al", "0.01"],
    "MOON": ["-mu", "1", "-tau", "0.5"],
    "FedBABU": ["-fte", "2"],
    "APPLE": ["-dlr", "0.01", "-L", "0.2", "-mu", "0.1"],
    "FedGen": ["-nd", "16", "-glr", "0.005", "-hd", "16", "-se", "20"],  # a small generator: the test's seconds
    "SCAFFOLD": ["-slr", "1.0"],
    "FD": ["-lam", "1.0"],
    "FedALA": ["-et", "1", "-s", "80", "-p", "2"],
    "FedPAC": ["-lam", "1.0"],
    "FedGC": ["-lam", "1.0"],
    "FML": ["-al", "0.5", "-bt", "0.5"],
    "FedKD": ["-mlr", "0.005", "-Ts", "0.95", "-Te", "0.98"],
    "FedPCL": ["-tau", "1.0"],
    "FedCP": ["-lam", "1.0"],
    "GPFL": ["-lam", "0.01", "-mu", "0.1"],
    "FedNTD": ["-bt", "1.0", "-tau", "1.0"],
    "FedGH": ["-slr", "0.01"],
    "FedDBE": ["-mo", "0.1", "-klw", "1.0"],
    "FedCAC": ["-tau", "0.5", "-bt", "50"],
    "PFL-DA": ["-lam", "1.0"],
    "FedLC": ["-tau", "1.0"],
    "FedCross": ["-fsb", "0", "-ca", "0.99", "-cmss", "1"],
}


def pfllib_command(algorithm: str, data, model: str = "DNN", rounds: int = 1, clients: int = 4) -> list[str]:
    """PFLlib's README example for ``algorithm`` with its own flags (PFLlib's spellings only)."""
    return ["-data", str(data), "-m", model, "-algo", algorithm, "-gr", str(rounds), "-did", "0",
            "-nc", str(clients), "-ncl", "10", *PFLLIB_COMMANDS[algorithm]]


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
    from flcore.engines.ray.warm import keep_actors_warm
    import ray

    if ray.is_initialized():
        ray.shutdown()
    start_local_ray(2, extra_paths=(HELPERS,))
    keep_actors_warm()  # one algorithm's actors serve the next (tests/engines/test_ray.py: no change in numbers)
    yield
    keep_actors_warm(False)
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
    """Two rounds of ``algorithm``; PFLlib's names from PFLlib's own command line (:func:`pfllib_command`),
    the harness's flags (device, quiet, results folder, engine) after it."""
    command = (pfllib_command(algorithm, toy, rounds=2) if algorithm in PFLLIB_COMMANDS else
               ["-data", str(toy), "-m", "DNN", "-algo", algorithm, "-gr", "2", *REQUIRED_FLAGS.get(algorithm, [])])
    code = main.main([*command, "-jr", "0.75", "-dev", "cpu", "--progress", "False", "-q", "--results_dir", str(results),
                      "--engine", engine, *(["--ray_workers", "2"] if engine == "ray" else [])])
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


def test_pfllib_names_are_all_registered():
    assert len(PFLLIB_COMMANDS) == 40
    assert set(PFLLIB_COMMANDS) <= set(list_algorithms())


SPELLINGS = {short: (long[2:], kind) for short, long, kind, _ in PFLLIB_ALGORITHM_FLAGS}


@pytest.mark.parametrize("algorithm", sorted(PFLLIB_COMMANDS))
def test_pfllib_command_line_is_used_unchanged(algorithm):
    """Each of PFLlib's names parses its PFLlib command line, and every flag PFLlib's code of that
    algorithm reads is one this algorithm reads too, with the value given (none ignored with an info
    line). The runs themselves: the two-round smoke above, from the same command lines."""
    args = main.parse_args(pfllib_command(algorithm, "MNIST") + ["-dev", "cpu"])
    assert getattr(args, IGNORED_DEST) == [], f"{algorithm} ignores PFLlib's {getattr(args, IGNORED_DEST)}"
    assert (args.algorithm, args.global_rounds, args.device_id, args.num_clients, args.num_classes) == \
        (algorithm, 1, "0", 4, 10)
    flags = PFLLIB_COMMANDS[algorithm]
    for short, value in zip(flags[::2], flags[1::2]):
        dest, kind = SPELLINGS[short]
        assert getattr(args, dest) == kind(value), f"{algorithm} {short} {value}: parsed {getattr(args, dest)!r}"
