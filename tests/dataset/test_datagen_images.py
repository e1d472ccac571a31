"""CIFAR-100 and EMNIST generators on small files in their real raw formats."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO
from datagen_helpers import (LocalServer, all_labels, load_client, make_cifar100_bin,
                             make_cifar100_py, make_emnist_zip, md5, read_config, tar_folder)

from datagen import download, image_sources
from datagen.errors import ChecksumError, ReadError


def run_script(script, *args, env=None):
    return subprocess.run([sys.executable, script, *args], cwd=REPO / "dataset", env=env,
                          capture_output=True, text=True, timeout=120)


def test_cifar100_python_version_read_with_verified_checksums(tmp_path):
    table, x, y = make_cifar100_py(tmp_path / "cifar-100-python")
    data = image_sources.read_cifar100(tmp_path, checksums=table)
    np.testing.assert_array_equal(data.x, x)
    np.testing.assert_array_equal(data.y, y)
    assert data.num_train == 30 and data.num_classes == 100
    assert data.class_names[:2] == ["class0", "class1"]
    # The same files as the tarball the authors publish.
    archive = tar_folder(tmp_path / "cifar-100-python", tmp_path / "c.tar.gz", "cifar-100-python")
    np.testing.assert_array_equal(image_sources.read_cifar100(archive, checksums=table).y, y)


def test_cifar100_pickle_with_wrong_checksum_is_not_unpickled(tmp_path):
    make_cifar100_py(tmp_path / "cifar-100-python")
    with pytest.raises(ChecksumError, match="refusing to unpickle"):
        image_sources.read_cifar100(tmp_path)  # the published digests do not match test files


class Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_cifar100_pickle_with_code_is_refused_even_with_matching_checksum(tmp_path):
    table, _, _ = make_cifar100_py(tmp_path / "p")
    (tmp_path / "p" / "train").write_bytes(pickle.dumps({b"data": Boom()}, protocol=3))
    table["train"] = md5(tmp_path / "p" / "train")
    with pytest.raises(ReadError, match="refusing to load"):
        image_sources.read_cifar100(tmp_path / "p", checksums=table)


def test_cifar100_binary_version_and_generator_script(tmp_path):
    x, y = make_cifar100_bin(tmp_path / "raw" / "cifar-100-binary")
    data = image_sources.read_cifar100(tmp_path / "raw")
    np.testing.assert_array_equal(data.x, x)
    np.testing.assert_array_equal(data.y, y)
    archive = tar_folder(tmp_path / "raw" / "cifar-100-binary", tmp_path / "b.tar.gz",
                         "cifar-100-binary")
    out = tmp_path / "Cifar100"
    proc = run_script("generate_Cifar100.py", "noniid", "-", "dir", "--num-clients", "3",
                      "--raw-dir", str(archive), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    config = read_config(out)
    assert config["num_classes"] == 100 and config["input_shape"] == [3, 32, 32]
    np.testing.assert_array_equal(np.sort(all_labels(out)), np.sort(y))
    assert (out / "partition.png").read_bytes()[:4] == b"\x89PNG"


def test_cifar100_truncated_binary_is_one_line_error(tmp_path):
    make_cifar100_bin(tmp_path)
    (tmp_path / "train.bin").write_bytes((tmp_path / "train.bin").read_bytes()[:-5])
    with pytest.raises(ReadError, match="truncated"):
        image_sources.read_cifar100(tmp_path)


def test_cifar100_download_through_local_mirror(tmp_path, monkeypatch):
    table, _, y = make_cifar100_py(tmp_path / "src" / "cifar-100-python")
    www = tmp_path / "www"
    www.mkdir()
    archive = tar_folder(tmp_path / "src" / "cifar-100-python", www / "cifar-100-python.tar.gz",
                         "cifar-100-python")
    monkeypatch.setattr(image_sources, "CIFAR100_FILES",
                        (download.RemoteFile(archive.name, md5(archive)),))
    monkeypatch.setattr(image_sources, "CIFAR100_PY_MD5", table)
    with LocalServer(www) as server:
        monkeypatch.setenv(download.MIRROR_ENV, server.url)
        data = image_sources.load_cifar100(None, tmp_path / "dl")
        assert server.requests == ["/cifar-100-python.tar.gz"]
    np.testing.assert_array_equal(data.y, y)
    assert (tmp_path / "dl" / "cifar-100-python.tar.gz").is_file()


@pytest.mark.parametrize("split,classes,offset", [("digits", 10, 0), ("letters", 26, 1),
                                                  ("byclass", 62, 0)])
def test_emnist_read_from_nist_zip(tmp_path, split, classes, offset):
    images, labels = make_emnist_zip(tmp_path / "gzip.zip", split, num_classes=classes,
                                     label_offset=offset)
    data = image_sources.read_emnist(tmp_path, split)
    np.testing.assert_array_equal(data.x[:, 0], images)
    np.testing.assert_array_equal(data.y, labels)
    assert data.num_classes == classes and data.num_train == 40
    assert labels.min() == 0


def test_emnist_missing_split_is_one_line_error(tmp_path):
    make_emnist_zip(tmp_path / "gzip.zip", "digits")
    with pytest.raises(ReadError, match="no emnist-letters-train-images-idx3-ubyte.gz"):
        image_sources.read_emnist(tmp_path / "gzip.zip", "letters")


def test_emnist_generator_script_downloads_from_local_mirror(tmp_path):
    www = tmp_path / "www"
    images, labels = make_emnist_zip(www / "gzip.zip", "balanced", num_classes=47)
    out = tmp_path / "E"
    with LocalServer(www) as server:
        # The published MD5 does not match the test zip, so give the script a raw dir
        # for the read and check the download path with the right digest in-process.
        env = dict(os.environ, FL_DATASET_MIRROR=server.url)
        proc = run_script("generate_EMNIST.py", "noniid", "-", "pat", "--split", "balanced",
                          "--num-clients", "47", "--class-per-client", "1",
                          "--raw-dir", str(www), "--out-dir", str(out), env=env)
        assert proc.returncode == 0, proc.stderr
        bad = run_script("generate_EMNIST.py", "--out-dir", str(tmp_path / "E2"), env=env)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1
        assert "MD5" in bad.stderr and "--raw-dir" in bad.stderr
    config = read_config(out)
    assert config["num_classes"] == 47 and config["emnist_split"] == "balanced"
    assert [len(p) for p in config["Size of samples for labels in clients"]] == [1] * 47
    assert len(all_labels(out)) == 60
    x, _ = load_client(out, "train", 0)
    assert x.shape[1:] == (1, 28, 28)
