"""What the base gives the knowledge-transfer algorithms: the hooks around the local SGD
(``pre_training`` / ``post_training``) on every engine, and the sent-once part of a package
(``RoundPackage.static``), whose bytes a client is charged only while it lacks them."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import main

from flcore.clients.clientbase import Client
from flcore.protocol import SentOnce
from flcore.engines.batched import BatchedEngine
from flcore.registry import ALGORITHMS, load_all
from fltest import assert_same_training, build_server, engine_run, make_args, random_dataset, run_round
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from knowledgetest import HiddenBody
from toydata import make_dataset
from utils.errors import FLError

MIGRATED = ["FedGH", "FedPAC", "FedPCL", "KT-pFL"]


def hidden(dataset):
    torch.manual_seed(0)
    return HiddenBody(dataset.input_shape[0], dataset.num_classes)


@pytest.mark.parametrize("algo", MIGRATED)
def test_hooks_replace_the_own_train_job(algo):
    load_all()
    client_cls = ALGORITHMS.get(algo).client_cls
    assert client_cls.train_job is Client.train_job and client_cls.vectorisable
    assert "post_training" in client_cls.capabilities.overrides


@pytest.mark.parametrize("algo", MIGRATED)
def test_engines_run_the_hooks_as_the_sequential_engine(algo):
    """With a body that has parameters (the engine suite's linear model has none): threaded to the
    bit, batched within rounding."""
    ref = engine_run(algo, "sequential", module_fn=hidden)
    threaded = engine_run(algo, "threaded", module_fn=hidden, workers=2)
    assert threaded.engine.stats["threaded_clients"] > 0
    assert_same_training(ref, threaded, exact=True)
    batched = engine_run(algo, "batched", module_fn=hidden)
    assert batched.engine.stats["batched_clients"] > 0 and batched.engine.stats["sequential_clients"] == 0
    assert_same_training(ref, batched, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("algo", ["FedPAC", "KT-pFL"])
def test_batched_round_uploads_and_counts_what_the_sequential_one_does(algo):
    """One round from the same state: the uploads built by the hooks (statistics, class means, soft
    predictions) and the samples charged (the pre-training pass's plus the vectorised steps')."""
    runs = {}
    for engine in ("sequential", "batched"):
        server = engine_run(algo, "sequential", module_fn=hidden, global_rounds=2)
        if engine == "batched":
            server.engine = BatchedEngine(server.runtime)
        cohort = list(range(len(server.clients)))
        package = server.make_package(2, cohort)
        runs[engine] = server.engine.train([server.clients[i] for i in cohort], package)
    assert sum(u.samples_processed for u in runs["batched"]) > 0
    for s, b in zip(runs["sequential"], runs["batched"]):
        assert s.samples_processed == b.samples_processed
        assert s.extras.keys() == b.extras.keys()
        for name in s.extras:
            torch.testing.assert_close(b.extras[name], s.extras[name], atol=2e-5, rtol=1e-4)


# ------------------------------------------------------------------------ sent once


def test_sent_once_counts_new_changed_and_appended_data():
    once = SentOnce()
    x = torch.zeros(4, 3)  # 48 bytes, 12 a row
    assert once.deliver({"x": x}, [0, 1]) == {0: 48, 1: 48}
    assert once.deliver({"x": x}, [1, 2]) == {1: 0, 2: 48}  # client 1 holds it
    x[0, 0] = 1.0  # changed in place: everyone downloads it again
    assert once.deliver({"x": x}, [0, 2]) == {0: 48, 2: 48}
    grown = torch.cat([x, torch.ones(2, 3)])  # two rows appended: holders download only those
    assert once.deliver({"x": grown}, [0, 1]) == {0: 24, 1: 72}
    assert once.deliver({"x": grown[1:]}, [0]) == {0: 60}  # not an extension: all of it
    assert once.deliver({"s": torch.tensor(2.0)}, [0]) == {0: 4}
    assert once.deliver({"s": torch.tensor(2.0)}, [0]) == {0: 0}


def test_ktpfl_public_inputs_are_downloaded_once_per_client():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[20, 22, 19], seed=2)
    server = build_server(make_args("KT-pFL", "--public_data", "0.2", batch_size=4), data)
    public = server.public["public_x"].numel() * 4
    soft = len(server.public["public_x"]) * 3 * 4  # a personalised target: |public| x C floats
    first = run_round(server, 0, cohort=[0, 2])
    assert [first.package.nbytes(i) for i in (0, 2)] == [public, public]
    second = run_round(server, 1, cohort=[0, 1])
    assert second.package.nbytes(0) == soft  # it holds the public inputs: only its target
    assert second.package.nbytes(1) == public + soft  # its first round
    third = run_round(server, 2, cohort=[0, 1, 2])
    assert third.package.total_nbytes() == 3 * soft


def test_ktpfl_bytes_down_in_the_history():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[20, 22, 19], seed=2)
    server = build_server(make_args("KT-pFL", "--public_data", "0.2", batch_size=4, join_ratio=1.0,
                                    global_rounds=3, eval_gap=10), data)
    server.train(progress=False)
    public = server.public["public_x"].numel() * 4
    soft = len(server.public["public_x"]) * 3 * 4
    assert server.history.bytes_down == [3 * public, 3 * soft, 3 * soft]


def test_fedmix_means_count_only_the_rows_a_client_lacks():
    data = random_dataset(num_clients=3, dim=2, num_classes=2, sizes=[20, 30, 10], seed=5)
    server = build_server(make_args("FedMix", "--fedmix_mean_size", "10", batch_size=5), data)
    model = server.global_params.numel() * 4
    row = (2 + 2 + 2) * 4  # a mean input (2 floats), a mean label (2 floats) and an owner (int64)
    run_round(server, 0, cohort=[0, 1])  # the means of clients 0 and 1 arrive: 2 + 3 rows
    second = run_round(server, 1, cohort=[0, 2])
    assert second.package.nbytes(0) == second.package.nbytes(2) == model + 5 * row
    third = run_round(server, 2, cohort=[0, 1])  # client 2's row appended
    assert third.package.nbytes(0) == model + 1 * row  # it held the first 5 rows
    assert third.package.nbytes(1) == model + 6 * row  # its first download of the means
    fourth = run_round(server, 3, cohort=[0, 1, 2])
    # nothing new, but client 2 held 5 rows: the 6th (its own means, as the server sends them all)
    assert [fourth.package.nbytes(i) for i in range(3)] == [model, model, model + row]
    fifth = run_round(server, 4, cohort=[0, 1, 2])
    assert fifth.package.total_nbytes() == 3 * model


@pytest.mark.parametrize("algo, hook", [("FedGH", "post_training"), ("FedPAC", "pre_training")])
def test_dp_sgd_refuses_passes_around_the_sgd(algo, hook):
    """The prototypes of FedGH and FedPAC's head epoch see the private data outside DP-SGD's steps."""
    data = random_dataset(num_clients=2, dim=3, num_classes=2, sizes=[6, 8])
    with pytest.raises(FLError, match=f"-dp: DP-SGD composes .* overrides .*{hook}"):
        build_server(make_args(algo, "-dp", "-dps", "1"), data, hidden(data))


# ------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("algo, flags", [("FD", []), ("FML", []), ("KT-pFL", ["--public_data", "0.2"]), ("FedMix", [])])
def test_methods_on_logits_or_whole_models_need_no_body_head_split(algo, flags):
    """FedProto, FedPCL, FedGH, FedPAC and FedKD refuse a model without the split in one line (their
    own tests); these four work on logits or whole models, so a bare nn.Linear trains and evaluates."""
    data = random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[10, 12, 9], seed=2)
    torch.manual_seed(0)
    server = build_server(make_args(algo, *flags, batch_size=4), data, nn.Linear(4, 3))
    for rnd in range(2):
        run_round(server, rnd)
    assert 0 <= server.evaluate(2).test_acc <= 1


@pytest.mark.parametrize("algo", ["FedGH", "FedPAC", "FedProto", "FedKD"])
def test_a_body_without_parameters_warns_in_one_line(algo, tmp_path, capsys):
    """MLR's body is the identity: the methods run on the inputs as features, and one warning says so
    (not the split's "this run is FedAvg/Local", which FedGH and FedPAC are not)."""
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 4, 4))
    code = main.main(["-data", str(folder), "-m", "MLR", "-algo", algo, "-gr", "1", "-dev", "cpu", "--progress", "False",
                      "-q", "True", "--save_model", "False", "--results_dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 0 and "this run is" not in err
    assert len([line for line in err.splitlines() if "learns from the features" in line]) == 1
