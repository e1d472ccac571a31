"""Generator CLI and writer: format, config.json, no-op regeneration, caps, real MNIST/Fashion-MNIST, scripts."""

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import FASHION_RAW, MNIST_RAW, REPO
from datagen_helpers import all_labels, closed_port_url, load_client, make_cifar_bin, read_config

from datagen import dataset_utils, sources

DIGITS_ARGS = ["noniid", "-", "dir", "--num-clients", "5"]
PFLLIB_KEYS = {"num_clients", "num_classes", "non_iid", "balance", "partition",
               "Size of samples for labels in clients", "alpha", "batch_size"}
OUR_KEYS = {"dataset", "seed", "train_ratio", "class_per_client", "samples_per_client",
            "shards_per_client", "class_names", "input_shape", "format", "train_samples",
            "test_samples"}
MNIST_HISTOGRAM = [6903, 7877, 6990, 7141, 6824, 6313, 6876, 7293, 6825, 6958]


def digits(out, *extra, argv=DIGITS_ARGS):
    return dataset_utils.main([*argv, *extra, "--out-dir", str(out)], "Digits",
                              sources.load_digits, out.parent)


def check_written(out, total):
    """Config keys, pickle-free npz files, per-client counts and statistic all agree."""
    config = read_config(out)
    assert PFLLIB_KEYS | OUR_KEYS <= set(config)
    assert config["format"] == "npz-xy-v1"
    n = config["num_clients"]
    for c in range(n):
        x_tr, y_tr = load_client(out, "train", c)
        x_te, y_te = load_client(out, "test", c)
        assert x_tr.dtype == np.float32 and y_tr.dtype == np.int64
        assert list(x_tr.shape[1:]) == config["input_shape"]
        assert (len(y_tr), len(y_te)) == (config["train_samples"][c], config["test_samples"][c])
        values, counts = np.unique(np.concatenate([y_tr, y_te]), return_counts=True)
        assert config["Size of samples for labels in clients"][c] == [
            [int(v), int(k)] for v, k in zip(values, counts)]
    assert sum(config["train_samples"]) + sum(config["test_samples"]) == total
    assert not list(out.rglob("*.tmp"))
    return config


def test_digits_written_in_safe_format(tmp_path, capsys):
    out = tmp_path / "Digits"
    assert digits(out) == 0
    config = check_written(out, 1797)
    assert config["input_shape"] == [1, 8, 8] and config["num_classes"] == 10
    assert config["partition"] == "dir" and config["non_iid"] is True and config["balance"] is False
    assert config["seed"] == 1 and config["train_ratio"] == 0.75 and config["alpha"] == 0.1
    x, _ = load_client(out, "train", 0)
    assert x.min() >= -1 and x.max() <= 1
    printed = capsys.readouterr().out
    assert "Client 0\t Size of data: " in printed and "Samples of labels:" in printed
    # Train counts follow floor(0.75 n) per client, as sklearn's split in PFLlib.
    assert all(tr == int(0.75 * (tr + te)) for tr, te in
               zip(config["train_samples"], config["test_samples"]))


def test_normalisation_matches_pfllib():
    data = sources.RawDataset(np.array([[0, 51, 255]], dtype=np.uint8), np.array([0]), 1, ["a"])
    np.testing.assert_allclose(data.features(np.array([0])), [[-1.0, -0.6, 1.0]], rtol=1e-6)


def test_regeneration_is_a_noop_unless_options_change_or_force(tmp_path, capsys):
    out = tmp_path / "Digits"
    digits(out)
    stamp = (out / "config.json").stat().st_mtime_ns
    capsys.readouterr()
    assert digits(out) == 0
    assert "skipped" in capsys.readouterr().out
    assert (out / "config.json").stat().st_mtime_ns == stamp
    for extra in (["--seed", "2"], ["--train-ratio", "0.8"], ["--samples-per-client", "50"]):
        digits(out, *extra)
        assert "skipped" not in capsys.readouterr().out
    digits(out, "--samples-per-client", "50")
    assert "skipped" in capsys.readouterr().out
    digits(out, "--samples-per-client", "50", "--force")
    assert "skipped" not in capsys.readouterr().out


