"""Checkpoints and exact resume: a run stopped after round k (by a signal, or by a crash after a
checkpoint) and resumed gives bit-identical results to the uninterrupted run, for every registered
algorithm, with partial participation, dropped uploads and slow clients."""
from __future__ import annotations

import json
import signal

import h5py
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import main
from fltest import ENGINE_EXTRA_FLAGS, one_thread  # noqa: F401 - fixture
from flcore.registry import ALGORITHMS, load_all
from flcore.servers.serverbase import Server
from toydata import make_dataset
from runner.checkpoint import RESUMABLE_FLAGS, checkpoint_path

load_all()
ROUNDS = 4
#: partial participation, -cdr drop-out and -tsr slow clients (fewer epochs, drawn per round)
CONDITIONS = ["-jr", "0.5", "-cdr", "0.25", "-tsr", "0.5", "-ls", "2"]
#: results that are measurements of this machine, not of the simulation
TIMINGS = {"rs_round_time"}
MACHINE_ATTRS = {"wall_time_s", "peak_rss_mb", "peak_gpu_mb", "mean_round_time"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("resume"), num_clients=4, input_shape=(1, 8, 8),
                        train_sizes=[24, 31, 18, 40])


def run_main(data, results, algo, *extra):
    argv = ["-data", str(data), "--results_dir", str(results), "-dev", "cpu", "-gr", str(ROUNDS), "-m", "DNN",
            "-lbs", "8", "-lr", "0.05", "-algo", algo, *ENGINE_EXTRA_FLAGS.get(algo, []), *CONDITIONS,
            "--progress", "False", "-q", "True", *extra]
    return main.main(argv)


def stop_after_round(monkeypatch, k: int, how: str) -> None:
    """After round ``k`` trains, deliver SIGINT to this process ("signal"); or fail at the start of
    round ``k + 1`` ("crash"), after the round-k checkpoint was written."""
    original = Server.run_round

    def run_round(self, rnd, *args, **kwargs):
        if how == "crash" and rnd == k + 1:
            raise RuntimeError("simulated crash")
        result = original(self, rnd, *args, **kwargs)
        if how == "signal" and rnd == k:
            signal.raise_signal(signal.SIGINT)
        return result

    monkeypatch.setattr(Server, "run_round", run_round)


def interrupted_and_resumed(data, tmp_path, monkeypatch, algo, *flags):
    """Run ``algo`` through main uninterrupted, and again stopped by a signal after round 1 then
    resumed; assert the two give the same results and return (reference, resumed) result files."""
    assert run_main(data, tmp_path / "ref", algo, *flags) == 0
    (reference,) = (tmp_path / "ref").glob("*.h5")
    with monkeypatch.context() as patch:
        stop_after_round(patch, 1, "signal")
        assert run_main(data, tmp_path / "res", algo, *flags) == 130
    assert run_main(data, tmp_path / "res", algo, *flags, "--resume") == 0
    (resumed,) = (tmp_path / "res").glob("*.h5")
    assert_same_results(reference, resumed)
    return reference, resumed


def read(path):
    with h5py.File(path, "r") as f:
        arrays = {k: f[k][()] for k in f.keys()}
        attrs = {k: f.attrs[k] for k in f.attrs.keys()}
    return arrays, attrs


def assert_same_results(reference, resumed):
    ref_arrays, ref_attrs = read(reference)
    new_arrays, new_attrs = read(resumed)
    assert set(ref_arrays) == set(new_arrays)
    for key in ref_arrays.keys() - TIMINGS:
        np.testing.assert_array_equal(ref_arrays[key], new_arrays[key], err_msg=key)
    assert len(ref_arrays["rs_round_time"]) == len(new_arrays["rs_round_time"])
    for key in ref_attrs.keys() - MACHINE_ATTRS - {"config"}:
        a, b = ref_attrs[key], new_attrs[key]
        assert a == b or (np.isnan(a) and np.isnan(b)), key
    config = [{k: v for k, v in json.loads(a["config"]).items() if k not in RESUMABLE_FLAGS}
              for a in (ref_attrs, new_attrs)]
    assert config[0] == config[1]
    ref_model, new_model = (load_file(p.with_suffix(".safetensors")) for p in (reference, resumed))
    assert ref_model.keys() == new_model.keys()
    for name in ref_model:
        assert torch.equal(ref_model[name], new_model[name]), name


@pytest.mark.parametrize("algo", ALGORITHMS.names())
def test_resume_after_a_signal_is_exact(algo, data, tmp_path, monkeypatch):
    assert run_main(data, tmp_path / "ref", algo) == 0
    (reference,) = (tmp_path / "ref").glob("*.h5")

    results = tmp_path / "res"
    with monkeypatch.context() as patch:
        stop_after_round(patch, 1, "signal")
        assert run_main(data, results, algo) == 130
    (partial,) = results.glob("*.h5")
    assert not read(partial)[1]["finished"]
    assert read(partial)[1]["stopped_at_round"] == 2
    assert checkpoint_path(partial).exists()
    assert run_main(data, results, algo) == 2  # the unfinished run is kept without --resume

    assert run_main(data, results, algo, "--resume") == 0
    assert read(partial)[1]["finished"]
    assert not checkpoint_path(partial).exists()
    assert_same_results(reference, partial)


