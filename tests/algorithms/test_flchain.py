"""FLChain: honest nodes commit FedAvg's model bit for bit, a malicious node is outvoted and logged,
the ledger verifies and every one-byte change is caught, the stopping rule, refusals, resume."""
from __future__ import annotations

import logging
import signal

import numpy as np
import pytest
import torch

import ledger
import main
from flcore.servers.serverbase import Server
from fltest import build_server, fl_log_messages, make_args, random_dataset, run_round, trained_server
from toydata import make_dataset

TINY = dict(global_rounds=2, batch_size=4, local_epochs=1)


def data():
    return random_dataset(num_clients=3, dim=4, num_classes=3, seed=5)


def test_honest_nodes_commit_fedavgs_model_bit_for_bit():
    dataset = data()
    fedavg = trained_server(dataset, "FedAvg", **TINY)
    chain = trained_server(dataset, "FLChain", "--flchain_nodes", "4", **TINY)
    assert torch.equal(fedavg.global_params, chain.global_params)
    assert fedavg.history.test_acc == chain.history.test_acc
    blocks = ledger.read_blocks(ledger.ledger_bytes(chain.ledger_lines))
    assert [b["kind"] for b in blocks] == ["genesis", "round", "round"]
    assert blocks[-1]["model_sha256"] == ledger.sha256_hex(chain.global_params.numpy().tobytes())
    assert blocks[-1]["agreeing"] == [0, 1, 2, 3] and blocks[-1]["outvoted"] == []
    assert blocks[0]["quorum"] == 3 and blocks[0]["devices"] == [0, 1, 2]


def test_malicious_node_is_outvoted_logged_and_the_model_is_fedavgs():
    dataset = data()
    fedavg = trained_server(dataset, "FedAvg", **TINY)
    with fl_log_messages(logging.INFO) as messages:
        chain = trained_server(dataset, "FLChain", "--flchain_nodes", "3", "--flchain_malicious", "1", **TINY)
    assert torch.equal(fedavg.global_params, chain.global_params)
    (bad,) = chain.malicious_nodes
    block = ledger.read_blocks(ledger.ledger_bytes(chain.ledger_lines))[-1]
    assert block["outvoted"] == [bad] and len(set(block["proposals"])) == 2
    assert block["proposals"][bad] != block["model_sha256"]
    assert chain.history.extra_series["outvoted_nodes"] == [1, 1]
    assert any(f"edge node(s) {bad} proposed another aggregate" in m for m in messages)


def test_consensus_by_hand():
    assert ledger.decide(["a", "b", "a", "a", "b"], 3) == ("a", [0, 2, 3], [1, 4])
    assert ledger.decide(["a", "b", "c"], 2) == (None, [], [0, 1, 2])
    assert ledger.majority(4) == 3 and ledger.majority(5) == 3


def test_block_and_consensus_time_on_the_virtual_clock():
    dataset = data()
    flags = ("--flchain_block_time", "2", "--flchain_latency", "0.25", "--flchain_node_bandwidth", "1000")
    plain = build_server(make_args("FedAvg", **TINY), dataset)
    chain = build_server(make_args("FLChain", *flags, **TINY), dataset)
    run_round(plain, 0)
    updates = run_round(chain, 0).updates
    consensus = sum(u.nbytes() for u in updates) / 1000 + 2 * 0.25
    assert chain.virtual_time == pytest.approx(plain.virtual_time + consensus + 2)
    assert chain.history.extra_series["consensus_time"] == [pytest.approx(consensus)]


def test_each_rounds_virtual_time_includes_its_consensus_and_block():
    chain = trained_server(data(), "FLChain", "--flchain_block_time", "2", "--flchain_latency", "0.25", **TINY)
    series = chain.history.extra_series
    increments = np.diff([0.0, *series["virtual_time"]])
    assert len(increments) == 2 and min(series["block_time"]) == 2
    assert series["virtual_round_time"] == pytest.approx(increments.tolist(), rel=1e-12)
    consensus_and_block = np.add(series["consensus_time"], series["block_time"])
    assert np.all(np.asarray(series["virtual_round_time"]) > consensus_and_block)  # training took time too


