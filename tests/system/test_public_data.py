"""--public_data: a fraction of the training pool drawn without overlap (removed from the clients,
reproducible from the seed) or a dataset folder; bad values in one line; recorded in the results."""
from __future__ import annotations

import json
from types import SimpleNamespace

import h5py
import pytest
import torch

import main
from fltest import random_dataset
from toydata import make_dataset
from fldata.loading import load_federated_dataset
from utils.errors import FLError
from fldata.public import public_data_of, require_public_data, with_public_data


def args_for(spec, seed=0):
    return SimpleNamespace(public_data=spec, seed=seed, legacy_pickle=False)


def rows(x: torch.Tensor) -> set[tuple]:
    return {tuple(r.tolist()) for r in x.flatten(1)}


def test_a_fraction_is_drawn_without_overlap_and_removed_from_the_clients():
    data = random_dataset(num_clients=4, dim=5, num_classes=3, sizes=[20, 30, 25, 25], seed=1)
    before = rows(data.split("train")[0])
    tests = [c.test_x.clone() for c in data.clients]
    out = with_public_data(args_for("0.1"), data)
    public = public_data_of(out)
    assert len(public) == 10 and sum(c.num_train for c in out.clients) == 90
    kept = rows(out.split("train")[0])
    assert rows(public.x).isdisjoint(kept) and rows(public.x) | kept == before  # no overlap, nothing lost
    for client, test_x in zip(out.clients, tests):
        assert torch.equal(client.test_x, test_x)
    # the clients' tensors are the merged split's rows, at the dataset's offsets
    x, owner = out.split("train")[0], out.owners("train")
    for i, (client, start) in enumerate(zip(out.clients, out.offsets("train"))):
        assert torch.equal(client.train_x, x[start : start + client.num_train])
        assert bool((owner[start : start + client.num_train] == i).all())
    again = public_data_of(with_public_data(args_for("0.1"), random_dataset(4, 5, 3, [20, 30, 25, 25], seed=1)))
    other = public_data_of(with_public_data(args_for("0.1", seed=1), random_dataset(4, 5, 3, [20, 30, 25, 25], seed=1)))
    assert torch.equal(again.x, public.x) and not torch.equal(other.x, public.x)


def test_eight_bit_inputs_stay_codes_with_their_table(tmp_path):
    task = load_federated_dataset(str(make_dataset(tmp_path, "Bytes", num_clients=3, input_shape=(1, 4, 4),
                                                   eight_bit=True)))
    assert task.input_table is not None
    x, _ = task.split("train")
    public = public_data_of(with_public_data(args_for("0.25"), task))
    assert public.x.dtype == torch.uint8 and public.table is task.input_table
    assert public.inputs().dtype == torch.float32 and rows(public.inputs()) <= rows(task.input_table[x.long()])


def test_a_folder_gives_all_its_training_samples(tmp_path):
    task = load_federated_dataset(str(make_dataset(tmp_path, "Task", num_clients=3, input_shape=(1, 4, 4))))
    folder = make_dataset(tmp_path, "Proxy", num_clients=2, input_shape=(1, 4, 4), train_sizes=[7, 5], seed=3)
    sizes = [c.num_train for c in task.clients]
    out = with_public_data(args_for(str(folder)), task)
    assert len(public_data_of(out)) == 12 and [c.num_train for c in out.clients] == sizes
    wrong = make_dataset(tmp_path, "Wrong", num_clients=2, input_shape=(1, 5, 5))
    with pytest.raises(FLError, match="shape"):
        with_public_data(args_for(str(wrong)), task)


@pytest.mark.parametrize("spec, message", [("1.5", "in \\(0, 1\\)"), ("0", "in \\(0, 1\\)"),
                                           ("/no/such/folder", "neither a fraction"), ("0.0001", "draws none")])
def test_bad_values(spec, message):
    with pytest.raises(FLError, match=message):
        with_public_data(args_for(spec), random_dataset(3, 4, 2, [10, 10, 10]))


def test_without_the_flag_nothing_changes():
    data = random_dataset(3, 4, 2, [10, 10, 10])
    assert with_public_data(args_for(None), data) is data and public_data_of(data) is None
    with pytest.raises(FLError, match="--public_data"):
        require_public_data(data, "KT-pFL")


def test_recorded_in_the_results_and_bad_values_exit_2(tmp_path, capsys):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 4, 4))
    argv = ["-data", str(folder), "-m", "DNN", "-algo", "KT-pFL", "-gr", "1", "-dev", "cpu", "--progress", "False",
            "-q", "--results_dir", str(tmp_path / "r")]
    assert main.main([*argv, "--public_data", "0.05"]) == 0
    with h5py.File(next((tmp_path / "r").glob("*.h5"))) as f:
        config = json.loads(f.attrs["config"])
    assert config["public_data"] == "0.05" and config["public_data_size"] > 0
    capsys.readouterr()
    assert main.main([*argv, "--public_data", "2", "--overwrite"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("flags, user", [
    (["-algo", "Sageflow"], "Sageflow"),
    (["-algo", "KT-pFL"], "KT-pFL"),
    (["-algo", "FAIR", "--fair_aggregation", "learned"], "FAIR --fair_aggregation learned"),
    (["-algo", "FedAvg", "--robust", "clip,fltrust"], "--robust fltrust"),
])
def test_a_run_that_needs_public_data_is_refused_before_any_data_is_read(tmp_path, capsys, flags, user):
    # the dataset folder does not exist: the refusal must come first, from the flags alone
    rc = main.main(["-data", str(tmp_path / "absent"), "--results_dir", str(tmp_path / "res"), "-dev", "cpu",
                    "-gr", "1", *flags, "--progress", "False", "-q", "True"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [f"error: {user} needs a public dataset held by the server: pass --public_data 0.02 (2% of the "
                               "training pool) or --public_data <generated dataset folder>"]
    assert not (tmp_path / "res").exists()


def test_runs_that_do_not_need_public_data_pass_the_check():
    for flags in (["-algo", "FAIR"], ["-algo", "FedAvg", "--robust", "clip,multi_krum"], ["-algo", "Sageflow",
                                                                                          "--public_data", "0.02"]):
        main.parse_args([*flags, "-dev", "cpu"])  # no FLError


def test_public_data_nothing_uses_is_refused_unless_withheld_on_purpose(tmp_path, capsys):
    """FedAvg (and FAIR's default quality mode) use no public set: --public_data would only take rows
    from the clients, so it is refused in one line; --public_data_withhold asks for it explicitly."""
    for algo in ("FedAvg", "FAIR"):
        assert main.main(["-data", str(tmp_path / "none"), "-algo", algo, "-dev", "cpu", "--public_data", "0.3"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"neither {algo} nor an option of this run uses a public set" in err, err
    args = main.parse_args(["-algo", "FedAvg", "-dev", "cpu", "--public_data", "0.3", "--public_data_withhold"])
    assert args.public_data == "0.3" and args.public_data_withhold
