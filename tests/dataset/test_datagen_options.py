"""Generator options, end to end on scikit-learn's digits (offline):
partition picture and summary, #C=k and quantity partitions, few-shot, the shared
global test set and the per-client feature skew."""

import struct
import zlib

import numpy as np
import pytest
from datagen_helpers import all_labels, load_client, make_idx_dataset, read_config

from datagen import dataset_utils, feature_skew, sources

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def digits(out, *argv):
    return dataset_utils.main([*argv, "--out-dir", str(out)], "Digits", sources.load_digits,
                              out.parent)


def assert_valid_png(path):
    """PNG signature, then chunks with correct CRCs up to IEND; returns (width, height)."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    pos, kinds = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        kinds.append(kind)
        pos += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds
    width, height = struct.unpack(">II", data[16:24])
    assert width > 100 and height > 100
    return width, height


@pytest.mark.parametrize("argv", [["noniid", "-", "dir", "--num-clients", "8"],
                                  ["noniid", "-", "dir", "--num-clients", "60", "--alpha", "1"]])
def test_partition_png_written_and_summary_printed(tmp_path, capsys, argv):
    out = tmp_path / "Digits"
    assert digits(out, *argv) == 0
    assert_valid_png(out / "partition.png")
    assert not list(out.glob("*.tmp*"))
    printed = capsys.readouterr().out
    assert "Partition summary:" in printed and "classes per client" in printed
    assert "label skew" in printed


def test_classes_partition_cli_gives_k_classes(tmp_path):
    out = tmp_path / "Digits"
    assert digits(out, "noniid", "-", "classes", "--class-per-client", "3",
                  "--num-clients", "6") == 0
    config = read_config(out)
    assert [len(pairs) for pairs in config["Size of samples for labels in clients"]] == [3] * 6
    assert len(all_labels(out)) == 1797


def test_quantity_partition_cli_spreads_sizes(tmp_path):
    out = tmp_path / "Digits"
    assert digits(out, "noniid", "-", "quantity", "--alpha", "0.3", "--num-clients", "10") == 0
    config = read_config(out)
    sizes = np.add(config["train_samples"], config["test_samples"])
    assert sizes.sum() == 1797 and sizes.max() > 3 * sizes.min()
    assert config["partition"] == "quantity"


def test_few_shot_limits_training_samples_per_label(tmp_path):
    out = tmp_path / "Digits"
    assert digits(out, "iid", "balance", "-", "--num-clients", "4", "--few-shot", "5") == 0
    for c in range(4):
        _, y = load_client(out, "train", c)
        assert np.bincount(y, minlength=10).tolist() == [5] * 10
        _, y_test = load_client(out, "test", c)
        assert len(y_test) > 50  # the test part is left whole
    assert read_config(out)["few_shot"] == 5


def test_global_test_split_uses_the_official_test_set(tmp_path):
    raw = tmp_path / "raw"
    images, labels = make_idx_dataset(raw, n_train=200, n_test=40)
    out = tmp_path / "MNIST"
    argv = ["noniid", "-", "dir", "--num-clients", "4", "--alpha", "1", "--test-split", "global",
            "--raw-dir", str(raw), "--out-dir", str(out)]
    assert dataset_utils.main(argv, "MNIST", sources.load_mnist, tmp_path) == 0
    test_x = np.concatenate([load_client(out, "test", c)[0] for c in range(4)])
    train_x = np.concatenate([load_client(out, "train", c)[0] for c in range(4)])
    assert len(test_x) == 40 and len(train_x) == 200
    # The clients' test files together are exactly the official test images, in equal slices.
    expected = sources.RawDataset(images[200:, None], labels[200:], 10, []).features(np.arange(40))
    as_rows = {row.tobytes() for row in test_x}
    assert as_rows == {row.tobytes() for row in expected}
    assert [len(load_client(out, "test", c)[1]) for c in range(4)] == [10] * 4
    assert read_config(out)["test_split"] == "global"


def test_global_test_split_without_official_split_holds_out_samples(tmp_path):
    out = tmp_path / "Digits"
    assert digits(out, "noniid", "-", "dir", "--num-clients", "5", "--test-split", "global") == 0
    config = read_config(out)
    assert sum(config["test_samples"]) == 1797 - int(0.75 * 1797)
    assert max(config["test_samples"]) - min(config["test_samples"]) <= 1


@pytest.mark.parametrize("kind", feature_skew.FEATURE_SKEWS)
def test_feature_skew_is_per_client_reproducible_and_recorded(tmp_path, kind):
    plain, skewed, again = tmp_path / "plain", tmp_path / "a", tmp_path / "b"
    base = ["iid", "balance", "-", "--num-clients", "4"]
    assert digits(plain, *base) == 0
    assert digits(skewed, *base, "--feature-skew", kind) == 0
    assert digits(again, *base, "--feature-skew", kind) == 0
    config = read_config(skewed)
    values = config["feature_skew_values"]
    assert len(values) == 4 and len(set(values)) == 4
    assert config["skew_strength"] == feature_skew.DEFAULT_STRENGTH[kind]
    for c in range(4):
        x_plain, y_plain = load_client(plain, "train", c)
        x_skew, y_skew = load_client(skewed, "train", c)
        np.testing.assert_array_equal(y_plain, y_skew)  # same samples, shifted features
        assert x_skew.shape == x_plain.shape and x_skew.dtype == np.float32
        assert not np.allclose(x_plain, x_skew)
        np.testing.assert_array_equal(x_skew, load_client(again, "train", c)[0])
    if kind == "noise":
        # Client c's noise std is strength * (c + 1) / n.
        for c in range(4):
            diff = load_client(skewed, "train", c)[0] - load_client(plain, "train", c)[0]
            assert diff.std() == pytest.approx(0.5 * (c + 1) / 4, rel=0.05)
    assert_valid_png(skewed / "partition.png")


def test_rotation_by_180_degrees_flips_the_image():
    x = np.random.default_rng(0).uniform(-1, 1, (2, 1, 8, 8)).astype(np.float32)
    turned, _ = feature_skew.SKEW_FUNCTIONS["rotation"](
        x, 0.0, 0, 1, np.random.default_rng(0))  # strength 0: angle 0, unchanged
    np.testing.assert_allclose(turned, x, atol=1e-6)

    class Fixed:
        def uniform(self, low, high):
            return 180.0
    turned, angle = feature_skew.SKEW_FUNCTIONS["rotation"](x, 180.0, 0, 1, Fixed())
    assert angle == 180.0
    np.testing.assert_allclose(turned, x[:, :, ::-1, ::-1], atol=1e-5)


@pytest.mark.parametrize("argv,match", [
    (["noniid", "-", "dir", "--skew-strength", "3"], "needs --feature-skew"),
    (["noniid", "-", "dir", "--few-shot", "0"], "--few-shot"),
    (["noniid", "-", "dir", "--feature-skew", "jitter", "--skew-strength", "1.5"], "< 1"),
    (["noniid", "-", "dir", "--alpha", "nan"], "--alpha"),
])
def test_bad_options_are_one_line_errors(tmp_path, capsys, argv, match):
    assert digits(tmp_path / "Digits", *argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and match in err


def test_feature_skew_refuses_non_image_data(tmp_path, capsys):
    data = sources.RawDataset(np.zeros((40, 5), np.float32), np.arange(40) % 2, 2, ["a", "b"],
                              pixel_max=None)
    argv = ["iid", "balance", "-", "--num-clients", "2", "--feature-skew", "noise",
            "--out-dir", str(tmp_path / "T")]
    assert dataset_utils.main(argv, "T", lambda raw, dl: data, tmp_path, num_classes=2) == 2
    assert "needs an image dataset" in capsys.readouterr().err
