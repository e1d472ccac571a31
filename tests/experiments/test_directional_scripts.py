"""experiments/sageflow_mnist.py and trust_directional.py: their rows, and the numbers they read from
results files (no training here)."""
import argparse
import sys

import h5py
import numpy as np
import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "experiments"))
import common  # noqa: E402
import sageflow_mnist as sf  # noqa: E402
import trust_directional as td  # noqa: E402
from flcore.registry import ALGORITHMS, load_all  # noqa: E402
import main  # noqa: E402


def parse_row(algo: str, *flags: str, model: str = "CNN"):
    """A row's flags as main parses them, with the public data sageflow_mnist.py passes beside every row
    (Sageflow refuses to run without it)."""
    public = [] if "--public_data" in flags else sf.public(150)
    return main.parse_args(["-algo", algo, "-m", model, *public, *flags])


def test_every_row_names_a_registered_algorithm_and_flags_it_uses():
    load_all()
    rows = [row for setting in ("official", "stragglers", "sign_flip", "backdoor") for row in sf.variants(setting, 10.0)]
    rows += td.fair_rows(10.0, 0.3) + td.fair_rows(10.0, 0.3, public="0.05") + td.FLCHAIN_ROWS
    for label, algo, flags in rows:
        assert algo in ALGORITHMS, label
        args = parse_row(algo, *flags)
        assert getattr(args, main.IGNORED_DEST) == [], label  # main would ignore them with an info line


def test_public_data_reaches_every_fair_row_and_adds_the_learned_weights():
    assert [label for label, _, _ in td.fair_rows(10.0, 0.3)] == [
        "FAIR, clean", "random, clean", "AdaFL order, clean", "FAIR, 0.3 label flip", "random, 0.3 label flip",
        "AdaFL order, 0.3 label flip"]
    rows = td.fair_rows(10.0, 0.3, public="0.05")
    assert [label for label, _, flags in rows if "learned" in flags] == ["FAIR learned, clean",
                                                                          "FAIR learned, 0.3 label flip"]
    assert len(rows) == 8 and all(flags[flags.index("--public_data") + 1] == "0.05" for _, _, flags in rows)


def test_sign_flip_rows_are_the_issues_five_and_the_defences_are_the_ones_named():
    rows = {label: flags for label, _, flags in sf.variants("sign_flip", 10.0)}
    assert list(rows) == ["FedAvg", "Sageflow", "median", "Multi-Krum", "RFA"]
    assert [flags[flags.index("--robust") + 1] for label, flags in rows.items() if "--robust" in flags] == [
        "median", "multi_krum", "rfa"]
    assert all(flags[flags.index("--attack_scale") + 1] == "10.0" for flags in rows.values())


def test_public_data_is_a_thousand_samples_of_the_pool():
    assert float(sf.public(0)[1]) * 60000 == 1000
    assert abs(float(sf.public(150)[1]) * 100 * 150 - 1000) < 1e-9


def test_a_round_no_seed_reached_is_a_dash_and_a_partial_one_is_counted():
    assert sf.cell(np.array([np.nan, np.nan]), 2) == "–"
    assert sf.cell(np.array([10.0, np.nan, 30.0]), 3) == "20.00 ± 10.00 (2/3)"


def test_flchain_gap_is_the_largest_difference_from_fedavg_of_the_same_seed(tmp_path):
    def write(name, acc, outvoted):
        path = tmp_path / f"Toy_X_{name}_0.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("rs_test_acc", data=np.array(acc))
            f.create_dataset("rs_outvoted_nodes", data=np.array(outvoted, dtype=float))
            f.create_dataset("rs_virtual_time", data=np.array([1.0, 2.5]))
        return path

    fedavg = common.Run([write("a", [0.1, 0.5, 0.6], [])], 0.0)
    chain = common.Run([write("b", [0.1, 0.5, 0.61], [1, 1])], 0.0)
    final, best, gap, outvoted, seconds = td.flchain_cells(chain, fedavg)
    assert (final, best, gap, outvoted, seconds) == ("61.00 ± 0.00", "61.00 ± 0.00", "1.0000 ± 0.0000",
                                                     "2 ± 0", "2.5 ± 0.0")


def test_weights_flip_reaches_every_attacked_row_and_main_takes_it_with_local_momentum():
    load_all()
    for setting in ("official", "sign_flip"):
        for label, algo, flags in sf.variants(setting, 0.1, flip="weights"):
            assert flags[flags.index("--attack_flip") + 1] == "weights", label
            args = parse_row(algo, "--local_momentum", "0.9", *flags)
            assert args.attack_flip == "weights" and args.local_momentum == 0.9
            assert getattr(args, main.IGNORED_DEST) == [], label
    assert all("--attack_flip" not in flags for _, _, flags in sf.variants("stragglers", 0.1, flip="weights"))


def test_curves_put_each_evaluation_at_its_round_and_pad_with_nan(tmp_path):
    paths = []
    for i, (acc, rounds) in enumerate((([0.1, 0.3, 0.5], [0, 2, 4]), ([0.2, 0.4], [0, 2]))):  # the second stopped early
        paths.append(tmp_path / f"run{i}.h5")
        with h5py.File(paths[-1], "w") as f:
            f.create_dataset("rs_test_acc", data=np.asarray(acc))
            f.create_dataset("rs_eval_rounds", data=np.asarray(rounds))
    got = sf.curves(paths, width=5)
    want = np.array([[0.1, np.nan, 0.3, np.nan, 0.5], [0.2, np.nan, 0.4, np.nan, np.nan]])
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.allclose(got[~np.isnan(got)], want[~np.isnan(want)])


