"""HAR (subjects), FEMNIST and Shakespeare (LEAF JSON) and the news text generators,
on small files in their real raw formats; downloads only from 127.0.0.1."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO
from datagen_helpers import (LocalServer, all_labels, load_client, make_ag_news_csv,
                             make_femnist_users, make_har_zip, md5, read_config,
                             tar_folder, write_leaf_json)

from datagen import download, har, leaf, text
from datagen.errors import ReadError


def run_script(script, *args, env=None):
    return subprocess.run([sys.executable, script, *args], cwd=REPO / "dataset", env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("wrap", [False, True])
def test_har_read_from_uci_zip(tmp_path, wrap):
    x, y, subjects = make_har_zip(tmp_path / "UCI HAR Dataset.zip", wrap=wrap)
    data = har.read_har(tmp_path)
    np.testing.assert_allclose(data.x, x, rtol=1e-6)
    np.testing.assert_array_equal(data.y, y)
    np.testing.assert_array_equal(data.groups, subjects - 1)
    assert data.x.shape[1:] == (9, 1, 128) and data.num_train == 24 and not data.is_image


def test_har_truncated_signal_is_one_line_error(tmp_path):
    import zipfile
    make_har_zip(tmp_path / "h.zip")
    with zipfile.ZipFile(tmp_path / "h.zip") as src, \
            zipfile.ZipFile(tmp_path / "bad.zip", "w") as dst:
        for item in src.namelist():
            data = src.read(item)
            if item.endswith("body_gyro_y_test.txt"):
                data = data[: data.index(b"\n", len(data) // 2) + 1]  # whole rows missing
            dst.writestr(item, data)
    with pytest.raises(ReadError, match="truncated or corrupt"):
        har.read_har(tmp_path / "bad.zip")


def test_har_generator_one_client_per_subject_downloaded_from_local_mirror(tmp_path):
    www = tmp_path / "www"
    x, y, subjects = make_har_zip(www / "UCI HAR Dataset.zip")
    out = tmp_path / "HAR"
    with LocalServer(www) as server:
        proc = run_script("generate_HAR.py", "--out-dir", str(out),
                          env=dict(os.environ, FL_DATASET_MIRROR=server.url))
        assert proc.returncode == 0, proc.stderr
        assert server.requests == ["/UCI%20HAR%20Dataset.zip"]
    config = read_config(out)
    assert config["num_clients"] == 6 and config["partition"] == "natural"
    assert config["input_shape"] == [9, 1, 128] and config["num_classes"] == 6
    # Largest subjects first; each client holds exactly one subject's windows.
    sizes = np.bincount(subjects)[1:]
    assert sorted(np.add(config["train_samples"], config["test_samples"]).tolist(),
                  reverse=True) == sorted(sizes.tolist(), reverse=True)
    names = config["client_names"]
    for c, name in enumerate(names):
        s = int(name.split()[-1])
        x_tr, y_tr = load_client(out, "train", c)
        x_te, y_te = load_client(out, "test", c)
        mine = np.flatnonzero(subjects == s)
        got = np.concatenate([x_tr, x_te])
        assert len(got) == len(mine)
        assert {row.tobytes() for row in got} == {row.tobytes() for row in x[mine]}
    assert "Partition summary: 6 clients" in proc.stdout


def test_har_rejects_feature_skew_and_needs_clients_for_other_partitions(tmp_path):
    make_har_zip(tmp_path / "UCI HAR Dataset.zip")
    proc = run_script("generate_HAR.py", "--raw-dir", str(tmp_path), "--feature-skew", "noise",
                      "--out-dir", str(tmp_path / "o"))
    assert proc.returncode == 2 and "needs an image dataset" in proc.stderr
    proc = run_script("generate_HAR.py", "noniid", "-", "dir", "--raw-dir", str(tmp_path),
                      "--out-dir", str(tmp_path / "o"))
    assert proc.returncode == 2 and "--num-clients is needed" in proc.stderr


def test_femnist_generator_keeps_the_largest_writers(tmp_path):
    users = make_femnist_users(6)
    write_leaf_json(tmp_path / "leaf", users)
    data = leaf.read_femnist(tmp_path / "leaf")
    assert data.x.shape == (sum(4 + u for u in range(6)), 1, 28, 28) and data.x.dtype == np.uint8
    out = tmp_path / "FEMNIST"
    proc = run_script("generate_FEMNIST.py", "--raw-dir", str(tmp_path / "leaf"),
                      "--num-clients", "3", "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    config = read_config(out)
    assert config["num_clients"] == 3 and config["num_classes"] == 62
    assert config["client_names"] == ["f0005_5", "f0004_4", "f0003_3"]
    for c, name in enumerate(config["client_names"]):
        x_tr, y_tr = load_client(out, "train", c)
        x_te, y_te = load_client(out, "test", c)
        np.testing.assert_array_equal(np.sort(np.concatenate([y_tr, y_te])),
                                      np.sort(users[name][1]))
        pixels = np.rint((np.concatenate([x_tr, x_te]) + 1) / 2 * 255).reshape(len(users[name][1]), -1)
        expected = np.rint(np.array(users[name][0]) * 255)
        assert {r.tobytes() for r in pixels.astype(np.uint8)} == \
            {r.tobytes() for r in expected.astype(np.uint8)}


def test_femnist_without_raw_dir_explains_leaf(tmp_path):
    proc = run_script("generate_FEMNIST.py", "--out-dir", str(tmp_path / "F"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--raw-dir" in proc.stderr and "LEAF" in proc.stderr


def test_leaf_bad_json_is_one_line_error(tmp_path):
    (tmp_path / "all_data").mkdir()
    (tmp_path / "all_data" / "a.json").write_text('{"users": ["u"], "user_data": {}}')
    with pytest.raises(ReadError, match="no x/y data"):
        leaf.read_femnist(tmp_path)


def test_shakespeare_generator_encodes_leaf_characters(tmp_path):
    lines = "To be, or not to be, that is the question: Whether 'tis nobler in the mind"
    users = {}
    for u, role in enumerate(["HAMLET", "OPHELIA", "KING"]):
        xs = [(lines * 3)[i:i + 80] for i in range(5 + u)]
        ys = [(lines * 3)[i + 80] for i in range(5 + u)]
        users[f"THE_TRAGEDY_OF_HAMLET_{role}"] = (xs, ys)
    users["THE_TRAGEDY_OF_HAMLET_KING"][0][0] = "é" + users["THE_TRAGEDY_OF_HAMLET_KING"][0][0][1:]
    write_leaf_json(tmp_path / "leaf", users)
    out = tmp_path / "Shakespeare"
    proc = run_script("generate_Shakespeare.py", "--raw-dir", str(tmp_path / "leaf"),
                      "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    config = read_config(out)
    assert config["num_clients"] == 3 and config["num_classes"] == 80
    assert config["input_shape"] == [80] and config["unknown_characters"] == 1
    # Input ids are 1 + the letter's index (0 = padding), labels the index itself (80 classes).
    assert config["vocab_size"] == 81 and config["pad_id"] == 0 and config["input_id_offset"] == 1
    role = config["client_names"][0]
    x, y = load_client(out, "train", 0)
    assert x.dtype == np.int64 and 1 <= x.min() and x.max() <= 80 and 0 <= y.min() and y.max() < 80
    decoded = {"".join(leaf.SHAKESPEARE_LETTERS[i - 1] for i in row) for row in x}
    wanted = {s.replace("é", " ") for s in users[role][0]}
    assert decoded and decoded <= wanted
    labels = {leaf.SHAKESPEARE_LETTERS[i] for i in y}
    assert labels <= set(users[role][1])


def test_shakespeare_newline_is_an_input_id_not_padding(tmp_path):
    """LEAF's letter 0 is the newline: as input id 1 the models no longer skip it as padding."""
    text = "ab\nc" * 40
    write_leaf_json(tmp_path, {"ROLE": ([text[i:i + 80] for i in range(4)], [text[80 + i] for i in range(4)])})
    data = leaf.read_shakespeare(tmp_path)
    newline = leaf.SHAKESPEARE_LETTERS.index("\n")
    assert newline == 0 and data.extra_config["vocab_size"] == 81
    order = [1, 3, 0, 2]  # files in name order: test/ (samples 1 and 3), then train/ (0 and 2)
    expected = [[leaf.SHAKESPEARE_LETTERS.index(c) + 1 for c in text[i:i + 80]] for i in order]
    assert data.x.tolist() == expected and (data.x != 0).all()
    assert (data.x[0] == newline + 1).sum() == 20
    assert data.y.tolist() == [leaf.SHAKESPEARE_LETTERS.index(text[80 + i]) for i in order]
    assert data.num_classes == 80