def test_fewer_clients_remove_stale_files(tmp_path):
    out = tmp_path / "Digits"
    digits(out)
    digits(out, argv=["iid", "balance", "-", "--num-clients", "3"])
    assert sorted(p.name for p in (out / "train").iterdir()) == ["0.npz", "1.npz", "2.npz"]
    config = check_written(out, 1797)
    assert config["non_iid"] is False and config["partition"] is None


def test_incomplete_folder_is_regenerated(tmp_path, capsys):
    out = tmp_path / "Digits"
    digits(out)
    (out / "test" / "3.npz").unlink()
    capsys.readouterr()
    digits(out)
    assert "skipped" not in capsys.readouterr().out
    check_written(out, 1797)


def test_same_seed_same_files(tmp_path):
    digits(tmp_path / "a")
    digits(tmp_path / "b")
    digits(tmp_path / "c", "--seed", "5")
    for part in ("train", "test"):
        xa, ya = load_client(tmp_path / "a", part, 2)
        xb, yb = load_client(tmp_path / "b", part, 2)
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert read_config(tmp_path / "a")["Size of samples for labels in clients"] != \
        read_config(tmp_path / "c")["Size of samples for labels in clients"]


def test_sample_cap_applies_to_training_part_only(tmp_path):
    digits(tmp_path / "full")
    digits(tmp_path / "capped", "--samples-per-client", "50")
    full, capped = read_config(tmp_path / "full"), read_config(tmp_path / "capped")
    assert capped["samples_per_client"] == 50
    assert capped["train_samples"] == [min(50, n) for n in full["train_samples"]]
    assert capped["test_samples"] == full["test_samples"]
    # Same seed: same partition and split, so the capped training set is a subset.
    x_full, _ = load_client(tmp_path / "full", "train", 0)
    x_cap, _ = load_client(tmp_path / "capped", "train", 0)
    full_rows = {row.tobytes() for row in x_full}
    assert all(row.tobytes() in full_rows for row in x_cap)
    check_written(tmp_path / "capped", sum(capped["train_samples"]) + sum(capped["test_samples"]))