def name_args(**changes) -> argparse.Namespace:
    """The options ``experiment_name`` reads: the stragglers setting on MNIST at E = 5 with the
    script's other defaults, then ``changes``."""
    defaults = dict(setting="stragglers", dataset="MNIST", local_momentum=0.0, lr=0.1, attack_flip="update",
                    local_epochs=5, protocol="ours", partition="ours", seed=0, samples=0)
    return argparse.Namespace(**{**defaults, **changes})


def test_another_gamma_halving_gets_its_own_folders_and_reaches_every_sageflow_row():
    load_all()
    args = name_args()
    assert sf.experiment_name(args, 15) == "sageflow_stragglers_E5"  # the official period: the default folders
    assert sf.experiment_name(args, 0) == "sageflow_stragglers_E5_gamma_halving0"
    args.dataset = "FashionMNIST"
    assert sf.experiment_name(args, 20) == "sageflow_stragglers_FashionMNIST_E5"
    assert sf.experiment_name(args, 15) == "sageflow_stragglers_FashionMNIST_E5_gamma_halving15"
    for setting in ("official", "stragglers", "sign_flip", "backdoor"):
        for label, algo, flags in sf.variants(setting, 0.1, halving=0):
            if algo == "Sageflow":
                assert flags[flags.index("--sageflow_gamma_halving") + 1] == "0", label
                assert parse_row(algo, *flags).sageflow_gamma_halving == 0


def test_a_later_seed_and_fewer_rows_a_client_get_their_own_folders():
    """run_variant empties a row's folder and names files by run index, so a ``--seed 2 --times 1`` run
    in seed 0's folder would delete seed 0's files, and a full-data run the 150-row runs'."""
    args = name_args(dataset="FashionMNIST")
    assert sf.experiment_name(args, 20) == "sageflow_stragglers_FashionMNIST_E5"
    args.seed = 2
    assert sf.experiment_name(args, 20) == "sageflow_stragglers_FashionMNIST_E5_seed2"
    args.samples = 150
    assert sf.experiment_name(args, 20) == "sageflow_stragglers_FashionMNIST_150s_E5_seed2"


def test_the_official_protocol_reaches_every_row_and_gets_its_own_folders():
    load_all()
    args = name_args(setting="official", local_momentum=0.9, lr=0.01, attack_flip="weights", protocol="official")
    assert sf.experiment_name(args, 15) == "sageflow_official_momentum0.9_lr0.01_flip_weights_E5_official_protocol"
    args.partition, args.official_seed = "official", 2022
    assert sf.experiment_name(args, 15).endswith("_E5_official_protocol_official_partition2022")
    for setting in ("official", "stragglers", "sign_flip", "backdoor"):
        for label, algo, flags in sf.variants(setting, 0.1):
            assert sf.with_protocol(flags, "ours") == flags
            official = sf.with_protocol(flags, "official")
            parsed = parse_row(algo, *official, model=sf.MODELS["official"])
            assert getattr(parsed, main.IGNORED_DEST) == [], label
            assert parsed.model == "SageflowCNN"
            if "--straggler_delay" in flags:  # stragglers: busy clients sit out, the official delay draw
                assert (parsed.straggler_busy, parsed.straggler_delays) == ("skip", "each"), label
            if "--attack" in flags:
                assert parsed.attack_scope == "drawn", label
            assert ("--straggler_delay" in flags or "--attack" in flags) == (official != flags), label


def test_the_official_split_draws_shards_of_the_label_sorted_rows_left_after_the_public_set():
    labels = np.random.default_rng(3).permutation(np.repeat(np.arange(10), 12))  # 120 rows
    rows, public = sf.official_shards(labels, 7, clients=5, public=20, shards=10)
    assert public.tolist() == sorted(np.random.RandomState(7).choice(120, 20, replace=False).tolist())
    pool = np.setdiff1d(np.arange(120), public)
    shards = np.split(pool[np.argsort(labels[pool], kind="stable")], 10)  # 10 rows a shard, by label
    held = np.concatenate(rows)
    assert len(held) == len(set(held.tolist())) == 100 and not set(held.tolist()) & set(public.tolist())
    for client in rows:  # two whole shards each (as label runs: the unstable sort may order equal labels otherwise)
        assert len(client) == 20
        for part in (client[:10], client[10:]):
            assert sorted(labels[part].tolist()) == labels[part].tolist()
            assert any(labels[part].tolist() == labels[s].tolist() for s in shards)
    again, _ = sf.official_shards(labels, 7, clients=5, public=20, shards=10)
    other, _ = sf.official_shards(labels, 8, clients=5, public=20, shards=10)
    assert all(np.array_equal(a, b) for a, b in zip(rows, again))
    assert not all(np.array_equal(a, b) for a, b in zip(rows, other))


def test_the_official_partition_refuses_samples_and_data(monkeypatch, capsys):
    for extra in (["--samples", "150"], ["--data", "somewhere"]):
        monkeypatch.setattr(sys, "argv", ["sageflow_mnist.py", "--partition", "official", *extra])
        with pytest.raises(SystemExit) as exit_info:
            sf.main()
        assert exit_info.value.code == 2 and "drop --samples and --data" in capsys.readouterr().err
