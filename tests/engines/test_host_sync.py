"""The sequential and threaded engines do no per-step host work that waits for the device:
no ``.item()``/``float(tensor)`` and no host<->device copy inside the SGD loop.

A dispatch mode counts every operator that reads a value back to the host
(``aten._local_scalar_dense``: ``item``, ``float``, ``int``, ``bool`` of a tensor) and every copy
between devices, while the engine trains a cohort once with 2 and once with 5 samples per batch:
the loop runs about 2.5 times as many steps with the small batches, so any per-step read-back
or copy changes the counts, while per-client ones (the round's mean loss, checked once; on a GPU
the epoch's permutation moved once) do not. On the CPU only read-backs exist; where a GPU is
visible the sequential engine is counted there too (the threaded engine is for CPUs).
"""
from __future__ import annotations

import threading
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from flcore.clients.clientbase import Client
from flcore.registry import ALGORITHMS, MODELS
from fltest import image_dataset, make_args
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from fldata.loading import ClientData, FederatedDataset

TRAIN_JOB = Client.train_job  # the base sequence's, wrapped by each count
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")


class HostTraffic(TorchDispatchMode):
    """Counts read-backs and cross-device copies (dispatch modes are per thread: enter it in each)."""

    def __init__(self, counts: Counter, lock: threading.Lock):
        super().__init__()
        self.counts, self.lock = counts, lock

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        kind = None
        if func is torch.ops.aten._local_scalar_dense.default:
            kind = "read-back"
        elif func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            source = args[1] if func is torch.ops.aten.copy_.default else args[0]
            target = args[0] if func is torch.ops.aten.copy_.default else out
            if source.device != target.device:
                kind = "copy"
        if kind:
            with self.lock:
                self.counts[kind] += 1
        return out


def traffic(engine: str, batch_size: int, device: torch.device, monkeypatch) -> Counter:
    """Host traffic of one round of FedAvg's CNN on 4 clients (train_job only: the engine's loop)."""
    data = image_dataset([20, 14, 31, 9], shape=(1, 16, 16))
    clients = [ClientData(c.cid, c.train_x.to(device), c.train_y.to(device), c.test_x.to(device), c.test_y.to(device))
               for c in data.clients]
    data = FederatedDataset(name=data.name, path=data.path, config=dict(data.config), clients=clients)
    flags = {"workers": 2} if engine == "threaded" else {}
    args = make_args("FedAvg", engine=engine, batch_size=batch_size, eval_auc=False, save_model=False, **flags)
    torch.manual_seed(0)
    module = MODELS.get("CNN")(data.input_shape, data.num_classes, None).to(device)
    server = ALGORITHMS.get("FedAvg")(args, data, module, device)
    package = server.make_package(1, list(range(4)))
    counts, lock = Counter(), threading.Lock()

    def counted(self, job, model):  # in whichever thread trains the client
        with HostTraffic(counts, lock):
            return TRAIN_JOB(self, job, model)

    monkeypatch.setattr(Client, "train_job", counted)
    updates = server.engine.train(server.clients, package)
    steps = sum(u.num_steps for u in updates)
    if engine == "threaded":
        assert server.engine.stats["threaded_clients"] == 4
    counts["steps"] = steps
    return counts


@pytest.mark.parametrize("engine, device", [("sequential", "cpu"), ("threaded", "cpu"),
                                            pytest.param("sequential", "cuda", marks=CUDA)])
def test_no_per_step_read_back_or_copy(engine, device, monkeypatch):
    device = torch.device(device)
    many = traffic(engine, 2, device, monkeypatch)
    few = traffic(engine, 5, device, monkeypatch)
    assert many["steps"] >= 2 * few["steps"] > 0  # the loop did run more steps
    assert many["read-back"] == few["read-back"] <= 4  # the mean loss, once per client
    assert many["copy"] == few["copy"] <= (4 if device.type == "cuda" else 0)  # one permutation per client


def test_the_counter_sees_a_per_step_read_back(monkeypatch):
    """The counting itself: a loss hook that reads the loss back each step is caught."""
    original = Client.local_loss

    def reading(self, net, x, y, ctx):
        loss = original(self, net, x, y, ctx)
        float(loss)  # a per-step sync
        return loss

    monkeypatch.setattr(Client, "local_loss", reading)
    many = traffic("sequential", 2, torch.device("cpu"), monkeypatch)
    few = traffic("sequential", 5, torch.device("cpu"), monkeypatch)
    assert many["read-back"] - few["read-back"] == many["steps"] - few["steps"] > 0
