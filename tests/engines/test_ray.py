"""The Ray engine (``--engine ray``) against the sequential engine, on a real Ray instance bound to
127.0.0.1 (one per module, 2 CPUs, 2 actors) and on a two-node ``ray.cluster_utils.Cluster``.

Like the threaded engine, every actor trains on one intra-op thread, and these tests run the
sequential engine on one thread (the ``one_thread`` fixture), so results must agree to the last bit:
every array of the result file (timings aside), the per-client state and the client attributes.
Ray is an optional dependency: the tests that need it skip with a reason where it is absent.
"""
from __future__ import annotations

import ctypes
import importlib.util
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import torch

import main
from flcore.engines.ray import RayEngine, assign_by_samples, first_line, start_local_ray
from flcore.engines.ray.warm import WARM, keep_actors_warm
from fltest import ENGINE_SIZES, assert_same_training, build_server, engine_run, make_args, random_dataset
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from raycrash import crashing_worker
from multilabel_data import make_tag_dataset
from toydata import make_dataset

HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = [pytest.mark.ray, pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (./prepare.sh --ray)")]
HELPERS = str(Path(__file__).resolve().parents[1] / "system")  # fltest's models must import in the actors


@pytest.fixture(scope="module")
def local_ray():
    """One Ray instance for the module's tests: this machine only (127.0.0.1), 2 CPUs, small object store."""
    if not HAVE_RAY:
        pytest.skip("ray is not installed (./prepare.sh --ray)")
    import ray

    if ray.is_initialized():
        ray.shutdown()
    own = signal.signal(signal.SIGTERM, stop_after_the_round)  # the handler a run has when Ray starts
    start_local_ray(2, extra_paths=(HELPERS,))
    HANDLER_AFTER_START.append(signal.getsignal(signal.SIGTERM))
    signal.signal(signal.SIGTERM, own)
    keep_actors_warm()  # one test's actors serve the next (a test of their own checks they change nothing)
    yield ray
    keep_actors_warm(False)
    ray.shutdown()


def stop_after_the_round(signum, frame) -> None:
    """Stands for a run's SIGTERM handler (runner.run_control.StopOnSignal)."""


#: the SIGTERM handler the process had after ``start_local_ray`` (filled by ``local_ray``)
HANDLER_AFTER_START: list = []


@pytest.mark.usefixtures("local_ray")
@pytest.mark.ray
def test_starting_ray_keeps_the_processs_signal_handlers():
    """ray.init replaces the SIGTERM handler with one that exits where the process stands; the run's
    own (stop after the round, keep the results) must stay in place when the engine starts Ray."""
    assert HANDLER_AFTER_START == [stop_after_the_round]


def private_memory_bytes() -> int:
    """This process's anonymous (private) resident memory: its own heap and tensors. The shared pages
    of Ray's object store that it maps count in its RSS too, but they are the object store's memory,
    bounded by its size, whatever the number of clients."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed blocks (the answers' tensors) for reuse
    with open("/proc/self/smaps_rollup") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return int(fields["Anonymous"].split()[0]) * 1024


def run_main(folder: Path, results: Path, algorithm: str, *flags: str) -> Path:
    code = main.main(["-data", str(folder), "-m", "DNN", "-algo", algorithm, "-gr", "3", "-jr", "0.5", "-lbs", "4",
                      "-dev", "cpu", "--progress", "False", "-q", "--num_threads", "1", "--save_model", "False",
                      "--results_dir", str(results), *flags])
    assert code == 0
    (path,) = results.glob("*.h5")
    return path


def h5_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every dataset of a result file except timings (which differ from run to run)."""
    with h5py.File(path) as f:
        return {name: f[name][()] for name in f if "time" not in name}


# ---------------------------------------------------------------- without a Ray instance
def test_bad_ray_flags_are_one_line(tmp_path, capsys):
    folder = make_dataset(tmp_path, num_clients=4, input_shape=(1, 8, 8))
    for flag, value in (("--ray_workers", "-1"), ("--ray_cpus_per_worker", "0"), ("--ray_max_restarts", "-2")):
        code = main.main(["-data", str(folder), "-m", "DNN", "-gr", "1", "-dev", "cpu", "--engine", "ray", flag, value,
                          "--results_dir", str(tmp_path / "res"), "-q"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and flag in err and "Traceback" not in err


def test_missing_ray_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without ray looks like to find_spec
    folder = make_dataset(tmp_path, num_clients=4, input_shape=(1, 8, 8))
    code = main.main(["-data", str(folder), "-m", "DNN", "-gr", "1", "-dev", "cpu", "--engine", "ray",
                      "--results_dir", str(tmp_path / "res"), "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == "error: --engine ray needs the ray package: run ./prepare.sh --ray " \
                                "(or pip install -r requirements-ray.txt)"


def test_precision_the_actors_cannot_run_is_one_line(tmp_path, capsys):
    """Refused by the driver, before Ray starts: TF32 on CPU actors, bf16 with DP-SGD."""
    folder = make_dataset(tmp_path, num_clients=4, input_shape=(1, 8, 8))
    for extra in (["--precision", "tf32"], ["--precision", "bf16", "-dp", "True"]):
        code = main.main(["-data", str(folder), "-m", "DNN", "-gr", "1", "-dev", "cpu", "--engine", "ray", *extra,
                          "--results_dir", str(tmp_path / "res"), "-q"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "--precision" in err and "Traceback" not in err
    assert not list((tmp_path / "res").glob("*.h5"))


def test_a_remote_error_is_reported_by_its_cause():
    remote = RuntimeError("The actor died because of an error raised in its creation task, (pid=1)\n"
                          "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                          "\x1b[36mray.exceptions.RaySystemError: System error: No module named 'fltest'\x1b[0m")
    assert first_line(remote) == "ray.exceptions.RaySystemError: System error: No module named 'fltest'"
    assert first_line(RuntimeError("one\ntwo")) == "one" and first_line(RuntimeError()) == "RuntimeError"


@pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (./prepare.sh --ray)")
def test_default_actor_count_respects_num_threads_on_a_local_instance(monkeypatch):
    """``--ray_workers 0`` on a local instance starts at most ``--num_threads`` CPUs' worth of actors,
    as the threaded engine's default workers (at least one); an explicit count is kept, and attached
    to a cluster its CPUs count. No Ray instance: the engine is asked with 8 CPUs faked."""
    import flcore.engines.ray.engine as ray_engine

    monkeypatch.setattr(ray_engine, "import_ray", lambda: SimpleNamespace(cluster_resources=lambda: {"CPU": 8.0}))
    data = random_dataset(num_clients=10)

    def actors(**flags) -> int:
        return build_server(make_args("FedAvg", engine="ray", **flags), data).engine._worker_count()

    assert actors() == actors(num_threads=0) == 8
    assert actors(num_threads=3) == 3 and actors(num_threads=16) == 8
    assert actors(num_threads=5, ray_cpus_per_worker=2) == 2
    assert actors(num_threads=1, ray_cpus_per_worker=2) == 1
    assert actors(num_threads=3, ray_workers=5) == 5
    assert actors(num_threads=3, ray_address="auto") == 8  # a cluster's CPUs are not this process's threads


def test_assignment_is_sticky_and_balanced_by_samples():
    sizes = [40, 3, 25, 12, 17, 17, 9]
    members = assign_by_samples(sizes, 3)
    assert sorted(i for m in members for i in m) == list(range(7))
    loads = [sum(sizes[i] for i in m) for m in members]
    assert max(loads) - min(loads) <= max(sizes)  # longest first keeps the loads within one client
    assert members == assign_by_samples(sizes, 3)  # a function of the sizes only: the same every run
    assert assign_by_samples([5, 5], 4) == [[0], [1], [], []]


# ---------------------------------------------------------------- on a local Ray instance
@pytest.mark.parametrize("algorithm, flags", [
    # slow trainers and senders, dropped uploads and -tth on the virtual clock: the clients' virtual
    # times are driver-side attributes, their samples processed come back in the uploads
    ("FedAvg", ("-tsr", "0.3", "-ssr", "0.3", "-cdr", "0.2", "-tth", "2")), ("IGFL", ()),
    # DP-SGD: the noise comes from (seed, round, client) on the actor, the epsilon from the clients' step counts
    ("FedAvg", ("-dp", "True", "-dps", "1.0")), ("Ditto", ()), ("FedALA", ()), ("AdaFL", ()),
    # one actor with both CPUs: the threaded engine trains its clients inside it
    ("SCAFFOLD", ("--ray_workers", "1", "--ray_cpus_per_worker", "2")),
])
@pytest.mark.usefixtures("local_ray")
@pytest.mark.ray
def test_result_file_equals_the_sequential_engine(algorithm, flags, tmp_path):
    folder = make_dataset(tmp_path, num_clients=6, input_shape=(1, 8, 8), train_sizes=[9, 30, 14, 5, 22, 17])
    ref = h5_arrays(run_main(folder, tmp_path / "seq", algorithm, "--engine", "sequential", *flags))
    out = h5_arrays(run_main(folder, tmp_path / "ray", algorithm, "--engine", "ray", "--ray_workers", "2", *flags))
    assert ref.keys() == out.keys() and "rs_test_acc" in ref and "rs_client_acc" in ref
    for name in ref:
        assert np.array_equal(ref[name], out[name]), name


@pytest.mark.usefixtures("local_ray")
@pytest.mark.ray
def test_multi_label_data_train_on_the_actors_as_sequentially(tmp_path):
    """The actors' clients get the dataset's objective with their task (flcore/objectives.py)."""
    folder = make_tag_dataset(tmp_path)
    flags = ("-m", "BoWLR", "-lr", "5")
    ref = h5_arrays(run_main(folder, tmp_path / "seq", "SCAFFOLD", "--engine", "sequential", *flags))
    out = h5_arrays(run_main(folder, tmp_path / "ray", "SCAFFOLD", "--engine", "ray", "--ray_workers", "2", *flags))
    for name in ref:
        assert np.array_equal(ref[name], out[name]), name


@pytest.mark.usefixtures("local_ray")
@pytest.mark.ray
def test_state_and_attributes_come_back_to_the_driver():
    ref = engine_run("SCAFFOLD", "sequential")
    out = engine_run("SCAFFOLD", "ray", ray_workers=2)
    try:
        assert_same_training(ref, out, exact=True)  # also every client's participations and state vector
        assert out.engine.stats["ray_clients"] == 9 and out.engine.stats["restarts"] == 0
        assert torch.equal(out.model.vector, ref.model.vector)  # the working model ends as sequentially
        # the state's working copies live on the actors; the driver keeps only files
        assert out.state.resident_nbytes() == 0
        assert sum(out.engine.actor_state_nbytes()) == ref.state.nbytes()
    finally:
        out.close()


@pytest.mark.usefixtures("local_ray")
@pytest.mark.ray
def test_bf16_is_applied_on_the_actors():
    """--precision bf16 reaches the actors' engines: the sequential engine's bf16 numbers, bit for
    bit, and not its fp32 ones."""
    ref = engine_run("FedAvg", "sequential", precision="bf16")
    out = engine_run("FedAvg", "ray", ray_workers=2, precision="bf16")
    try:
        assert out.engine.precision == "bf16"
        assert_same_training(ref, out, exact=True)
        assert not torch.equal(engine_run("FedAvg", "sequential").global_params, out.global_params)
    finally:
        out.close()


@pytest.mark.usefixtures("local_ray")
@pytest.mark.ray
def test_actor_killed_mid_round_is_replaced_and_the_results_are_unchanged(tmp_path, monkeypatch):
    members = assign_by_samples(ENGINE_SIZES, 2)
    victim_actor = max(members, key=len)
    victim = victim_actor[1]  # not its actor's first client: it dies after training some of the round
    marker = tmp_path / "crashed"
    monkeypatch.setattr(RayEngine, "worker_cls", crashing_worker(2, victim, marker))
    ref = engine_run("SCAFFOLD", "sequential", join_ratio=1.0)
    out = engine_run("SCAFFOLD", "ray", ray_workers=2, join_ratio=1.0)
    try:
        assert marker.exists() and out.engine.stats["restarts"] == 1
        assert_same_training(ref, out, exact=True)
    finally:
        out.close()


@pytest.mark.usefixtures("local_ray")
@pytest.mark.ray
def test_too_many_failures_stop_the_run_with_one_line(tmp_path, monkeypatch, capsys):
    folder = make_dataset(tmp_path, num_clients=4, input_shape=(1, 8, 8))
    monkeypatch.setattr(RayEngine, "worker_cls", crashing_worker(1, 0, tmp_path / "crashed"))
    code = main.main(["-data", str(folder), "-m", "DNN", "-gr", "3", "-jr", "1", "-dev", "cpu", "--engine", "ray",
                      "--ray_workers", "2", "--ray_max_restarts", "0", "--results_dir", str(tmp_path / "res"), "-q",
                      "--progress", "False"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "Traceback" not in "\n".join(err)
    assert err[-1].startswith("error: engine ray: 1 actor failures in round 1 (--ray_max_restarts 0)")
    assert "marked unfinished" in err[-1]
    (kept,) = (tmp_path / "res").glob("*.h5")  # the rounds before the failure are kept
    with h5py.File(kept) as f:
        assert not f.attrs["finished"] and f.attrs["stopped_at_round"] == 1 and len(f["rs_test_acc"]) == 2


@pytest.mark.usefixtures("local_ray")
@pytest.mark.ray
def test_resume_from_a_checkpoint_gathers_and_scatters_the_actors_state(tmp_path, monkeypatch):
    """A crash after round 2's checkpoint, then --resume: the checkpoint holds every client's state
    (the driver's copy of the actors' state), the resumed actors get it back, and the result file
    equals an uninterrupted sequential run's."""
    from flcore.servers.serverbase import Server

    folder = make_dataset(tmp_path, num_clients=6, input_shape=(1, 8, 8), train_sizes=[9, 30, 14, 5, 22, 17])
    ref = h5_arrays(run_main(folder, tmp_path / "seq", "SCAFFOLD", "--engine", "sequential", "-gr", "4"))
    original = Server.run_round

    def crash_in_round_3(self, rnd, *args, **kwargs):
        if rnd == 3:
            raise RuntimeError("simulated crash")
        return original(self, rnd, *args, **kwargs)

    ray_flags = ("SCAFFOLD", "--engine", "ray", "--ray_workers", "2", "-gr", "4", "--checkpoint_every", "2")
    with monkeypatch.context() as patch:
        patch.setattr(Server, "run_round", crash_in_round_3)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_main(folder, tmp_path / "ray", *ray_flags)
    assert list((tmp_path / "ray").glob("*.ckpt"))
    out = h5_arrays(run_main(folder, tmp_path / "ray", *ray_flags, "--resume"))
    assert ref.keys() == out.keys()
    for name in ref:
        assert np.array_equal(ref[name], out[name]), name


@pytest.mark.usefixtures("local_ray")
@pytest.mark.ray
def test_actors_that_cannot_fit_the_local_instance_are_one_line(tmp_path, capsys):
    """Three 1-CPU actors on the 2-CPU instance would wait for resources forever."""
    folder = make_dataset(tmp_path, num_clients=4, input_shape=(1, 8, 8))
    code = main.main(["-data", str(folder), "-m", "DNN", "-gr", "1", "-dev", "cpu", "--engine", "ray",
                      "--ray_workers", "3", "--results_dir", str(tmp_path / "res"), "-q", "--progress", "False"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "lower --ray_workers" in err


@pytest.mark.usefixtures("local_ray")
@pytest.mark.ray
def test_driver_memory_does_not_grow_with_the_stateful_clients():
    """SCAFFOLD keeps a model-sized control variate per client that has taken part (1 MB here). With
    a quarter of 48 clients per round, the clients holding state grow round by round; the actors'
    memory takes it, the driver's resident memory stays flat."""
    dataset = random_dataset(num_clients=48, dim=4096, num_classes=64, sizes=[12] * 48, seed=3)
    args = make_args("SCAFFOLD", engine="ray", ray_workers=2, join_ratio=0.25, batch_size=6, eval_auc=False)
    server = build_server(args, dataset)
    try:
        for rnd in range(2):  # warm-up: actors, buffers and allocator pools exist afterwards
            server.run_round(rnd, evaluate=False)
        before_rss, before_state = private_memory_bytes(), sum(server.engine.actor_state_nbytes())
        for rnd in range(2, 8):
            server.run_round(rnd, evaluate=False)
        grown_state = sum(server.engine.actor_state_nbytes()) - before_state
        grown_private = private_memory_bytes() - before_rss
        per_client = (4096 * 64 + 64) * 4
        assert grown_state >= 10 * per_client  # at least ten more clients hold a control variate
        assert server.state.resident_nbytes() == 0
        assert grown_private < 0.25 * grown_state, (grown_private, grown_state)
    finally:
        server.close()


@pytest.mark.usefixtures("local_ray")
@pytest.mark.ray
def test_kept_actors_serve_the_next_run_with_the_same_numbers(monkeypatch, tmp_path):
    """With keep_actors_warm (the module's fixture turns it on), a run's actors are emptied and kept,
    the next run rebuilds them in place (the same processes) with the same numbers as new actors;
    an actor that died while idle is replaced, and a run of another kind of actor ends the kept ones."""
    import ray

    ref = engine_run("SCAFFOLD", "sequential")
    first = engine_run("SCAFFOLD", "ray", ray_workers=2)
    ids = {a._actor_id for a in first.engine.actors}
    first.close()
    assert {a._actor_id for a in WARM.idle} >= ids
    again = engine_run("SCAFFOLD", "ray", ray_workers=2)
    try:
        assert {a._actor_id for a in again.engine.actors} == ids and not WARM.idle
        assert_same_training(ref, again, exact=True)
        assert sum(again.engine.actor_state_nbytes()) == ref.state.nbytes()  # nothing of the first run is left
    finally:
        again.close()
    ray.kill(WARM.idle[0])  # dies while idle
    survivor = WARM.idle[1]._actor_id
    out = engine_run("SCAFFOLD", "ray", ray_workers=2)
    try:
        fresh = {a._actor_id for a in out.engine.actors}
        assert survivor in fresh and len(fresh - ids) == 1
        assert_same_training(ref, out, exact=True)
    finally:
        out.close()
    monkeypatch.setattr(RayEngine, "worker_cls", crashing_worker(99, 0, tmp_path / "never"))
    other = engine_run("SCAFFOLD", "ray", ray_workers=2)
    try:
        assert not {a._actor_id for a in other.engine.actors} & fresh and not WARM.idle
        assert_same_training(ref, other, exact=True)
    finally:
        other.close()
    assert len(WARM.idle) == 2 and WARM.key[1] is RayEngine.worker_cls


@pytest.mark.usefixtures("local_ray")
@pytest.mark.ray
def test_a_packed_folder_trains_as_its_npz_twin(tmp_path):
    """The actors get a packed client's rows (its tensors are views of the mapped splits) as they
    get an npz client's: the same run, bit for bit, as the sequential engine on the npz folder."""
    from datagen import dataset_utils
    from fldata.loading import PackedClients, load_federated_dataset

    tiny = ["--num-clients", "6", "--dim", "6", "--num-classes", "3", "--size-log-mean", "2", "--size-min", "6"]
    for layout in ("npz", "packed"):
        assert dataset_utils.main_synthetic([*tiny, "--layout", layout, "--out-dir", str(tmp_path / layout)], tmp_path) == 0
    packed = load_federated_dataset(str(tmp_path / "packed"))
    assert isinstance(packed.clients, PackedClients)
    ref = engine_run("SCAFFOLD", "sequential", load_federated_dataset(str(tmp_path / "npz")), global_rounds=2)
    out = engine_run("SCAFFOLD", "ray", packed, global_rounds=2, ray_workers=2)
    try:
        assert_same_training(ref, out, exact=True)
    finally:
        out.close()


# ---------------------------------------------------------------- a two-node cluster on this machine
@pytest.mark.ray
@pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (./prepare.sh --ray)")
def test_two_node_cluster_on_loopback_gives_the_sequential_numbers(local_ray, tmp_path):
    from flcore.engines.ray import actor_path_env, use_loopback
    from flcore.engines.ray.cluster import signal_handlers_kept

    ray = local_ray
    keep_actors_warm(False)  # the kept actors end with the module's instance,
    ray.shutdown()  # which the cluster replaces (it is the module's last test)
    use_loopback()
    from ray.cluster_utils import Cluster

    # the in-process head node and ray.init put Ray's SIGTERM handler in place of the process's and
    # leave it after shutdown; the engine keeps the process's handlers, and so does this test
    with signal_handlers_kept():
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                                 "object_store_memory": 96 * 1024**2})
        try:
            cluster.add_node(num_cpus=1, object_store_memory=96 * 1024**2)
            ray.init(address=cluster.address, runtime_env=actor_path_env((HELPERS,)))
            cluster.wait_for_nodes()
            nodes = [n for n in ray.nodes() if n["Alive"]]
            assert len(nodes) == 2 and {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}
            ref = engine_run("Ditto", "sequential")
            out = engine_run("Ditto", "ray", ray_workers=2)
            try:
                assert len(set(out.engine.nodes)) == 2  # one actor per node (SPREAD)
                assert_same_training(ref, out, exact=True)
            finally:
                out.close()
        finally:
            ray.shutdown()
            cluster.shutdown()