def test_stopping_rule_ends_the_run_when_the_model_stops_moving():
    dataset = data()
    chain = trained_server(dataset, "FLChain", "--flchain_epsilon", "1e9", global_rounds=5, batch_size=4)
    assert len(chain.history.extra_series["model_change"]) == 1  # stopped after the first round
    never = trained_server(dataset, "FLChain", global_rounds=3, batch_size=4)
    assert len(never.history.extra_series["model_change"]) == 3


@pytest.mark.parametrize("flags, words", [
    (["--flchain_nodes", "2", "--flchain_quorum", "3"], "fewer than its quorum of 3"),
    (["--flchain_nodes", "3", "--flchain_malicious", "2"], "cannot reach the quorum"),
    (["--flchain_nodes", "4", "--flchain_quorum", "2"], "no majority"),
])
def test_bad_node_settings_are_one_line_exit_2(tmp_path, capsys, flags, words):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 8, 8))
    rc = main.main(["-data", str(folder), "--results_dir", str(tmp_path / "res"), "-dev", "cpu", "-gr", "1",
                    "-m", "DNN", "-algo", "FLChain", *flags, "--progress", "False", "-q", "True"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and words in err, err
    assert not list((tmp_path / "res").glob("*.ledger"))


def run_chain(folder, results, *extra):
    return main.main(["-data", str(folder), "--results_dir", str(results), "-dev", "cpu", "-gr", "3", "-m", "DNN",
                      "-lbs", "8", "-algo", "FLChain", "--flchain_malicious", "1", "--progress", "False",
                      "-q", "True", *extra])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("chain"), num_clients=3, input_shape=(1, 8, 8))


def test_ledger_verifies_and_every_one_byte_change_is_caught(folder, tmp_path, capsys):
    assert run_chain(folder, tmp_path) == 0
    (path,) = tmp_path.glob("*.ledger")
    assert path.with_suffix(".h5").exists() and path.with_suffix(".safetensors").exists()
    assert ledger.main(["verify", str(path)]) == 0
    assert "the last committed model matches" in capsys.readouterr().out
    original = path.read_bytes()
    for position in range(len(original)):  # every byte, in memory (the file's checks are the same)
        changed = bytearray(original)
        changed[position] ^= 0x01
        with pytest.raises(ledger.LedgerError):
            ledger.check_consensus(ledger.read_blocks(bytes(changed)))
    tampered = tmp_path / "t.ledger"
    tampered.write_bytes(original.replace(b'"outvoted":[]', b'"outvoted":[0]', 1)
                         if b'"outvoted":[]' in original else original[:100] + b"x" + original[101:])
    assert ledger.main(["verify", str(tampered)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"ledger FAILED: {tampered}: line ")
    # a consistent chain whose last model is not the saved one
    blocks = original.decode().splitlines()
    shorter = tmp_path / (path.stem + "-cut.ledger")
    shorter.write_text("\n".join(blocks[:-1]) + "\n")
    assert ledger.main(["verify", str(shorter), "--model", str(path.with_suffix(".safetensors"))]) == 1
    assert "does not match the model" in capsys.readouterr().err


def test_ledger_resumes_exactly(folder, tmp_path, monkeypatch):
    assert run_chain(folder, tmp_path / "ref") == 0
    (reference,) = (tmp_path / "ref").glob("*.ledger")
    original = Server.run_round

    def interrupted(self, rnd, *args, **kwargs):
        result = original(self, rnd, *args, **kwargs)
        if rnd == 1:
            signal.raise_signal(signal.SIGINT)
        return result

    results = tmp_path / "res"
    with monkeypatch.context() as patch:
        patch.setattr(Server, "run_round", interrupted)
        assert run_chain(folder, results) == 130
    assert not list(results.glob("*.ledger"))  # written with the finished results only
    assert run_chain(folder, results, "--resume") == 0
    (resumed,) = results.glob("*.ledger")
    assert resumed.read_bytes() == reference.read_bytes()


def test_same_seed_same_ledger(folder, tmp_path):
    for name in ("a", "b"):
        assert run_chain(folder, tmp_path / name) == 0
    (a,), (b,) = (tmp_path / "a").glob("*.ledger"), (tmp_path / "b").glob("*.ledger")
    assert a.read_bytes() == b.read_bytes()