def test_news_csv_parsing_and_tokenisation_on_the_training_split_only(tmp_path):
    pytest.importorskip("tokenizers")
    make_ag_news_csv(tmp_path)
    (tmp_path / "test.csv").write_text(
        (tmp_path / "test.csv").read_text() + '"1","Zebra","quagga unseenword"\n')
    loader = text.news_loader("AGNews", text.AG_NEWS_CLASSES, "ag_news_csv.tar.gz", None, (),
                              "word", 100, 12)
    data = loader(tmp_path, tmp_path / "unused")
    assert data.x.shape == (53, 12) and data.x.dtype == np.int64 and data.num_train == 40
    tok = json.loads(data.extra_files["tokenizer.json"])
    vocab = tok["model"]["vocab"]
    assert vocab["<pad>"] == 0 and vocab["<unk>"] == 1
    assert "quagga" not in vocab and "goal" in vocab  # vocabulary from training text only
    assert "zebra" not in vocab and data.x[-1].tolist()[:4] == [1, 1, 1, 0]  # <unk> x3, <pad>
    assert np.bincount(data.y).tolist() == [14, 13, 13, 13]
    first = [vocab[w] for w in ("headline", "0", "the", "election", "minister", "war", "story")]
    assert data.x[0, :7].tolist() == first
    assert data.x[0, -1] == 0  # padded


