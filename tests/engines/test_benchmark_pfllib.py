"""benchmark.py's engine variants and its run of PFLlib's own main.py (``--pfllib DIR``)."""
from __future__ import annotations

import textwrap

import pytest

import benchmark
from toydata import make_dataset


def test_engine_variants_become_flags():
    assert benchmark.split_variant("batched") == ("batched", [])
    assert benchmark.split_variant("batched+eager") == ("batched", ["--step_runner", "eager"])
    assert benchmark.split_variant("batched+compiled+bf16") == (
        "batched", ["--step_runner", "compiled", "--precision", "bf16"])
    assert benchmark.split_variant("sequential", "tf32") == ("sequential", ["--precision", "tf32"])
    assert benchmark.split_variant("sequential+fp32", "bf16") == ("sequential", [])
    assert benchmark.split_variant("auto+evaleager") == ("auto", ["--eval_frozen", "False"])
    assert benchmark.split_variant("auto+evalfrozen") == ("auto", ["--eval_frozen", "True"])
    assert benchmark.split_variant("batched+evalbs128") == ("batched", ["--eval_batch_size", "128"])
    assert benchmark.split_variant("batched+cudnnbench+nhwc") == (
        "batched", ["--cudnn_benchmark", "True", "--conv_layout", "channels_last"])
    assert benchmark.split_variant("batched+unfold+eager") == ("batched", ["--batched_conv", "unfold", "--step_runner", "eager"])
    with pytest.raises(SystemExit, match="unknown variant"):
        benchmark.split_variant("batched+fast")


FAKE_MAIN = '''
import sys, numpy as np
args = sys.argv[1:]
rounds = int(args[args.index("-gr") + 1]) + 1  # PFLlib runs -gr + 1 rounds
data = np.load("../dataset/MNIST/train/0.npz", allow_pickle=True)["data"].tolist()  # PFLlib's format
print("rows", len(data["y"]), data["x"].dtype, tuple(data["x"].shape[1:]))
import os
print("omp", os.environ.get("OMP_NUM_THREADS"))
for i in range(rounds):
    print("Averaged Test Accuracy: 0.{:04d}".format(5000 + i))
    print("-" * 25, "time cost", "-" * 25, 2.0 + i)
print("Average time cost per round.")
'''


def test_pfllib_own_run_gets_our_partition_in_its_format_and_its_round_times(tmp_path):
    data = make_dataset(tmp_path / "data", num_clients=2, input_shape=(1, 28, 28), train_sizes=[7, 9])
    checkout = tmp_path / "PFLlib"
    (checkout / "system").mkdir(parents=True)
    (checkout / "system" / "main.py").write_text(textwrap.dedent(FAKE_MAIN))
    own = benchmark.pfllib_own_run(checkout, data, "cpu", rounds=2, warmup=1, timeout=60)
    assert "error" not in own, own
    assert own["round_times"] == [2.0, 3.0, 4.0] and own["s_per_round"] == 3.5 and own["timed_rounds"] == 2
    assert own["final_test_acc"] == pytest.approx(0.5002)
    assert own["argv"][own["argv"].index("-gr") + 1] == "2" and "-nc" in own["argv"]
    # its CPU seconds (the child's, start-up included) and the load around it, for a loaded machine
    assert own["cpu_s_total"] > 0 and own["cpu_s_per_round"] == pytest.approx(own["cpu_s_total"] / 3)
    assert len(own["load_avg_before"]) == len(own["load_avg_after"]) == 3
    own["cpu_s_per_round"] = 4.0
    lines = benchmark.pfllib_lines(own, [{"config": "P1", "engine": "batched", "s_per_round": 0.5, "cpu_s_per_round": 1.0}])
    assert "4.00 CPU s/round" in lines[1] and "over its 3 rounds" in lines[1] and "load " in lines[1]
    assert "speed-up 7.00x" in lines[2] and "4.00x in CPU seconds" in lines[2]


def test_pfllib_threads_set_its_omp_threads(tmp_path, monkeypatch):
    """``--pfllib-threads 1``: PFLlib's own run on one OpenMP thread (its main.py sets none itself)."""
    data = make_dataset(tmp_path / "data", num_clients=2, input_shape=(1, 28, 28), train_sizes=[7, 9])
    checkout = tmp_path / "PFLlib"
    (checkout / "system").mkdir(parents=True)
    (checkout / "system" / "main.py").write_text(textwrap.dedent(FAKE_MAIN).replace(
        'print("Average time cost', 'assert os.environ.get("OMP_NUM_THREADS") == "1", "not one thread"\nprint("Average time cost'))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    own = benchmark.pfllib_own_run(checkout, data, "cpu", rounds=1, warmup=1, timeout=60, threads=1)
    assert "error" not in own and own["threads"] == 1
    assert "OMP_NUM_THREADS=1" in benchmark.pfllib_lines(own, [])[0]
    assert "error" in benchmark.pfllib_own_run(checkout, data, "cpu", rounds=1, warmup=1, timeout=60)  # default: unset


def test_pfllib_own_run_says_what_is_missing(tmp_path):
    own = benchmark.pfllib_own_run(tmp_path, None, "cpu", 1, 1, 10)
    assert "no system/main.py" in own["error"]
    assert benchmark.pfllib_lines(own, [])[0].endswith(own["error"])


def test_a_single_pfllib_round_is_refused_in_one_line(tmp_path, capsys):
    """PFLlib's -gr 0 (one round) crashes in its own summary: refuse before anything runs."""
    with pytest.raises(SystemExit) as stop:
        benchmark.parse(["--pfllib", str(tmp_path), "--warmup", "0", "--rounds", "1"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--warmup" in err[0]
    assert benchmark.parse(["--pfllib", str(tmp_path), "--warmup", "1", "--rounds", "1"]).rounds == 1


def test_cudnn_benchmark_is_set_and_reset_per_run_on_cuda_and_left_alone_on_a_cpu():
    import torch

    import main

    before = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = False
        main.configure_backends(main.parse_args(["--cudnn_benchmark", "True"]), torch.device("cpu"))
        assert torch.backends.cudnn.benchmark is False
        main.configure_backends(main.parse_args(["--cudnn_benchmark", "True"]), torch.device("cuda"))
        assert torch.backends.cudnn.benchmark is True
        main.configure_backends(main.parse_args([]), torch.device("cuda"))  # the default resets it
        assert torch.backends.cudnn.benchmark is False
    finally:
        torch.backends.cudnn.benchmark = before
