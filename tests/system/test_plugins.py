"""Round plug-ins (flcore/features), capabilities, the persistence contract and the client-state contract."""
from __future__ import annotations

import pytest
import torch

from fltest import build_server, make_args, random_dataset
from flcore.extension import Carries
from flcore.features import RoundPlugin, plugins_for
from flcore.features.clock import SlowEpochs
from flcore.registry import PLUGINS, load_all
from runner import checkpoint
from utils.errors import FLError


@pytest.fixture
def extra_plugins(monkeypatch):
    """Register test plug-ins for one test only (after the real ones registered themselves)."""
    load_all()
    entries = dict(PLUGINS._entries)
    monkeypatch.setattr(PLUGINS, "_entries", entries)

    def add(name: str, cls: type) -> type:
        cls.registered_name = name
        entries[name] = cls
        return cls
    return add


class Recorder(RoundPlugin):
    """Logs every hook call; takes the aggregation over with an unweighted mean; counts rounds."""

    order = 20
    calls: list = []

    def __init__(self, runtime, server_cls):
        super().__init__(runtime, server_cls)
        self.takes_aggregation = True
        self.rounds = 0
        self.server_cls = server_cls

    def before_selection(self, rnd, selecting):
        self.calls.append(("before_selection", rnd, selecting))

    def selectable(self, rnd):
        mask = torch.ones(len(self.runtime.clients), dtype=torch.bool).numpy()
        mask[0] = False  # client 0 may never be selected
        return mask

    def after_training(self, package, trained, arrived, result):
        self.calls.append(("after_training", package.round, [u.index for u in arrived]))
        return arrived

    def aggregate(self, updates, package):
        self.calls.append(("aggregate", package.round))
        return torch.stack([u.params for u in updates]).mean(0)

    def after_round(self, rnd, package, updates, result):
        self.rounds += 1
        self.calls.append(("after_round", rnd))

    def record(self, result):
        self.runtime.history.add_series("recorded_rounds", self.rounds)

    def state_dict(self):
        return {"rounds": self.rounds}

    def load_state_dict(self, state):
        self.rounds = int(state["rounds"])


def test_every_server_gets_the_registered_plugins_in_order(extra_plugins):
    extra_plugins("recorder", Recorder)
    server = build_server(make_args("FedAvg", engine="sequential", join_ratio=0.5, global_rounds=2),
                          random_dataset(num_clients=4))
    assert list(server.plugins) == ["clock", "recorder"]  # by order: the clock (10) first
    assert server.plugin("recorder").server_cls is type(server)
    Recorder.calls = []
    history = server.train(progress=False)
    assert [c[0] for c in Recorder.calls] == ["before_selection", "after_training", "aggregate", "after_round"] * 2
    for name, *rest in Recorder.calls:  # the plug-in's mask reaches the selection policy
        if name == "after_training":
            assert 0 not in rest[1]
    assert history.extra_series["recorded_rounds"] == [1, 2]
    assert len(history.extra_series["virtual_time"]) == 2  # the clock's series, written by record()


def test_an_aggregating_plugin_replaces_the_algorithms_aggregation(extra_plugins):
    extra_plugins("recorder", Recorder)
    server = build_server(make_args("FedAvg", engine="sequential", join_ratio=1.0), random_dataset(num_clients=3))
    result = server.run_round(0, evaluate=False)
    expected = torch.stack([u.params for u in result.updates]).mean(0)  # unweighted, unlike FedAvg
    assert torch.equal(server.global_params, expected)


def test_two_plugins_that_take_aggregation_are_refused_in_one_line(extra_plugins):
    extra_plugins("recorder", Recorder)
    extra_plugins("recorder2", type("Recorder2", (Recorder,), {}))
    with pytest.raises(FLError, match="replace the aggregation and exclude each other: recorder, recorder2"):
        build_server(make_args("FedAvg", engine="sequential"), random_dataset(num_clients=3))


def test_a_plugins_state_is_checkpointed_and_restored(extra_plugins):
    extra_plugins("recorder", Recorder)
    args = make_args("FedAvg", engine="sequential", global_rounds=3)
    server = build_server(args, random_dataset(num_clients=3))
    for rnd in range(2):
        server.run_round(rnd, evaluate=False)
    saved = checkpoint.server_state(server, 2)
    assert saved["plugins"]["recorder"] == {"__kind__": "dict", "items": [["rounds", 2]]}
    fresh = build_server(args, random_dataset(num_clients=3))
    assert checkpoint.load_server_state(fresh, saved) == 2
    assert fresh.plugin("recorder").rounds == 2
    assert fresh.virtual_time == server.virtual_time > 0  # the clock's time too
    assert list(fresh.plugin("clock").client_seconds) == list(server.plugin("clock").client_seconds)


def test_plugins_follow_the_flags():
    dataset = random_dataset(num_clients=3)
    assert list(build_server(make_args("FedAvg", engine="sequential"), dataset).plugins) == ["clock"]
    dp = build_server(make_args("FedAvg", "-dp", engine="sequential"), dataset)
    assert list(dp.plugins) == ["clock", "privacy"] and not dp.plugin("privacy").takes_aggregation
    central = build_server(make_args("FedAvg", engine="sequential", dp_update_clip=1.0), dataset)
    assert central.plugin("privacy").takes_aggregation
    # plugins_for is the one way servers get them: the same set for the same flags
    assert list(plugins_for(dp.runtime, type(dp))) == list(dp.plugins)


