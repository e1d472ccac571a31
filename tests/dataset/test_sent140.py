"""Sent140 from Sentiment140's own files, made small by the test: ``trainingandtestdata.zip`` holding
``training.1600000.processed.noemoticon.csv`` with its six quoted columns
(polarity,id,date,query,user,text), latin-1, rows ordered by polarity as in the real file."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from conftest import REPO
from datagen_helpers import LocalServer, read_config, trains_one_round

from datagen import sent140
from datagen.layout import open_packed
from datagen.streamed import split_units

#: user -> tweets (polarity, text); LEAF keeps users with more than -k tweets
TWEETS = {
    "alice": [(0, "rainy day again"), (4, "love this café"), (4, "great game tonight"), (0, "so tired"),
              (4, "happy happy day")],
    "dave": [(0, "missed the bus"), (0, "work is hard"), (4, "pizza night"), (4, "new phone yay")],
    "_zed": [(4, "sunny day"), (0, "lost my keys"), (0, "sad news")],
    "bob": [(0, "bad day"), (4, "good coffee"), (0, "exam tomorrow")],
    "carol": [(4, "hello world"), (0, "bye")],
}


def csv_bytes(tweets=TWEETS) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\r\n")
    rows = [(p, user, t) for user, items in tweets.items() for p, t in items]
    for n, (p, user, t) in enumerate(sorted(rows, key=lambda r: r[0])):  # negatives first, as the file
        writer.writerow([p, 1467810369 + n, "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", user, t])
    return out.getvalue().encode("latin-1")


def make_zip(folder, data=None):
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / sent140.ARCHIVE, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(sent140.TRAINING_CSV, csv_bytes() if data is None else data)
        zf.writestr("testdata.manual.2009.06.14.csv", b'"2","3","Mon May 11","kindle2","u","neutral"\r\n')
    return folder


def run_script(*args, env=None):
    return subprocess.run([sys.executable, "generate_Sent140.py", *args], cwd=REPO / "dataset",
                          env=env, capture_output=True, text=True, timeout=120)


def decoded(tokenizer, row):
    return [tokenizer["model"]["vocab_inverse"][i] for i in row if i != 0]


def test_generator_keeps_leafs_users_and_labels_tokenised_on_training_tweets(tmp_path):
    raw = make_zip(tmp_path / "raw")
    out = tmp_path / "Sent140"
    proc = run_script("--raw-dir", str(raw), "--min-samples", "2", "--max-len", "6", "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    config = read_config(out)
    # more than 2 tweets: carol (2) is dropped; largest first, ties by name ('_zed' < 'bob')
    assert config["client_names"] == ["alice", "dave", "_zed", "bob"]
    assert config["format"] == "packed-npy-v1" and config["num_classes"] == 2 and config["input_shape"] == [6]
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    tokenizer["model"]["vocab_inverse"] = {i: w for w, i in vocab.items()}
    packed = open_packed(out)
    training_words = set()
    for c, user in enumerate(config["client_names"]):
        tweets = TWEETS[user]
        # the CSV lists negatives first: a user's tweets in file order
        in_file = [t for t in tweets if t[0] == 0] + [t for t in tweets if t[0] == 4]
        train, test, _ = split_units(len(in_file), c, {"seed": 1, "train_ratio": 0.75})
        assert len(train) == int(0.75 * len(in_file))
        for split, chosen in (("train", train), ("test", test)):
            x, y, offsets = packed[split]
            mine = slice(offsets[c], offsets[c + 1])
            assert y[mine].tolist() == [in_file[i][0] // 4 for i in chosen]
            for row, i in zip(x[mine], chosen):
                words = in_file[i][1].replace("é", "e").split()
                expected = [w if w in vocab else "<unk>" for w in words]
                assert decoded(tokenizer, row) == expected
                if split == "train":
                    training_words |= set(words)
    # the vocabulary holds the training tweets' words only
    assert set(vocab) - {"<pad>", "<unk>"} == training_words
    assert config["vocab_size"] == len(vocab) and config["min_samples"] == 2


def test_download_from_local_mirror_and_rerun(tmp_path):
    www = make_zip(tmp_path / "www")
    out = tmp_path / "Sent140"
    with LocalServer(www) as server:
        env = dict(os.environ, FL_DATASET_MIRROR=server.url)
        proc = run_script("--min-samples", "3", "--num-clients", "1", "--out-dir", str(out), env=env)
        assert proc.returncode == 0, proc.stderr
        assert server.requests == ["/trainingandtestdata.zip"]
    assert (out / "rawdata" / sent140.ARCHIVE).read_bytes() == (www / sent140.ARCHIVE).read_bytes()
    config = read_config(out)
    assert config["client_names"] == ["alice"] and config["train_rows"] + config["test_rows"] == 5
    again = run_script("--min-samples", "3", "--num-clients", "1", "--out-dir", str(out))
    assert again.returncode == 0 and "already generated" in again.stdout


def test_the_extracted_csv_is_read_too(tmp_path):
    (tmp_path / sent140.TRAINING_CSV).write_bytes(csv_bytes())
    names = [user for _, user, _, _ in sent140.rows(tmp_path / sent140.TRAINING_CSV)]
    assert len(names) == 17 and names[0] == "alice"
    texts = [t for _, _, _, t in sent140.rows(tmp_path / sent140.TRAINING_CSV)]
    assert "love this café" in texts  # latin-1 byte 0xE9


@pytest.mark.parametrize("damage,needle", [
    ("truncated", "corrupt or truncated"),
    ("neutral", "row 1 is not"),
    ("columns", "row 1 is not"),
    ("nobody", "no user has more than --min-samples"),
])
def test_bad_raw_files_are_refused_in_one_line(tmp_path, damage, needle):
    raw = tmp_path / "raw"
    if damage == "truncated":
        make_zip(raw)
        archive = raw / sent140.ARCHIVE
        archive.write_bytes(archive.read_bytes()[:300])
    elif damage == "neutral":
        make_zip(raw, b'"2","1","d","NO_QUERY","u","meh"\r\n' + csv_bytes())
    elif damage == "columns":
        make_zip(raw, b'"0","1","u","hi"\r\n')
    else:
        make_zip(raw)
    out = tmp_path / "o"
    proc = run_script("--raw-dir", str(raw), "--min-samples", "2" if damage != "nobody" else "9",
                      "--out-dir", str(out))
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert needle in proc.stderr and not out.exists()


def test_options_are_checked(tmp_path):
    raw = make_zip(tmp_path / "raw")
    proc = run_script("--raw-dir", str(raw), "--test-split", "global", "--out-dir", str(tmp_path / "o"))
    assert proc.returncode == 2 and "needs an official test split" in proc.stderr
    proc = run_script("--raw-dir", str(raw), "--min-samples", "-1", "--out-dir", str(tmp_path / "o"))
    assert proc.returncode == 2 and "--min-samples must be at least 0" in proc.stderr


def test_generated_dataset_trains_one_round_of_main(tmp_path):
    raw = make_zip(tmp_path / "raw")
    out = tmp_path / "Sent140"
    proc = run_script("--raw-dir", str(raw), "--min-samples", "2", "--max-len", "6", "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    trains_one_round(out, tmp_path / "res", "-nc", "4", "-lbs", "2")


def test_the_sample_cap_and_few_shot_apply_to_training_tweets_only(tmp_path):
    raw = make_zip(tmp_path / "raw")
    full, capped = tmp_path / "full", tmp_path / "capped"
    for out, extra in ((full, []), (capped, ["--samples-per-client", "2", "--few-shot", "1"])):
        proc = run_script("--raw-dir", str(raw), "--min-samples", "2", "--out-dir", str(out), *extra)
        assert proc.returncode == 0, proc.stderr
    whole, cut = open_packed(full), open_packed(capped)
    train_sizes = np.diff(cut["train"][2])
    # one tweet of each label a client trains on (few-shot 1), at most 2 (the cap)
    distinct = [len(set(whole["train"][1][whole["train"][2][c]:whole["train"][2][c + 1]].tolist())) for c in range(4)]
    assert train_sizes.tolist() == [min(2, d) for d in distinct] and 1 in distinct
    for c in range(4):  # at most one tweet of each label, drawn from the client's own training tweets
        labels = cut["train"][1][cut["train"][2][c]:cut["train"][2][c + 1]]
        assert len(set(labels.tolist())) == len(labels)
        rows = {tuple(r) for r in whole["train"][0][whole["train"][2][c]:whole["train"][2][c + 1]]}
        assert {tuple(r) for r in cut["train"][0][cut["train"][2][c]:cut["train"][2][c + 1]]} <= rows
    assert np.array_equal(whole["test"][1], cut["test"][1])  # test parts whole
