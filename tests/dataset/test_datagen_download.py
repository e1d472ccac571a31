"""Checksummed downloads against a local http.server on 127.0.0.1 (never an external host)."""

import shutil

import numpy as np
import pytest
from datagen_helpers import LocalServer, all_labels, closed_port_url, make_idx_dataset, md5, read_config

from datagen import dataset_utils, download, sources
from datagen.errors import ChecksumError, DownloadError

FAST = dict(attempts=2, backoff=0.01, timeout=5)


@pytest.fixture
def served(tmp_path):
    """Small gz IDX files under good/, a corrupted copy under bad/, and their RemoteFiles."""
    good = tmp_path / "www" / "good"
    make_idx_dataset(good, 40, 20)
    bad = tmp_path / "www" / "bad"
    shutil.copytree(good, bad)
    target = bad / "train-images-idx3-ubyte.gz"
    data = bytearray(target.read_bytes())
    data[100] ^= 0xFF
    target.write_bytes(bytes(data))
    files = [download.RemoteFile(p.name, md5(p)) for p in sorted(good.iterdir())]
    with LocalServer(tmp_path / "www") as server:
        yield server, files


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or "part" in p.name)


def test_download_verifies_and_skips_present_files(tmp_path, served):
    server, files = served
    dest = tmp_path / "raw"
    paths = download.download_all(files, dest, [server.url + "good/"], dataset="T", **FAST)
    assert [md5(p) for p in paths] == [f.md5 for f in files]
    assert leftovers(dest) == []
    count = len(server.requests)
    download.download_all(files, dest, [server.url + "good/"], dataset="T", **FAST)
    assert len(server.requests) == count  # verified copies are not fetched again


def test_corrupted_file_is_retried_then_refused_without_partial_file(tmp_path, served):
    server, files = served
    dest = tmp_path / "raw"
    corrupt = [f for f in files if f.name == "train-images-idx3-ubyte.gz"]
    with pytest.raises(ChecksumError, match="MD5") as info:
        download.download_all(corrupt, dest, [server.url + "bad/"], dataset="T", **FAST)
    assert "\n" not in str(info.value) and "--raw-dir" in str(info.value)
    assert server.requests.count("/bad/train-images-idx3-ubyte.gz") == FAST["attempts"]
    assert list(dest.iterdir()) == []


def test_next_mirror_used_after_corrupt_or_missing_copy(tmp_path, served):
    server, files = served
    dest = tmp_path / "raw"
    mirrors = [server.url + "missing/", server.url + "bad/", server.url + "good/"]
    paths = download.download_all(files, dest, mirrors, dataset="T", **FAST)
    assert [md5(p) for p in paths] == [f.md5 for f in files]
    # A 404 is not retried on the same mirror.
    assert server.requests.count("/missing/train-images-idx3-ubyte.gz") == 1
    assert leftovers(dest) == []


def test_unreachable_host_gives_one_line_raw_dir_hint(tmp_path):
    files = list(download.MNIST_FILES)
    with pytest.raises(DownloadError) as info:
        download.download_all(files, tmp_path, [closed_port_url()], dataset="MNIST", **FAST)
    message = str(info.value)
    assert "\n" not in message
    assert "--raw-dir" in message and "Connection refused" in message
    assert all(f.name in message for f in files)
    assert list(tmp_path.iterdir()) == []


def test_mirror_env_override(monkeypatch):
    monkeypatch.setenv(download.MIRROR_ENV, "http://127.0.0.1:1/a/, http://127.0.0.1:2/b/")
    assert download.mirrors_from_env(["https://x/"]) == ["http://127.0.0.1:1/a/", "http://127.0.0.1:2/b/"]
    monkeypatch.delenv(download.MIRROR_ENV)
    assert download.mirrors_from_env(["https://x/"]) == ["https://x/"]


def test_published_checksums_table():
    assert {f.name: f.md5 for f in download.MNIST_FILES} == {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    }
    assert download.MNIST_MIRRORS[0] == "https://ossci-datasets.s3.amazonaws.com/mnist/"


def test_generator_downloads_through_env_mirror(tmp_path, served, monkeypatch, capsys):
    server, files = served
    monkeypatch.setenv(download.MIRROR_ENV, server.url + "good/")
    loader = sources.idx_loader("MNIST", files, download.MNIST_MIRRORS, sources.MNIST_CLASSES)
    out = tmp_path / "out"
    argv = ["iid", "balance", "-", "--num-clients", "3", "--out-dir", str(out)]
    assert dataset_utils.main(argv, "MNIST", loader, tmp_path) == 0
    assert sorted(p.name for p in (out / "rawdata").iterdir()) == sorted(f.name for f in files)
    assert read_config(out)["input_shape"] == [1, 28, 28]
    assert len(all_labels(out)) == 60
    assert np.bincount(all_labels(out)).tolist() == [6] * 10