def test_capabilities_are_computed_once_per_class():
    from flcore.registry import ALGORITHMS

    fedprox, ditto, moon = (ALGORITHMS.get(n).client_cls for n in ("FedProx", "Ditto", "MOON"))
    assert {"adjust_grad", "begin_round"} <= fedprox.capabilities.overrides
    assert fedprox.capabilities.keeps_base_training and not fedprox.capabilities.own_loss
    assert not ditto.capabilities.keeps_base_training  # its own train_job
    assert moon.capabilities.own_loss
    assert "aggregate" in ALGORITHMS.get("SCAFFOLD").capabilities.overrides
    assert "aggregate" not in ALGORITHMS.get("FedProx").capabilities.overrides


def test_the_client_state_contract():
    server = build_server(make_args("FedAvg", engine="sequential"), random_dataset(num_clients=3))
    client = server.clients[0]
    assert client.carried_state() == {"participations": 0}
    server.run_round(0, evaluate=False, cohort=[0])
    assert client.carried_state() == {"participations": 1}
    client.restore_carried_state({"participations": 5})
    assert client.participations == 5
    with pytest.raises(FLError, match="no part of its carried state"):
        client.restore_carried_state({"momentum": 1})
    slow = SlowEpochs(seed=0, local_epochs=4)
    client.configure(epoch_schedule=slow)
    assert client.settings() == {"epoch_schedule": slow}
    with pytest.raises(TypeError, match="declares no settable generator"):
        client.configure(generator=None)
    dp = build_server(make_args("FedAvg", "-dp", engine="sequential"), random_dataset(num_clients=3))
    assert dp.clients[0].carried_state() == {"participations": 0, "dp_steps": 0}


def test_a_server_and_its_policy_checkpoint_exactly_what_their_classes_declare():
    """The persistence contract: the base's names and the algorithm's own, nothing captured besides."""
    args = make_args("SCAFFOLD", engine="sequential", select="adafl")
    server = build_server(args, random_dataset(num_clients=3))
    assert set(server.state_dict()) == {"global_params", "model", "sent_once", "control"}
    assert set(server.selector.state_dict()) == {"scores"}
    server.run_round(0, evaluate=False)
    saved = checkpoint.server_state(server, 1)
    fresh = build_server(args, random_dataset(num_clients=3))
    assert checkpoint.load_server_state(fresh, saved) == 1
    assert torch.equal(fresh.control, server.control) and torch.equal(fresh.global_params, server.global_params)
    assert list(fresh.selector.scores) == list(server.selector.scores)
    # a checkpoint holding other state than the class declares (another version's) is refused in one line
    saved["server"]["items"].append(["momentum", 1.0])
    with pytest.raises(checkpoint.CheckpointError, match=r"state of ScaffoldServer \(control, global_params, "
                       r"model, momentum, sent_once\) is not what this version keeps .*--overwrite"):
        checkpoint.load_server_state(build_server(args, random_dataset(num_clients=3)), saved)


def test_load_state_dict_takes_back_exactly_the_declared_attributes():
    class Counter(Carries):
        carried = ("count",)

        def __init__(self):
            self.count, self.setting = 0, "rebuilt"

    class Twice(Counter):
        carried = ("last",)  # its own names; the base's are kept

        def __init__(self):
            super().__init__()
            self.last = None

    twice = Twice()
    twice.count, twice.last = 3, 7
    assert twice.state_dict() == {"count": 3, "last": 7}
    fresh = Twice()
    fresh.load_state_dict(twice.state_dict())
    assert (fresh.count, fresh.last, fresh.setting) == (3, 7, "rebuilt")
    with pytest.raises(FLError, match="Twice: setting is no part of its carried state"):
        fresh.load_state_dict({"count": 1, "last": 2, "setting": "x"})
    with pytest.raises(FLError, match="Twice: the saved state lacks last"):
        fresh.load_state_dict({"count": 1})


def test_an_old_checkpoint_is_refused_in_one_line(tmp_path):
    path = tmp_path / "old.ckpt"
    torch.save({"format": checkpoint.FORMAT, "version": 1}, path)
    with pytest.raises(checkpoint.CheckpointError, match="has format version 1, this version reads 2"):
        checkpoint.load_checkpoint(path, make_args("FedAvg"))


def test_main_logs_each_plugins_settings_at_the_start(tmp_path, capsys):
    """A reader of the log sees what the run faced (attack, defence), not only the algorithm."""
    import main
    from toydata import make_dataset

    folder = make_dataset(tmp_path, num_clients=4, input_shape=(1, 8, 8))
    rc = main.main(["-data", str(folder), "--results_dir", str(tmp_path / "res"), "-dev", "cpu", "-gr", "1",
                    "-m", "DNN", "-algo", "FedAvg", "--attack", "sign_flip", "--attack_fraction", "0.25",
                    "--robust", "median", "--progress", "False", "--save_model", "False"])
    assert rc == 0
    captured = capsys.readouterr()
    log = captured.out + captured.err
    assert '"attack": "sign_flip"' in log and '"robust": ["median"]' in log
