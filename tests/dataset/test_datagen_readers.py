"""Raw-file readers (IDX, CIFAR-10 binary and python versions) on small files in the real formats."""

import gzip
import io
import os
import pickle
import tarfile

import numpy as np
import pytest
from datagen_helpers import CIFAR_FILES, idx_bytes, make_cifar_bin, make_cifar_py, make_idx_dataset

from datagen import readers
from datagen.errors import ChecksumError, ReadError


@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip(tmp_path, gz):
    images, labels = make_idx_dataset(tmp_path, 30, 10, gz=gz)
    stem = "train-images-idx3-ubyte"
    path = readers.find_idx_file(tmp_path, stem)
    assert path.name == (f"{stem}.gz" if gz else stem)
    x, y = readers.read_idx_pair(path, readers.find_idx_file(tmp_path, "train-labels-idx1-ubyte"))
    np.testing.assert_array_equal(x, images[:30])
    np.testing.assert_array_equal(y, labels[:30])
    assert x.dtype == np.uint8 and y.dtype == np.int64


def test_idx_dotted_name_found(tmp_path):
    (tmp_path / "t10k-labels.idx1-ubyte").write_bytes(idx_bytes(np.zeros(3)))
    assert readers.find_idx_file(tmp_path, "t10k-labels-idx1-ubyte").name == "t10k-labels.idx1-ubyte"


def test_idx_missing_file_names_it(tmp_path):
    with pytest.raises(ReadError, match="train-images-idx3-ubyte"):
        readers.find_idx_file(tmp_path, "train-images-idx3-ubyte")


@pytest.mark.parametrize("mangle,match", [
    (lambda b: b"\x08\x03" + b[2:], "not an IDX file"),
    (lambda b: b[:-5], "truncated or corrupt"),
    (lambda b: b + b"\x00", "truncated or corrupt"),
    (lambda b: b[:6], "truncated IDX header"),
    (lambda b: b[:2], "too short"),
])
def test_idx_corruption_is_one_line_error(tmp_path, mangle, match):
    path = tmp_path / "bad"
    path.write_bytes(mangle(idx_bytes(np.zeros((4, 28, 28)))))
    with pytest.raises(ReadError, match=match) as info:
        readers.read_idx(path)
    assert "\n" not in str(info.value)


def test_idx_wrong_rank_and_truncated_gzip(tmp_path):
    path = tmp_path / "labels.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros(5))))
    with pytest.raises(ReadError, match="expected 3 dimensions"):
        readers.read_idx(path, ndim=3)
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(ReadError, match="gzip"):
        readers.read_idx(path)


def test_idx_pair_count_mismatch(tmp_path):
    (tmp_path / "i").write_bytes(idx_bytes(np.zeros((3, 28, 28))))
    (tmp_path / "l").write_bytes(idx_bytes(np.zeros(2)))
    with pytest.raises(ReadError, match="3 images but"):
        readers.read_idx_pair(tmp_path / "i", tmp_path / "l")


def test_cifar_binary_folder_and_parent(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    x, y = make_cifar_bin(folder, per_file=7)
    for where in (folder, tmp_path):
        rx, ry = readers.read_cifar10(where)
        np.testing.assert_array_equal(rx, x)
        np.testing.assert_array_equal(ry, y)
    assert rx.shape == (42, 3, 32, 32)


def test_cifar_binary_truncated_and_bad_label(tmp_path):
    make_cifar_bin(tmp_path, per_file=3)
    path = tmp_path / "data_batch_3.bin"
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    with pytest.raises(ReadError, match="data_batch_3.bin.*3073-byte"):
        readers.read_cifar10_bin(tmp_path)
    path.write_bytes(bytes([42]) + data[1:])
    with pytest.raises(ReadError, match="label byte 42"):
        readers.read_cifar10_bin(tmp_path)


def test_cifar_binary_tarball(tmp_path):
    folder = tmp_path / "src" / "cifar-10-batches-bin"
    x, y = make_cifar_bin(folder, per_file=5)
    archive = tmp_path / "cifar-10-binary.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-bin")
    for where in (archive, tmp_path):
        rx, ry = readers.read_cifar10(where)
        np.testing.assert_array_equal(rx, x)
        np.testing.assert_array_equal(ry, y)
    archive.write_bytes(archive.read_bytes()[:200])
    with pytest.raises(ReadError, match="corrupt or truncated archive"):
        readers.read_cifar10(archive)


def test_cifar_python_read_after_checksum(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    table = make_cifar_py(folder, per_file=4)
    x, y = readers.read_cifar10(tmp_path, checksums=table)
    assert x.shape == (24, 3, 32, 32) and y.dtype == np.int64
    batch = pickle.loads((folder / "test_batch").read_bytes())
    np.testing.assert_array_equal(x[-4:].reshape(4, -1), batch[b"data"])


def test_cifar_python_checksum_mismatch_refused_before_unpickling(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    make_cifar_py(folder, per_file=4)
    # The published table does not match the fake files, so nothing is unpickled.
    with pytest.raises(ChecksumError, match="data_batch_1: MD5 .* differs from the published "
                                            "c99cafc152244af753f735de768cd75f"):
        readers.read_cifar10(folder)


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_cifar_python_allow_list_blocks_code_even_with_matching_checksum(tmp_path):
    folder = tmp_path / "py"
    table = make_cifar_py(folder, per_file=2)
    evil = pickle.dumps({b"data": _Payload(), b"labels": [0]}, protocol=3)
    (folder / "data_batch_2").write_bytes(evil)
    table["data_batch_2"] = readers.md5_bytes(evil)
    with pytest.raises(ReadError, match="refusing to load"):
        readers.read_cifar10_py(folder, checksums=table)


def test_cifar_python_tarball_verified(tmp_path):
    folder = tmp_path / "src" / "cifar-10-batches-py"
    table = make_cifar_py(folder, per_file=3)
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in CIFAR_FILES:
            tar.add(folder / name, arcname=f"cifar-10-batches-py/{name}")
    x, _ = readers.read_cifar10(archive, checksums=table)
    assert len(x) == 18
    with pytest.raises(ChecksumError):
        readers.read_cifar10(archive)


def test_cifar_missing_everything(tmp_path):
    with pytest.raises(ReadError, match="no CIFAR-10 files"):
        readers.read_cifar10(tmp_path)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz"):
        pass
    (tmp_path / "empty.tar.gz").write_bytes(buf.getvalue())
    with pytest.raises(ReadError, match="not a CIFAR-10 archive"):
        readers.read_cifar10(tmp_path / "empty.tar.gz")
