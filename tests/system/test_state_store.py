"""Per-client state: lazy creation, storage dtype (``--state_dtype``), and the rule that callers
persist what they change with ``set`` (never by modifying what ``get`` returned)."""
from __future__ import annotations

import pytest
import torch

from fltest import ENGINE_EXTRA_FLAGS, assert_same_training, build_server, make_args, random_dataset
from fltest import one_thread  # noqa: F401  (an autouse fixture: importing it switches it on here)
from flcore.registry import list_algorithms
import flcore.state as state_module
from flcore.state import STATE_DTYPES, ClientStateStore, DiskStateStore, make_state_store
from utils.mem_utils import OUT_OF_MEMORY
from utils.errors import FLError

EXTRA_FLAGS = ENGINE_EXTRA_FLAGS


def test_float16_storage_halves_memory_and_returns_float32():
    store = ClientStateStore("cpu", torch.float16)
    value = torch.tensor([1.0, 1 / 3, -2.5e-3, 1e-9])
    store.set("control", 4, value)
    assert store.nbytes() == 4 * 2
    got = store.get("control", 4)
    assert got.dtype == torch.float32
    assert torch.equal(got, value.half().float())  # exactly what float16 keeps (1e-9 underflows to 0)
    store.set("control", 4, 2 * value)  # same shape: written into the existing float16 storage
    assert torch.equal(store.get("control", 4), (2 * value).half().float())
    created = store.get("personal", 1, init=lambda: torch.full((3,), 0.1))
    assert created.dtype == torch.float32 and torch.equal(created, torch.full((3,), 0.1).half().float())
    alpha = torch.tensor([0.25], dtype=torch.float64)  # only float32 vectors are stored compactly
    store.set("alpha", 0, alpha)
    assert store.get("alpha", 0).dtype == torch.float64
    assert store.nbytes() == 4 * 2 + 3 * 2 + 8


def test_without_a_dtype_get_returns_the_stored_tensor():
    store = ClientStateStore("cpu")
    store.set("u", 0, torch.ones(3))
    assert store.get("u", 0) is store.get("u", 0)
    assert store.get("v", 0) is None and not store.has("v", 0)


def test_flag_choices():
    assert make_args("FedAvg").state_dtype == "float32"
    assert make_args("SCAFFOLD", state_dtype="float16").state_dtype == "float16"
    assert set(STATE_DTYPES) == {"float32", "float16", "bfloat16"}
    with pytest.raises(SystemExit):
        make_args("FedAvg", state_dtype="int8")


def _train(algo: str, state_dtype: str, **settings):
    dataset = random_dataset(num_clients=5, dim=6, num_classes=3, sizes=[9, 12, 25, 30, 17], seed=1)
    flags = dict(global_rounds=3, batch_size=5, local_learning_rate=0.05, join_ratio=0.6, eval_auc=False,
                 save_model=False, engine="sequential")
    try:
        args = make_args(algo, *EXTRA_FLAGS.get(algo, []), **flags)
    except SystemExit:
        args = make_args(algo, **flags)
    args.state_dtype = state_dtype
    for name, value in settings.items():
        setattr(args, name, value)
    server = build_server(args, dataset)
    server.train(progress=False)
    return server


@pytest.mark.parametrize("algo", list_algorithms())
def test_every_algorithm_persists_its_state_through_set(algo, monkeypatch):
    """Stored as float64, state round-trips float32 exactly but ``get`` returns a copy: an algorithm
    that changed the returned tensor in place instead of calling ``set`` would lose the change."""
    monkeypatch.setitem(STATE_DTYPES, "float64", torch.float64)
    try:
        ref = _train(algo, "float32")
    except Exception as exc:  # noqa: BLE001 - the algorithm itself fails on this toy set-up
        pytest.skip(f"{algo} does not run on this toy set-up: {exc!r}")
    copy = _train(algo, "float64")
    assert torch.equal(ref.global_params, copy.global_params)
    for i in range(len(ref.clients)):
        assert torch.equal(ref.eval_params(i), copy.eval_params(i)), f"client {i}'s model differs"
    assert ref.history.test_acc == copy.history.test_acc