def test_news_csv_bad_class_is_one_line_error(tmp_path):
    make_ag_news_csv(tmp_path)
    (tmp_path / "train.csv").write_text('"9","x","y"\n')
    (train_bytes, train_name), _ = text.read_csv_pair(tmp_path, "x.tar.gz")
    with pytest.raises(ReadError, match="outside 1..4"):
        text.parse_csv(train_bytes, train_name, 4)


def test_agnews_generator_downloads_csv_from_local_mirror(tmp_path):
    pytest.importorskip("tokenizers")
    www = tmp_path / "www"
    make_ag_news_csv(www)
    out = tmp_path / "AGNews"
    with LocalServer(www) as server:
        env = dict(os.environ, FL_DATASET_MIRROR=server.url)
        proc = run_script("generate_AGNews.py", "noniid", "-", "dir", "--num-clients", "3",
                          "--alpha", "1", "--max-len", "16", "--out-dir", str(out), env=env)
        # The published MD5s of the real files do not match the test CSVs: refused, one line.
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "MD5" in proc.stderr
        assert server.requests[0] == "/train.csv"
    proc = run_script("generate_AGNews.py", "noniid", "-", "dir", "--num-clients", "3",
                      "--alpha", "1", "--max-len", "16", "--raw-dir", str(www),
                      "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    config = read_config(out)
    assert config["input_shape"] == [16] and config["num_classes"] == 4
    assert config["max_len"] == 16 and config["vocab_size"] > 10 and config["tokenizer"] == "word"
    assert json.loads((out / "tokenizer.json").read_text())["model"]["type"] == "WordLevel"
    assert len(all_labels(out)) == 52
    assert load_client(out, "train", 0)[0].dtype == np.int64


def test_agnews_download_checks_published_md5_then_succeeds(tmp_path, monkeypatch):
    pytest.importorskip("tokenizers")
    www = tmp_path / "www"
    make_ag_news_csv(www)
    files = tuple(download.RemoteFile(n, md5(www / n)) for n in ("train.csv", "test.csv"))
    with LocalServer(www) as server:
        monkeypatch.setenv(download.MIRROR_ENV, server.url)
        loader = text.news_loader("AGNews", text.AG_NEWS_CLASSES, "ag_news_csv.tar.gz", files,
                                  text.AG_NEWS_MIRRORS, "bpe", 60, 8)
        data = loader(None, tmp_path / "dl")
    assert sorted(server.requests) == ["/test.csv", "/train.csv"]
    assert data.x.shape == (52, 8) and data.extra_config["tokenizer"] == "bpe"


def test_sogou_news_from_tarball_and_no_download(tmp_path):
    pytest.importorskip("tokenizers")
    make_ag_news_csv(tmp_path / "sogou_news_csv", num_classes=5)
    tar_folder(tmp_path / "sogou_news_csv", tmp_path / "raw" / "sogou_news_csv.tar.gz",
               "sogou_news_csv")
    out = tmp_path / "SogouNews"
    proc = run_script("generate_SogouNews.py", "iid", "balance", "-", "--num-clients", "2",
                      "--raw-dir", str(tmp_path / "raw"), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    assert read_config(out)["num_classes"] == 5
    missing = run_script("generate_SogouNews.py", "--out-dir", str(tmp_path / "S2"))
    assert missing.returncode == 2 and "--raw-dir" in missing.stderr
    assert missing.stderr.count("\n") == 1


def pamap2_rows(activities, seed=0):
    """Rows of a subject file: 54 columns, a NaN in heart rate as in the real files."""
    rng = np.random.default_rng(seed)
    table = rng.integers(-500, 500, (len(activities), 54)) / 64
    table[:, 0] = np.arange(len(activities)) / 100
    table[:, 1] = activities
    table[::3, 2] = np.nan  # heart rate is sampled at 9 Hz: NaN elsewhere, not a channel
    return table


def write_dat(table):
    return "\n".join(" ".join("NaN" if np.isnan(v) else f"{v:.6f}" for v in row)
                     for row in table).encode() + b"\n"


def test_pamap2_windows_subjects_and_activities(tmp_path):
    from datagen_helpers import write_zip
    from datagen import pamap2
    a = pamap2_rows([1] * 20 + [0] * 5 + [4] * 17)
    a[30, pamap2.CHANNELS[4]] = np.nan  # a dropped gyro packet spoils the windows holding it
    b = pamap2_rows([24] * 16, seed=1)
    opt = pamap2_rows([16] * 8, seed=2)
    archive = write_zip(tmp_path / "PAMAP2_Dataset.zip", {
        "PAMAP2_Dataset/Protocol/subject101.dat": write_dat(a),
        "PAMAP2_Dataset/Protocol/subject105.dat": write_dat(b),
        "PAMAP2_Dataset/Optional/subject101.dat": write_dat(opt)})
    data = pamap2.read_pamap2(archive, window=8, step=4)
    codes = sorted(pamap2.ACTIVITIES)
    # subject 101: activity 1 rows 0-19 -> windows at 0,4,8,12; activity 4 rows 25-41 ->
    # windows at 28 and 32 hold the NaN at row 30, so only 36 is kept (and 24 mixes 0 and 4).
    assert data.y.tolist() == [codes.index(1)] * 4 + [codes.index(4)] + [codes.index(24)] * 3
    np.testing.assert_array_equal(data.groups, [0] * 5 + [1] * 3)
    assert data.group_names == ["subject 101", "subject 105"]
    assert data.x.shape == (8, 27, 1, 8)
    np.testing.assert_allclose(data.x[0, :, 0, :], a[0:8, pamap2.CHANNELS].T.astype(np.float32))
    with_optional = pamap2.read_pamap2(archive, window=8, step=4, optional=True)
    # Files are read in name order: Optional/subject101.dat comes first, same subject.
    assert len(with_optional.y) == 8 + 1 and with_optional.y[0] == codes.index(16)
    assert with_optional.groups[0] == 0 and with_optional.group_names == data.group_names
    bad = write_zip(tmp_path / "bad.zip", {"PAMAP2_Dataset/Protocol/subject101.dat": b"1 2 3\n"})
    with pytest.raises(ReadError, match="3 columns per row"):
        pamap2.read_pamap2(bad)


def test_pamap2_generator_script(tmp_path):
    from datagen_helpers import write_tree
    write_tree(tmp_path / "raw", {
        f"PAMAP2_Dataset/Protocol/subject10{s}.dat": write_dat(pamap2_rows([1, 2, 3][s % 3:][:1] * 40, s))
        for s in range(1, 4)})
    out = tmp_path / "PAMAP2"
    proc = run_script("generate_PAMAP2.py", "--raw-dir", str(tmp_path / "raw"), "--window", "10",
                      "--step", "10", "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    config = read_config(out)
    assert config["num_clients"] == 3 and config["input_shape"] == [27, 1, 10]
    assert config["num_classes"] == 12 and config["window"] == 10
    assert sum(config["train_samples"]) + sum(config["test_samples"]) == 12
