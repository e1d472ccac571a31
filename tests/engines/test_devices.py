"""The engines, the state store, ``main`` and the benchmark on each device this machine has.

Every test runs on the CPU and, where a GPU is visible, on CUDA: the CUDA cases are the only ones
that exercise the batched engine's GPU paths (RNG state per device, the caching allocator, the
state store's room check), so a GPU machine runs ``pytest tests/engines/test_devices.py``. The CPU
cases check the tests themselves (and the same code paths with CPU tensors).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import torch

import flcore.state as state_module
import main
from fltest import ENGINE_EXTRA_FLAGS, assert_same_training, image_dataset, make_args
from fltest import one_thread  # noqa: F401  (an autouse fixture: importing it switches it on here)
from flcore.engines.batched import BatchedEngine
from flcore.engines.threaded import ThreadedEngine
from flcore.registry import ALGORITHMS, MODELS
from flcore.state import ClientStateStore, make_state_store
from toydata import make_dataset
from fldata.loading import ClientData, FederatedDataset

SYSTEM = Path(__file__).resolve().parents[2] / "system"
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


def on_device(dataset: FederatedDataset, device: torch.device) -> FederatedDataset:
    """The same clients with their tensors on ``device``."""
    clients = [ClientData(c.cid, c.train_x.to(device), c.train_y.to(device), c.test_x.to(device), c.test_y.to(device))
               for c in dataset.clients]
    return FederatedDataset(name=dataset.name, path=dataset.path, config=dict(dataset.config), clients=clients)


def cnn_run(algo: str, engine: str, device: torch.device, **flags):
    """Three rounds of the CNN on ragged toy images (batch 4, 60% participation, lr decay)."""
    dataset = on_device(image_dataset([2, 9, 14, 5, 21, 11], shape=(1, 16, 16)), device)
    args = make_args(algo, *ENGINE_EXTRA_FLAGS.get(algo, []), "-ld", "True", engine=engine, global_rounds=3,
                     batch_size=4, local_learning_rate=0.05, join_ratio=0.6, eval_auc=False, save_model=False, **flags)
    torch.manual_seed(0)
    module = MODELS.get("CNN")(dataset.input_shape, dataset.num_classes, None).to(device)
    server = ALGORITHMS.get(algo)(args, dataset, module, device)
    server.train(progress=False)
    return server


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algo", ["FedAvg", "FedProx", "SCAFFOLD", "IGFL-C"])
def test_batched_engine_matches_the_sequential_engine_on_the_device(device, algo, monkeypatch):
    device = torch.device(device)
    # cuDNN's default TF32 convolutions round to 10 mantissa bits, differently for the grouped
    # convolution vmap makes and the plain one: compare the engines' arithmetic in float32
    # (matrix products are float32 by default already)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    ref = cnn_run(algo, "sequential", device)
    out = cnn_run(algo, "batched", device)
    assert out.engine.stats["sequential_clients"] == 0 and out.engine.stats["batched_clients"] > 0
    assert out.global_params.device.type == device.type
    assert_same_training(ref, out, atol=1e-5 if device.type == "cpu" else 1e-4, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_auto_engine_picks_batched_on_a_gpu_and_threads_on_a_cpu(device):
    server = cnn_run("FedAvg", "auto", torch.device(device))
    expected = BatchedEngine if device == "cuda" else ThreadedEngine
    assert isinstance(server.engine, expected)  # auto builds the engine it picks


@CUDA
def test_state_lives_on_the_gpu_until_it_would_be_too_full_then_on_the_cpu(monkeypatch):
    gpu = torch.device("cuda", torch.cuda.current_device())
    store = make_state_store(make_args("SCAFFOLD"), gpu)
    store.set("control", 0, torch.ones(1000, device=gpu))
    assert store._entries["control"][0].device.type == "cuda" and not store.spilling
    monkeypatch.setattr(state_module, "GPU_RESERVE", 1.0)  # no GPU can keep all its memory free
    store.set("control", 1, torch.full((1000,), 2.0, device=gpu))
    assert store._entries["control"][1].device.type == "cpu" and store.spilling
    assert store.get("control", 1).device == gpu and float(store.get("control", 1)[0]) == 2.0
    assert store.nbytes_on("cuda") == store.nbytes_on("cpu") == 4000


@pytest.mark.parametrize("device", DEVICES)
def test_state_store_returns_vectors_on_the_compute_device(device):
    device = torch.device(device)
    store = ClientStateStore(device, torch.float16, spill_to="cpu" if device.type == "cuda" else None)
    value = torch.linspace(-1, 1, 7, device=device)
    store.set("u", 3, value)
    got = store.get("u", 3)
    assert got.device.type == device.type and got.dtype == torch.float32
    assert torch.equal(got, value.half().float())


@pytest.mark.parametrize("device", DEVICES)
def test_main_runs_end_to_end_on_the_device(device, tmp_path):
    folder = make_dataset(tmp_path, num_clients=4, input_shape=(1, 16, 16))
    results = tmp_path / "res"
    rc = main.main(["-data", str(folder), "--results_dir", str(results), "-dev", device, "-gr", "2", "-m", "CNN",
                    "-algo", "SCAFFOLD", "--progress", "False", "-q", "True", "--save_model", "False"])
    assert rc == 0
    (h5,) = sorted(results.glob("*.h5"))
    with h5py.File(h5, "r") as f:
        assert len(f["rs_test_acc"]) == 3 and len(f["rs_round_time"]) == 2
        assert ("peak_gpu_mb" in f.attrs) == (device == "cuda")
        config = json.loads(f.attrs["config"])
        assert config["device"] == device


@pytest.mark.parametrize("device", DEVICES)
def test_benchmark_smoke_run_on_the_device(device, tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "benchmark.py", "--device", device, "--only", "P2", "--quick", "--p2-clients", "20",
         "--engines", "sequential", "batched", "--threads", "1", "--out", str(out)],
        cwd=SYSTEM, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "batched/sequential" in done.stdout
    results = json.loads(out.read_text())["results"]
    assert [r["engine"] for r in results] == ["sequential", "batched"]
    for r in results:
        assert r["device"].startswith(device) and r["s_per_round"] > 0
        assert ("peak_gpu_mb" in r) == (device == "cuda")
    assert results[1]["engine_stats"]["batched_clients"] > 0