def test_scaffold_with_float16_state_stays_close_and_uses_half_the_memory():
    full, half = _train("SCAFFOLD", "float32"), _train("SCAFFOLD", "float16")
    assert half.state.nbytes() * 2 == full.state.nbytes() > 0
    torch.testing.assert_close(half.global_params, full.global_params, atol=1e-3, rtol=1e-3)
    assert not torch.equal(half.global_params, full.global_params)  # the rounding is real


# ------------------------------------------------------------------ --state_device disk
def test_disk_store_round_trips_exactly_and_holds_nothing_in_memory(tmp_path):
    store = DiskStateStore("cpu", None, tmp_path)
    a, b = torch.randn(1000), torch.randn(1000)
    store.set("control", 7, a)
    store.set("control", 2, b)
    assert torch.equal(store.get("control", 7), a) and torch.equal(store.get("control", 2), b)
    assert store.get("control", 7) is not store.get("control", 7)  # a fresh tensor each time
    store.set("control", 7, 3 * a)  # overwritten in place: no new record
    assert torch.equal(store.get("control", 7), 3 * a) and torch.equal(store.get("control", 2), b)
    assert store.nbytes() == 2 * 1000 * 4 and store.resident_nbytes() == 0
    assert store.indices("control") == [2, 7] and store.has("control", 2) and not store.has("control", 3)
    assert store.get("personal", 1) is None and store.names() == ["control"]
    created = store.get("personal", 1, init=lambda: torch.full((5,), 0.5))
    assert torch.equal(created, torch.full((5,), 0.5)) and torch.equal(store.get("personal", 1), created)
    alpha = torch.tensor([0.25], dtype=torch.float64)
    store.set("alpha", 0, alpha)
    assert store.get("alpha", 0).dtype == torch.float64 and torch.equal(store.get("alpha", 0), alpha)
    store.set("personal", 1, torch.ones(2, 3))  # another shape: a new record elsewhere
    assert torch.equal(store.get("personal", 1), torch.ones(2, 3))
    assert list(tmp_path.iterdir()) == []  # anonymous files: nothing to clean up after a crash
    store.close()


def test_disk_store_with_float16_rounds_like_the_memory_store(tmp_path):
    memory, disk = ClientStateStore("cpu", torch.float16), DiskStateStore("cpu", torch.float16, tmp_path)
    value = torch.tensor([1.0, 1 / 3, -2.5e-3, 1e-9])
    for store in (memory, disk):
        store.set("control", 4, value)
        store.get("personal", 0, init=lambda: value / 7)
    assert torch.equal(memory.get("control", 4), disk.get("control", 4))
    assert torch.equal(memory.get("personal", 0), disk.get("personal", 0))
    assert disk.get("control", 4).dtype == torch.float32 and memory.nbytes() == disk.nbytes() == 16


def test_disk_store_bfloat16_records(tmp_path):
    store = DiskStateStore("cpu", torch.bfloat16, tmp_path)
    value = torch.linspace(-3, 3, 11)
    store.set("u", 0, value)
    assert torch.equal(store.get("u", 0), value.bfloat16().float())


def test_state_store_flags(tmp_path):
    assert isinstance(make_state_store(make_args("SCAFFOLD", state_device="disk", state_dir=tmp_path),
                                       torch.device("cpu")), DiskStateStore)
    assert type(make_state_store(make_args("SCAFFOLD"), torch.device("cpu"))) is ClientStateStore
    with pytest.raises(FLError, match="--state_dir"):
        make_state_store(make_args("SCAFFOLD", state_device="disk", state_dir=tmp_path / "missing"),
                         torch.device("cpu"))
    with pytest.raises(FLError, match="not a device"):
        make_state_store(make_args("SCAFFOLD", state_device="floppy"), torch.device("cpu"))


@pytest.mark.parametrize("algo", list_algorithms())
def test_every_algorithm_gives_the_same_run_with_state_on_disk(algo, tmp_path):
    try:
        ref = _train(algo, "float32")
    except Exception as exc:  # noqa: BLE001 - the algorithm itself fails on this toy set-up
        pytest.skip(f"{algo} does not run on this toy set-up: {exc!r}")
    disk = _train(algo, "float32", state_device="disk", state_dir=str(tmp_path))
    assert isinstance(disk.state, DiskStateStore)
    assert_same_training(ref, disk, exact=True)
    assert disk.state.nbytes() == ref.state.nbytes() and disk.state.resident_nbytes() == 0


