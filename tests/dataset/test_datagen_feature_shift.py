"""Digit5: KD3A's MAT files (written here in their real layouts), one client per domain."""

import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO
from datagen_helpers import load_client, make_digit5, read_config

from datagen import digit5
from datagen.errors import ReadError


def run_script(script, *args):
    return subprocess.run([sys.executable, script, *args], cwd=REPO / "dataset",
                          capture_output=True, text=True, timeout=120)


def test_digit5_reads_every_domain_as_rgb32(tmp_path):
    labels = make_digit5(tmp_path / "DigitFive")
    data = digit5.read_digit5(tmp_path)
    assert data.x.shape == (60, 3, 32, 32) and data.x.dtype == np.uint8
    np.testing.assert_array_equal(data.y, np.concatenate([labels[d] for d in digit5.DIGIT5_DOMAINS]))
    assert data.group_domains == list(digit5.DIGIT5_DOMAINS)
    np.testing.assert_array_equal(np.bincount(data.groups), [12] * 5)
    # Grey MNIST is repeated over the three channels.
    mnist = data.x[data.groups == 0]
    np.testing.assert_array_equal(mnist[:, 0], mnist[:, 2])


def test_digit5_reads_dassl_syn_number_when_kd3a_synth_files_are_absent(tmp_path):
    labels = make_digit5(tmp_path, syn_layout="dassl")
    data = digit5.read_digit5(tmp_path, ("syn", "usps"))
    np.testing.assert_array_equal(data.y, np.concatenate([labels["syn"], labels["usps"]]))
    # Digit 0, written as class 10 in KD3A's SynthDigits and USPS files, is class 0.
    assert data.y.max() <= 9


def test_digit5_reads_svhns_own_file_names_when_kd3as_are_absent(tmp_path):
    labels = make_digit5(tmp_path)
    for split in ("train", "test"):
        (tmp_path / f"svhn_{split}_32x32.mat").rename(tmp_path / f"{split}_32x32.mat")
    data = digit5.read_digit5(tmp_path, ("svhn",))
    np.testing.assert_array_equal(data.y, labels["svhn"])


def test_rgb32_conversion_keeps_32_pixel_images_and_resizes_28():
    grey = np.arange(2 * 32 * 32).reshape(2, 32, 32) % 256
    out = digit5.to_rgb32(grey, "NHW")
    np.testing.assert_array_equal(out[:, 1], grey)
    small = np.full((1, 28, 28, 3), 77, dtype=np.uint8)
    assert digit5.to_rgb32(small, "NHWC").shape == (1, 3, 32, 32)
    assert np.all(digit5.to_rgb32(small, "NHWC") == 77)


def test_digit5_generator_one_client_per_domain(tmp_path):
    labels = make_digit5(tmp_path / "raw")
    out = tmp_path / "Digit5"
    proc = run_script("generate_Digit5.py", "--raw-dir", str(tmp_path / "raw"),
                      "--domains", "svhn", "usps", "mnist", "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    config = read_config(out)
    assert config["num_clients"] == 3 and config["input_shape"] == [3, 32, 32]
    assert sorted(config["client_domains"]) == ["mnist", "svhn", "usps"]
    for c, domain in enumerate(config["client_domains"]):
        y = np.concatenate([load_client(out, part, c)[1] for part in ("train", "test")])
        np.testing.assert_array_equal(np.sort(y), np.sort(labels[domain]))
    assert "domains: mnist (1 clients)" in proc.stdout
    assert (out / "partition.png").stat().st_size > 1000


def test_digit5_missing_file_names_raw_dir(tmp_path):
    make_digit5(tmp_path)
    (tmp_path / "synth_test_32x32.mat").unlink()
    with pytest.raises(ReadError, match="synth_test_32x32.mat: file not found"):
        digit5.read_digit5(tmp_path)
    proc = run_script("generate_Digit5.py", "--out-dir", str(tmp_path / "o"))
    assert proc.returncode == 2 and "--raw-dir" in proc.stderr and proc.stderr.count("\n") == 1


def test_domainnet_domain_zips_one_client_per_domain_with_class_subset(tmp_path):
    from datagen_helpers import image_bytes, write_zip
    for d, domain in enumerate(["clipart", "real", "sketch"]):
        write_zip(tmp_path / f"{domain}.zip",
                  {f"{domain}/{c}/{domain}_{c}_{i}.jpg": image_bytes(d * 50 + i, fmt="JPEG")
                   for c in ("bird", "zebra", "airplane") for i in range(2 + d)})
    out = tmp_path / "DomainNet"
    proc = run_script("generate_DomainNet.py", "--raw-dir", str(tmp_path), "--domains", "sketch",
                      "clipart", "real", "--classes", "zebra", "bird", "--image-size", "16",
                      "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    config = read_config(out)
    assert config["num_classes"] == 2 and config["class_names"] == ["bird", "zebra"]
    assert config["client_domains"] == ["sketch", "real", "clipart"]  # largest first
    assert np.add(config["train_samples"], config["test_samples"]).tolist() == [8, 6, 4]
    assert config["input_shape"] == [3, 16, 16]
    missing = run_script("generate_DomainNet.py", "--raw-dir", str(tmp_path), "--domains",
                         "quickdraw", "--out-dir", str(tmp_path / "o"))
    assert missing.returncode == 2 and "quickdraw" in missing.stderr


def test_amazon_review_npz_domains_as_clients(tmp_path):
    rng = np.random.default_rng(0)
    docs, features = 20, 5003
    dense = (rng.random((docs, features)) < 0.01) * rng.integers(1, 4, (docs, features))
    rows, cols = np.nonzero(dense.T)  # stored transposed: features x documents
    np.savez(tmp_path / "amazon.npz", xx_data=dense.T[rows, cols].astype(np.float64),
             xx_row=rows, xx_col=cols, xx_shape=np.array([features, docs]),
             yy=np.where(np.arange(docs) % 3 == 0, 1, -1)[:, None],
             offset=np.array([[0], [4], [9], [15], [20]]))
    out = tmp_path / "AmazonReview"
    proc = run_script("generate_AmazonReview.py", "--raw-dir", str(tmp_path), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    config = read_config(out)
    assert config["input_shape"] == [5000] and config["num_classes"] == 2
    # Largest domain first (6, 5, 5, 4 documents; ties keep the domain order).
    assert config["client_domains"] == ["electronics", "dvd", "kitchen", "books"]
    from datagen import misc_sources
    data = misc_sources.read_amazon_review(tmp_path)
    np.testing.assert_array_equal(data.x, dense[:, :5000].astype(np.float32))
    assert data.y.tolist() == [1 if i % 3 == 0 else 0 for i in range(docs)]
    np.save(tmp_path / "x.npy", np.array([object()], dtype=object), allow_pickle=True)
    with pytest.raises(ReadError):
        misc_sources.read_amazon_review(tmp_path / "x.npy")


def test_corrupt_mat_file_is_one_line_error(tmp_path):
    labels = make_digit5(tmp_path)
    assert labels
    # A MAT v5 header followed by a truncated data element (scipy raises its MatReadError).
    good = (tmp_path / "usps_28x28.mat").read_bytes()
    (tmp_path / "usps_28x28.mat").write_bytes(good[:200])
    with pytest.raises(ReadError, match="usps_28x28.mat"):
        digit5.read_digit5(tmp_path)