@pytest.mark.parametrize("algo", ["SCAFFOLD", "IGFL", "FedALA", "Ditto", "FedACS", "AdaFL", "FedGen"])
def test_resume_after_a_crash_from_the_periodic_checkpoint(algo, data, tmp_path, monkeypatch):
    assert run_main(data, tmp_path / "ref", algo) == 0
    (reference,) = (tmp_path / "ref").glob("*.h5")

    results = tmp_path / "res"
    with monkeypatch.context() as patch:
        stop_after_round(patch, 2, "crash")
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_main(data, results, algo, "--checkpoint_every", "2")
    assert not list(results.glob("*.h5"))  # a crash writes no results...
    (checkpoint,) = results.glob("*.ckpt")  # ...but the checkpoint of round 2 is there
    assert not list(results.glob(".*"))  # no temporary files, and the lock is gone
    assert run_main(data, results, algo, "--checkpoint_every", "2", "--resume") == 0
    (resumed,) = results.glob("*.h5")
    assert_same_results(reference, resumed)


def test_resume_refuses_other_flags(data, tmp_path, monkeypatch, capsys):
    with monkeypatch.context() as patch:
        stop_after_round(patch, 1, "signal")
        assert run_main(data, tmp_path, "FedAvg") == 130
    capsys.readouterr()
    assert run_main(data, tmp_path, "FedAvg", "--resume", "-lr", "0.1", "--seed", "3") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "local_learning_rate (0.05 -> 0.1)" in err and "seed (0 -> 3)" in err
    # flags that do not change the numbers may differ
    assert run_main(data, tmp_path, "FedAvg", "--resume", "--checkpoint_every", "1", "--num_threads", "1") == 0


def test_resume_refuses_a_dataset_changed_since_the_checkpoint(tmp_path, monkeypatch, capsys):
    # Same name, same client count and sizes, rows of one client's file reordered: the flags cannot
    # tell, the data fingerprint does; with the original file back the run resumes.
    folder = make_dataset(tmp_path / "data", num_clients=4, input_shape=(1, 8, 8), train_sizes=[24, 31, 18, 40])
    results = tmp_path / "results"
    with monkeypatch.context() as patch:
        stop_after_round(patch, 1, "signal")
        assert run_main(folder, results, "FedAvg") == 130
    capsys.readouterr()
    client_file = folder / "train" / "2.npz"
    original = client_file.read_bytes()
    with np.load(client_file) as archive:
        arrays = {name: archive[name] for name in archive.files}
    np.savez(client_file, **{name: value[::-1] for name, value in arrays.items()})
    assert run_main(folder, results, "FedAvg", "--resume") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not the one the checkpoint was trained on" in err and "--overwrite" in err
    client_file.write_bytes(original)
    assert run_main(folder, results, "FedAvg", "--resume") == 0


def test_state_store_round_trip_keeps_storage_dtype():
    from flcore.state import ClientStateStore

    store = ClientStateStore("cpu", torch.float16)
    value = torch.tensor([1.0001, -2.5, 3e-8])
    store.set("control", 3, value)
    store.set("count", 1, torch.tensor([7], dtype=torch.int64))
    fresh = ClientStateStore("cpu", torch.float16)
    fresh.load_state_dict(store.state_dict())
    assert torch.equal(fresh.get("control", 3), store.get("control", 3))
    assert fresh.get("control", 3).dtype == torch.float32
    assert torch.equal(fresh.get("count", 1), torch.tensor([7]))
    assert fresh.indices("control") == [3]


def test_checkpoint_is_read_without_pickle(data, tmp_path, monkeypatch):
    """The checkpoint holds tensors and plain data only: ``weights_only`` loading accepts it."""
    with monkeypatch.context() as patch:
        stop_after_round(patch, 1, "signal")
        assert run_main(data, tmp_path, "FedGen") == 130
    (checkpoint,) = tmp_path.glob("*.ckpt")
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["next_round"] == 2 and saved["format"] == "fedcohort-checkpoint"


@pytest.mark.parametrize("store", [["--state_device", "disk"], ["--state_dtype", "float16"]])
@pytest.mark.parametrize("engine", ["sequential", "threaded"])
def test_resume_with_other_state_stores_and_engines(store, engine, data, tmp_path, monkeypatch):
    flags = ["--engine", engine, *store]
    assert run_main(data, tmp_path / "ref", "SCAFFOLD", *flags) == 0
    (reference,) = (tmp_path / "ref").glob("*.h5")
    results = tmp_path / "res"
    with monkeypatch.context() as patch:
        stop_after_round(patch, 2, "signal")
        assert run_main(data, results, "SCAFFOLD", *flags) == 130
    assert run_main(data, results, "SCAFFOLD", *flags, "--resume") == 0
    (resumed,) = results.glob("*.h5")
    assert_same_results(reference, resumed)