def test_closing_the_server_releases_the_state_files_and_the_workers(tmp_path):
    server = _train("SCAFFOLD", "float32", state_device="disk", state_dir=str(tmp_path), engine="threaded",
                    workers=2)
    files = [f.file for f in server.state._files.values()]
    assert files and not any(f.closed for f in files)
    assert server.engine._pool is not None  # the workers trained this run's clients
    server.close()
    assert all(f.closed for f in files) and server.engine._pool is None
    server.close()  # twice is harmless


# ------------------------------------------------------------------ --state_device auto on a full GPU
class _FakeDevice:
    """A ``total``-byte accelerator simulated for a store whose two devices are both the CPU: the
    copies ``store`` makes onto ``store.device`` (that very object) are recorded and counted against
    ``total``, and fail with out-of-memory while ``full``; ``device_room`` reports what is left."""

    def __init__(self, monkeypatch, store, total=1000, full=False):
        self.total, self.full, self.used, self.placed = total, full, 0, []
        original = torch.Tensor.to

        def to(tensor, *args, **kwargs):
            if not kwargs.get("copy"):  # get's move to the compute device, not a stored vector
                pass
            elif args and args[0] is store.device:
                if self.full:
                    raise OUT_OF_MEMORY("CUDA out of memory (simulated)")
                self.placed.append("device")
                self.used += tensor.numel() * kwargs["dtype"].itemsize
            elif args and args[0] is store.spill_to:
                self.placed.append("spill")
            return original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "to", to)
        monkeypatch.setattr(state_module, "device_room", lambda device: (self.total - self.used, self.total))


def test_auto_state_moves_new_vectors_to_the_cpu_once_the_gpu_would_be_too_full(monkeypatch, caplog):
    store = ClientStateStore("cpu", spill_to="cpu")
    fake = _FakeDevice(monkeypatch, store)
    values = [torch.full((40,), float(i)) for i in range(7)]  # 160 bytes each
    with caplog.at_level("INFO", logger="fl"):
        for i, value in enumerate(values):
            store.set("u", i, value)
    # 1000 - 160 k - 160 >= 250 (a quarter kept free) holds for k = 0..3: four vectors fit
    assert fake.placed == ["device"] * 4 + ["spill"] * 3
    assert store.spilling
    notices = [r.getMessage() for r in caplog.records if r.getMessage().startswith("state:")]
    assert len(notices) == 1 and "less than 25% of its memory" in notices[0]
    for i, value in enumerate(values):
        assert torch.equal(store.get("u", i), value)
    store.set("u", 1, -values[1])  # an update is written where the vector already is
    assert fake.placed == ["device"] * 4 + ["spill"] * 3 and torch.equal(store.get("u", 1), -values[1])


def test_auto_state_moves_to_the_cpu_when_an_allocation_fails_and_a_plain_store_fails(monkeypatch):
    store = ClientStateStore("cpu", spill_to="cpu")
    fake = _FakeDevice(monkeypatch, store, total=10**9)
    store.set("u", 0, torch.ones(3))
    fake.full = True  # something else filled the GPU
    store.set("u", 1, torch.full((3,), 2.0))
    fake.full = False
    store.set("u", 2, torch.full((3,), 3.0))  # once moving, new vectors stay on the CPU
    assert fake.placed == ["device", "spill", "spill"] and store.spilling
    assert [store.get("u", i)[0].item() for i in range(3)] == [1.0, 2.0, 3.0]

    plain = ClientStateStore("cpu")  # --state_device cuda: a full GPU is the run's error
    _FakeDevice(monkeypatch, plain, full=True)
    with pytest.raises(OUT_OF_MEMORY):
        plain.set("u", 0, torch.ones(3))


def test_auto_state_device_moves_to_the_cpu_only_from_an_accelerator():
    assert make_state_store(make_args("SCAFFOLD"), torch.device("cpu")).spill_to is None
    gpu_store = make_state_store(make_args("SCAFFOLD"), torch.device("cuda", 0))  # allocates nothing
    assert gpu_store.device == torch.device("cuda", 0) and gpu_store.spill_to == torch.device("cpu")
    assert make_state_store(make_args("SCAFFOLD", state_device="cuda"), torch.device("cuda", 0)).spill_to is None