@pytest.mark.parametrize("argv,message", [
    (["noniid", "-", "pat", "--class-per-client", "11"], "--class-per-client must be between 1 and 10"),
    (["noniid", "-", "-"], "noniid needs a partition"),
    (["noniid", "-", "dir", "--num-clients", "2000"], "more clients (2000) than samples (1797)"),
    (["noniid", "-", "dir", "--train-ratio", "1"], "--train-ratio"),
])
def test_user_errors_are_one_line_exit_2(tmp_path, capsys, argv, message):
    assert digits(tmp_path / "d", argv=argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert not (tmp_path / "d" / "config.json").exists()


@pytest.mark.parametrize("partition", ["pat", "exdir", "shard"])
def test_other_partitions_write_complete_datasets(tmp_path, partition):
    out = tmp_path / partition
    assert digits(out, "--alpha", "100", argv=["noniid", "-", partition, "--num-clients", "5"]) == 0
    config = check_written(out, 1797)
    assert config["partition"] == partition
    labels_per_client = [len(s) for s in config["Size of samples for labels in clients"]]
    assert max(labels_per_client) <= (4 if partition == "shard" else 2)


def test_cifar10_generator_from_small_binary_files(tmp_path):
    raw = tmp_path / "raw" / "cifar-10-batches-bin"
    _, y = make_cifar_bin(raw, per_file=40)
    out = tmp_path / "Cifar10"
    argv = ["noniid", "-", "pat", "--num-clients", "5", "--raw-dir", str(raw.parent),
            "--out-dir", str(out)]
    assert dataset_utils.main(argv, "Cifar10", sources.load_cifar10, tmp_path) == 0
    config = check_written(out, 240)
    assert config["input_shape"] == [3, 32, 32] and config["class_names"][0] == "airplane"
    assert np.bincount(all_labels(out)).tolist() == np.bincount(y).tolist()


def test_synthetic_generator(tmp_path, capsys):
    assert dataset_utils.main_synthetic(["--num-clients", "6"], tmp_path) == 0
    out = tmp_path / "Synthetic"
    config = read_config(out)
    total = sum(config["train_samples"]) + sum(config["test_samples"])
    check_written(out, total)
    assert config["input_shape"] == [60] and config["num_classes"] == 10
    assert config["synthetic_alpha"] == 1.0 and config["partition"] == "synthetic"
    assert all(n + m >= 50 for n, m in zip(config["train_samples"], config["test_samples"]))
    x, _ = load_client(out, "train", 0)
    assert x.dtype == np.float32 and x.shape[1] == 60
    argv = ["--num-clients", "4", "--synthetic-alpha", "0.5", "--synthetic-beta", "0.5"]
    assert dataset_utils.main_synthetic(argv, tmp_path) == 0
    assert (tmp_path / "Synthetic_0.5_0.5" / "config.json").is_file()
    assert dataset_utils.main_synthetic(["--num-clients", "4", "--iid"], tmp_path) == 0
    assert read_config(tmp_path / "Synthetic_iid")["non_iid"] is False
    capsys.readouterr()
    assert dataset_utils.main_synthetic(["--num-clients", "6"], tmp_path) == 0
    assert "skipped" in capsys.readouterr().out


def test_real_mnist_from_raw_dir(tmp_path):
    if not (MNIST_RAW / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"offline MNIST not found in {MNIST_RAW}")
    out = tmp_path / "MNIST"
    argv = ["noniid", "-", "dir", "--num-clients", "5", "--raw-dir", str(MNIST_RAW),
            "--out-dir", str(out)]
    assert dataset_utils.main(argv, "MNIST", sources.load_mnist, tmp_path) == 0
    config = check_written(out, 70_000)
    assert config["input_shape"] == [1, 28, 28] and config["num_classes"] == 10
    assert np.bincount(all_labels(out)).tolist() == MNIST_HISTOGRAM
    x, _ = load_client(out, "test", 0)
    assert x.min() == -1.0 and x.max() == 1.0


def test_real_fashion_mnist_from_debian_package(tmp_path):
    if not (FASHION_RAW / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"Fashion-MNIST not installed in {FASHION_RAW} "
                    f"(apt-get install -y dataset-fashion-mnist)")
    data = sources.load_fashion_mnist(FASHION_RAW, tmp_path / "unused")
    assert data.x.shape == (70_000, 1, 28, 28) and data.x.dtype == np.uint8
    assert np.bincount(data.y).tolist() == [7000] * 10
    # End to end with a small written footprint (compressing all 70,000 images takes ~12 s;
    # the full-size write path is covered by the MNIST test).
    out = tmp_path / "FashionMNIST"
    argv = ["iid", "balance", "-", "--num-clients", "4", "--raw-dir", str(FASHION_RAW),
            "--train-ratio", "0.99", "--samples-per-client", "30", "--out-dir", str(out)]
    assert dataset_utils.main(argv, "FashionMNIST", sources.load_fashion_mnist, tmp_path) == 0
    config = check_written(out, 4 * 30 + 4 * 175)
    assert config["class_names"][0] == "T-shirt/top"
    # Balanced IID: 17,500 samples per client, 1% of them (175) held out for testing.
    assert config["test_samples"] == [175] * 4


def run_script(script, *args, env=None):
    return subprocess.run([sys.executable, script, *args], cwd=REPO / "dataset", env=env,
                          capture_output=True, text=True, timeout=120)


def test_pfllib_positional_cli_via_subprocess(tmp_path):
    out = tmp_path / "Digits"
    proc = run_script("generate_Digits.py", "noniid", "-", "pat", "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "Client 9\t Size of data: " in proc.stdout
    config = check_written(out, 1797)
    assert config["num_clients"] == 10 and config["partition"] == "pat"
    again = run_script("generate_Digits.py", "noniid", "-", "pat", "--out-dir", str(out))
    assert "skipped" in again.stdout


def test_unreachable_mirror_via_subprocess_is_one_line(tmp_path):
    env = dict(os.environ, FL_DATASET_MIRROR=closed_port_url())
    proc = run_script("generate_MNIST.py", "noniid", "-", "dir", "--out-dir", str(tmp_path / "M"),
                      env=env)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: MNIST: cannot download")
    assert "--raw-dir" in proc.stderr and "Traceback" not in proc.stderr
