"""StackOverflow from TFF's files, made small by the test in their real formats: an SQLite database
of TFF's ``SqlClientData`` schema whose rows are serialized ``tf.train.Example`` protos (encoded
here by hand from the proto definitions), the word-count file and the tag-count file (a JSON
object) in their ``.tar.bz2``."""

from __future__ import annotations

import datetime
import io
import json
import lzma
import os
import sqlite3
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from conftest import REPO
from datagen_helpers import LocalServer, load_client, read_config, trains_one_round

from datagen import download, stackoverflow
from datagen.errors import ReadError
from datagen.layout import open_packed
from datagen.streamed import split_units

WORDS = ["the", "is", "a", ".", "code", "it", "to"]


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def example(**features) -> bytes:
    """A serialized tf.train.Example: str values as bytes_list, ints as a packed int64_list."""
    entries = b""
    for key, value in features.items():
        if isinstance(value, int):
            feature = field(3, field(1, b"".join(varint(value) for value in [value])))
        else:
            feature = field(1, field(1, value.encode()))
        entries += field(1, field(1, key.encode()) + field(2, feature))
    return field(1, entries)


#: a creation_date in TFF's format
POSTED = datetime.datetime(2010, 1, 8, 9, 34, 5).strftime("%Y-%m-%d %H:%M:%S UTC")


def so_example(tokens: str, title: str = "a title", tags: str = "python|sql") -> bytes:
    return example(creation_date=POSTED, score=-3, tags=tags, title=title, tokens=tokens, type="answer")


#: user -> split -> sentences (users sort as TFF sorts its ids: '10' < '7' < '8')
USERS = {
    "7": {"train": ["the code is .", "it is", "to the code"], "test": ["the end ."]},
    "8": {"train": ["a b c d e f g h i j k l", "code"], "test": []},
    "10": {"train": ["it", "a", "to", "is"], "test": ["code code", "the"]},
}


def make_database(path, users=USERS, counts=True, indexes=True):
    """TFF's tables and indexes (as google/fedjax's sqlite_federated_data.py gives them)."""
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
                    "serialized_example_proto BLOB NOT NULL)")
        if indexes:
            con.execute("CREATE INDEX idx_examples_client_id ON examples (client_id)")
            con.execute("CREATE INDEX idx_examples_client_id_split ON examples (split_name, client_id)")
        con.execute("CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL"
                    + (", num_examples INTEGER NOT NULL)" if counts else ")"))
        for user, splits in users.items():
            for split, sentences in splits.items():
                for s in sentences:  # a sentence, or (tokens, title, tags)
                    blob = so_example(*s) if isinstance(s, tuple) else so_example(s)
                    con.execute("INSERT INTO examples VALUES (?, ?, ?)", (split, user, blob))
                if sentences:
                    con.execute("INSERT INTO client_metadata VALUES (?, ?" + (", ?)" if counts else ")"),
                                (user, split, len(sentences)) if counts else (user, split))
    con.close()
    return path


def make_word_counts(folder, words=WORDS):
    text = "".join(f"{w} {100 - i}\n" for i, w in enumerate(words)).encode()
    info = tarfile.TarInfo(stackoverflow.WORD_COUNT)
    info.size = len(text)
    with tarfile.open(folder / (stackoverflow.WORD_COUNT + ".tar.bz2"), "w:bz2") as tar:
        tar.addfile(info, io.BytesIO(text))


#: tag -> count as in TFF's stackoverflow.tag_count, in no particular order: sorted by count (ties
#: in this order) python, java, sql, css
TAG_COUNTS = {"sql": 5, "python": 9, "css": 5, "java": 7}


def make_tag_counts(folder, counts=TAG_COUNTS):
    text = json.dumps(counts).encode()
    info = tarfile.TarInfo(stackoverflow.TAG_COUNT)
    info.size = len(text)
    with tarfile.open(folder / (stackoverflow.TAG_COUNT + ".tar.bz2"), "w:bz2") as tar:
        tar.addfile(info, io.BytesIO(text))


def make_raw(folder, compress=True, users=USERS):
    folder.mkdir(parents=True, exist_ok=True)
    database = make_database(folder / "db.sqlite", users)
    if compress:
        (folder / (stackoverflow.DATABASE + ".lzma")).write_bytes(lzma.compress(database.read_bytes(),
                                                                             format=lzma.FORMAT_ALONE))
        database.unlink()
    else:
        database.rename(folder / stackoverflow.DATABASE)
    make_word_counts(folder)
    make_tag_counts(folder)
    return folder


def run_script(*args, env=None):
    return subprocess.run([sys.executable, "generate_StackOverflow.py", *args], cwd=REPO / "dataset",
                          env=env, capture_output=True, text=True, timeout=120)


def by_hand(sentence, vocab=WORDS, max_len=5):
    """TFF's to_ids and split_input_target, written out: (inputs, targets) of one sentence."""
    ids = {w: i + 1 for i, w in enumerate(vocab)}
    oov, bos, eos = len(vocab) + 1, len(vocab) + 2, len(vocab) + 3
    words = sentence.split(" ")[:max_len]
    seq = [bos] + [ids.get(w, oov) for w in words] + ([eos] if len(words) < max_len else [])
    rows = [seq[:t + 1] + [0] * (max_len - t - 1) for t in range(len(seq) - 1)]
    return rows, seq[1:]


def test_example_protos_decode_as_tensorflow_writes_them():
    blob = so_example("if you're using sql , median")
    parsed = stackoverflow.parse_example(blob)
    assert parsed["tokens"] == [b"if you're using sql , median"] and parsed["score"] == [-3]
    assert parsed["tags"] == [b"python|sql"] and set(parsed) == {"creation_date", "score", "tags", "title",
                                                                 "tokens", "type"}


def test_samples_are_tffs_next_word_targets():
    vocab = stackoverflow.Vocabulary(WORDS, 5)
    x, y = vocab.samples(["the code is .", "a b c d e f g"])
    rows, targets = by_hand("the code is .")
    more_rows, more_targets = by_hand("a b c d e f g")
    assert x.tolist() == rows + more_rows and y.tolist() == targets + more_targets
    # 4 words: bos + 4 ids + eos -> 5 targets; 7 words cut to 5, no eos -> 5 targets
    assert len(targets) == 5 and targets[-1] == vocab.eos and more_targets[-1] == vocab.oov
    assert vocab.num_ids == len(WORDS) + 4 and vocab.class_names()[vocab.bos] == "<bos>"


@pytest.mark.parametrize("compress", [True, False])
def test_generator_reads_raw_dir_and_writes_users_in_the_packed_layout(tmp_path, compress):
    raw = make_raw(tmp_path / "raw", compress)
    out = tmp_path / "StackOverflow"
    proc = run_script("--raw-dir", str(raw), "--vocab-size", "7", "--max-len", "5",
                      "--test-split", "global", "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    config = read_config(out)
    # largest first (4, 3, 2 training sentences)
    assert config["client_names"] == ["10", "7", "8"] and config["format"] == "packed-npy-v1"
    assert config["num_classes"] == config["vocab_size"] == 11 and config["input_shape"] == [5]
    assert (config["oov_id"], config["bos_id"], config["eos_id"]) == (8, 9, 10)
    packed = open_packed(out)
    for split in ("train", "test"):
        x, y, offsets = packed[split]
        for c, user in enumerate(config["client_names"]):
            rows, targets = [], []
            for sentence in USERS[user][split]:
                r, t = by_hand(sentence)
                rows, targets = rows + r, targets + t
            got = slice(offsets[c], offsets[c + 1])
            assert x[got].tolist() == rows and y[got].tolist() == targets, (split, user)
    assert "1 of 3 users have no samples in the official test split ('8')" in proc.stderr
    assert (tmp_path / "StackOverflow" / "rawdata" / stackoverflow.DATABASE).is_file() == compress


def test_client_split_keeps_sentences_whole_and_num_clients_the_largest(tmp_path):
    raw = make_raw(tmp_path / "raw", compress=False)
    out = tmp_path / "so"
    proc = run_script("--raw-dir", str(raw), "--vocab-size", "7", "--max-len", "5", "--num-clients", "2",
                      "--train-ratio", "0.5", "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    config = read_config(out)
    assert config["client_names"] == ["10", "7"] and config["num_clients"] == 2
    packed = open_packed(out)
    for c, user in enumerate(config["client_names"]):
        sentences = USERS[user]["train"]
        # each user's sentences are split whole, by the stream of (seed, client) alone
        train, test, _ = split_units(len(sentences), c, {"seed": 1, "train_ratio": 0.5})
        assert len(train) == len(sentences) // 2
        for split, chosen in (("train", train), ("test", test)):
            x, y, offsets = packed[split]
            rows = [r for i in chosen for r in by_hand(sentences[i])[0]]
            targets = [t for i in chosen for t in by_hand(sentences[i])[1]]
            assert x[offsets[c]:offsets[c + 1]].tolist() == rows and y[offsets[c]:offsets[c + 1]].tolist() == targets
    rerun = run_script("--raw-dir", str(raw), "--vocab-size", "7", "--max-len", "5", "--num-clients", "2",
                       "--train-ratio", "0.5", "--out-dir", str(out))
    assert rerun.returncode == 0 and "already generated" in rerun.stdout


def test_download_from_local_mirror_checks_the_published_sha256(tmp_path, monkeypatch):
    www = make_raw(tmp_path / "www")
    out = tmp_path / "so"
    with LocalServer(www) as server:
        env = dict(os.environ, **{download.MIRROR_ENV: server.url})
        proc = run_script("--vocab-size", "7", "--max-len", "5", "--out-dir", str(out), env=env)
        # the test's word counts are not TFF's file: refused by its published SHA-256, one line
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "SHA-256" in proc.stderr
        assert server.requests[:2] == ["/stackoverflow.sqlite.lzma", "/stackoverflow.word_count.tar.bz2"]
        digest = download.file_digests(www / (stackoverflow.WORD_COUNT + ".tar.bz2"))["sha256"]
        monkeypatch.setattr(stackoverflow, "FILES", (stackoverflow.FILES[0],
                                                     download.RemoteFile(stackoverflow.FILES[1].name, None,
                                                                         sha256=digest)))
        monkeypatch.setenv(download.MIRROR_ENV, server.url)
        database, words = stackoverflow.locate(None, tmp_path / "dl")
    assert database == tmp_path / "dl" / stackoverflow.DATABASE and words.name.endswith(".tar.bz2")
    assert stackoverflow.read_word_counts(words, 3) == WORDS[:3]
    assert sorted(stackoverflow.Database(database).counts("train").items()) == [("10", 4), ("7", 3), ("8", 2)]


@pytest.mark.parametrize("damage", ["truncated_sqlite", "truncated_lzma", "not_sqlite", "bad_words",
                                    "bad_proto"])
def test_corrupt_raw_files_are_refused_in_one_line(tmp_path, damage):
    raw = make_raw(tmp_path / "raw", compress=damage == "truncated_lzma")
    database = raw / stackoverflow.DATABASE
    if damage == "truncated_sqlite":
        database.write_bytes(database.read_bytes()[:-1024])
    elif damage == "truncated_lzma":
        packed = raw / (stackoverflow.DATABASE + ".lzma")
        packed.write_bytes(packed.read_bytes()[:-200])
    elif damage == "not_sqlite":
        database.write_bytes(b"not a database" * 100)
    elif damage == "bad_words":
        archive = raw / (stackoverflow.WORD_COUNT + ".tar.bz2")
        archive.write_bytes(archive.read_bytes()[:40])
    else:
        with sqlite3.connect(database) as con:
            con.execute("UPDATE examples SET serialized_example_proto = ? WHERE client_id = '7'", (b"\x0a\xff",))
        con.close()
    out = tmp_path / "so"
    proc = run_script("--raw-dir", str(raw), "--vocab-size", "7", "--out-dir", str(out))
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and not (out / "config.json").exists()


def test_schema_and_options_are_checked(tmp_path):
    with sqlite3.connect(tmp_path / "other.sqlite") as con:
        con.execute("CREATE TABLE t (a)")
    con.close()
    with pytest.raises(ReadError, match="SqlClientData schema"):
        stackoverflow.Database(tmp_path / "other.sqlite")
    raw = make_raw(tmp_path / "raw", compress=False)
    proc = run_script("noniid", "-", "dir", "--num-clients", "2", "--raw-dir", str(raw), "--out-dir", str(tmp_path / "o"))
    assert proc.returncode == 2 and "only the natural partition" in proc.stderr
    proc = run_script("--vocab-size", "20", "--raw-dir", str(raw), "--out-dir", str(tmp_path / "o"))
    assert proc.returncode == 2 and "fewer than --vocab-size 20" in proc.stderr
    proc = run_script("--num-clients", "1", "--test-split", "global", "--raw-dir", str(raw),
                      "--vocab-size", "7", "--max-sentences", "1", "--out-dir", str(tmp_path / "o"))
    assert proc.returncode == 0 and read_config(tmp_path / "o")["train_rows"] == 2  # user 10's "it"
    (raw / stackoverflow.DATABASE).unlink()
    make_database(raw / stackoverflow.DATABASE, {u: {"train": s["train"]} for u, s in USERS.items()})
    proc = run_script("--test-split", "global", "--raw-dir", str(raw), "--vocab-size", "7",
                      "--out-dir", str(tmp_path / "o2"))
    assert proc.returncode == 2 and "official test split holds none of the 3 users" in proc.stderr


def test_counts_without_num_examples_are_counted_and_a_missing_index_is_named(tmp_path, capsys):
    db = stackoverflow.Database(make_database(tmp_path / "d.sqlite", counts=False, indexes=False))
    assert "no index on examples.client_id" in capsys.readouterr().err
    stackoverflow.Database(make_database(tmp_path / "i.sqlite"))
    assert capsys.readouterr().err == ""
    assert db.counts("test") == {"7": 1, "10": 2}
    assert db.sentences("10", "test", 1) == ["code code"]


def test_generated_dataset_trains_one_round_of_main(tmp_path):
    raw = make_raw(tmp_path / "raw", compress=False)
    out = tmp_path / "StackOverflow"
    proc = run_script("--raw-dir", str(raw), "--vocab-size", "7", "--max-len", "5", "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    trains_one_round(out, tmp_path / "res", "-nc", "3", "-lbs", "4")


def test_a_population_of_many_classes_keeps_the_label_counts_of_the_pictures_clients(tmp_path, monkeypatch, capsys):
    """Past FULL_COUNTS_LIMIT (clients x classes) the writer holds the first PICTURE_CLIENTS clients'
    counts and each client's size and class count, not a [clients, 10,004] matrix."""
    from datagen import dataset_utils
    from datagen.streamed import main_streamed

    raw = make_raw(tmp_path / "raw", compress=False)

    def run(out):
        return main_streamed(["--raw-dir", str(raw), "--vocab-size", "7", "--max-len", "5", "--out-dir", str(out)],
                             "StackOverflow", tmp_path, stackoverflow.open_stackoverflow,
                             raw_dir_help="", add_arguments=stackoverflow.add_arguments,
                             extra_options=stackoverflow.extra_options, official_test=True)
    assert run(tmp_path / "full") == 0
    full = capsys.readouterr().out.splitlines()
    monkeypatch.setattr(dataset_utils, "FULL_COUNTS_LIMIT", 1)
    monkeypatch.setattr(dataset_utils, "PICTURE_CLIENTS", 2)
    assert run(tmp_path / "head") == 0
    head = capsys.readouterr().out.splitlines()
    full = full[next(i for i, line in enumerate(full) if line.startswith("Partition summary")):]
    head = head[next(i for i, line in enumerate(head) if line.startswith("Partition summary")):]
    assert head[:3] == full[:3]  # sizes, classes per client: of all clients
    assert head[3].endswith("over the first 2 clients") and not full[3].endswith("clients")
    assert "3 clients" in full[0] and "11 classes" in full[0]
    assert open_packed(tmp_path / "head")["train"][1].tolist() == open_packed(tmp_path / "full")["train"][1].tolist()


def test_the_picture_of_many_classes_draws_bins_of_them(tmp_path, monkeypatch):
    """10,004 classes drawn one by one took 70 s and 480 MB for 20 clients: above PICTURE_CLASSES
    they are summed in bins, at most BAR_SEGMENTS a bar (PICTURE_CLASSES columns in a heatmap)."""
    import matplotlib.axes
    from datagen import picture

    calls = []
    real = matplotlib.axes.Axes.barh
    monkeypatch.setattr(matplotlib.axes.Axes, "barh", lambda self, *a, **k: calls.append(a[1]) or real(self, *a, **k))
    counts = np.arange(3 * 10004).reshape(3, 10004) % 7
    picture.save_partition_png(tmp_path / "p.png", counts, [str(k) for k in range(10004)], title="t")
    per = -(-10004 // picture.BAR_SEGMENTS)
    assert len(calls) == -(-10004 // per) <= picture.BAR_SEGMENTS
    assert np.sum(calls, axis=0).tolist() == counts.sum(axis=1).tolist()  # every sample drawn
    assert (tmp_path / "p.png").stat().st_size > 0


def tensorflow_example_class():
    """tf.train.Example built by the protobuf library from tensorflow/core/example/{feature,example}.proto
    (proto3: BytesList/FloatList/Int64List of repeated ``value`` = 1, packed numbers; Feature's oneof
    bytes_list = 1, float_list = 2, int64_list = 3; Features' map<string, Feature> feature = 1;
    Example's features = 1), so the reader is checked against the library's own encoding."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="fedcohort_test_example.proto", package="tensorflow",
                                               syntax="proto3")

    def message(name, *fields, nested=()):
        m = proto.message_type.add(name=name)
        m.nested_type.extend(nested)
        for number, field_name, kind, label, type_name in fields:
            m.field.add(name=field_name, number=number, type=kind, label=label, type_name=type_name)
        return m

    repeated, optional = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    message("BytesList", (1, "value", F.TYPE_BYTES, repeated, None))
    message("FloatList", (1, "value", F.TYPE_FLOAT, repeated, None))
    message("Int64List", (1, "value", F.TYPE_INT64, repeated, None))
    feature = message("Feature", (1, "bytes_list", F.TYPE_MESSAGE, optional, ".tensorflow.BytesList"),
                      (2, "float_list", F.TYPE_MESSAGE, optional, ".tensorflow.FloatList"),
                      (3, "int64_list", F.TYPE_MESSAGE, optional, ".tensorflow.Int64List"))
    feature.oneof_decl.add(name="kind")
    for f in feature.field:
        f.oneof_index = 0
    entry = descriptor_pb2.DescriptorProto(name="FeatureEntry", options=descriptor_pb2.MessageOptions(map_entry=True))
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=optional)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=optional, type_name=".tensorflow.Feature")
    message("Features", (1, "feature", F.TYPE_MESSAGE, repeated, ".tensorflow.Features.FeatureEntry"), nested=[entry])
    message("Example", (1, "features", F.TYPE_MESSAGE, optional, ".tensorflow.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def test_examples_serialized_by_the_protobuf_library_decode():
    pytest.importorskip("google.protobuf")
    Example = tensorflow_example_class()
    record = Example()
    features = record.features.feature
    features["tokens"].bytes_list.value.append(b"how do i sort a list ?")
    features["tags"].bytes_list.value.append(b"python|list")
    features["score"].int64_list.value.extend([-7, 2**40])
    features["ratio"].float_list.value.append(0.5)
    blob = record.SerializeToString()
    parsed = stackoverflow.parse_example(blob)
    assert parsed["tokens"] == [b"how do i sort a list ?"] and parsed["tags"] == [b"python|list"]
    assert parsed["score"] == [-7, 2**40]
    assert stackoverflow.sentence_of(blob, "x") == "how do i sort a list ?"
    # the test's own encoder writes what the library writes
    ours = Example.FromString(so_example("a b"))
    assert ours.features.feature["tokens"].bytes_list.value == [b"a b"]
    assert ours.features.feature["score"].int64_list.value == [-3]


def make_h5(folder, users=USERS):
    """Older TFF's stackoverflow_<split>.h5: examples/<user>/<feature>, one entry per sentence."""
    import h5py

    folder.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "stackoverflow_train.h5"), ("test", "stackoverflow_test.h5")):
        with h5py.File(folder / name, "w") as f:
            for user, splits in users.items():
                if not splits[split]:
                    continue
                group = f.create_group(f"examples/{user}")
                n = len(splits[split])
                group["tokens"] = np.array([s.encode() for s in splits[split]], dtype=object).astype(h5py.string_dtype("ascii"))
                group["tags"] = np.array([b"python|sql"] * n, dtype="S10")
                group["title"] = np.array([b"a title"] * n, dtype="S7")
                group["score"] = np.arange(n, dtype=np.int64)
    make_word_counts(folder)
    return folder


def test_older_tffs_h5_files_give_the_same_clients(tmp_path):
    sqlite_raw, h5_raw = make_raw(tmp_path / "sql", compress=False), make_h5(tmp_path / "h5")
    outs = []
    for raw in (sqlite_raw, h5_raw):
        out = tmp_path / f"out_{raw.name}"
        proc = run_script("--raw-dir", str(raw), "--vocab-size", "7", "--max-len", "5", "--test-split", "global",
                          "--max-sentences", "3", "--out-dir", str(out))
        assert proc.returncode == 0, proc.stderr
        outs.append(out)
    # --max-sentences 3 ties users 10 and 7: TFF's sorted id order ("10" < "7")
    assert read_config(outs[0])["client_names"] == read_config(outs[1])["client_names"] == ["10", "7", "8"]
    a, b = open_packed(outs[0]), open_packed(outs[1])
    for split in ("train", "test"):
        assert all(np.array_equal(u, v) for u, v in zip(a[split], b[split]))
    make_tag_counts(h5_raw)
    tag_outs = []
    for raw in (sqlite_raw, h5_raw):  # the tag task reads title and tags of either
        tag_outs.append(tmp_path / f"tags_{raw.name}")
        proc = run_script("--raw-dir", str(raw), *TAG_FLAGS, "--out-dir", str(tag_outs[-1]))
        assert proc.returncode == 0, proc.stderr
    a, b = open_packed(tag_outs[0]), open_packed(tag_outs[1])
    assert all(np.array_equal(u, v) for split in ("train", "test") for u, v in zip(a[split], b[split]))
    assert a["train"][1][0].tolist() == [0, 2, -1, -1, -1]  # python, sql
    (h5_raw / "stackoverflow_train.h5").write_bytes((h5_raw / "stackoverflow_train.h5").read_bytes()[:3000])
    proc = run_script("--raw-dir", str(h5_raw), "--vocab-size", "7", "--out-dir", str(tmp_path / "bad"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "stackoverflow_train.h5" in proc.stderr, proc.stderr


# ------------------------------------------------------------------ tag prediction (--task tag)
#: (tokens, title, tags) examples; the words are WORDS (ids 1..7, OOV 8), the tags with
#: --tag-vocab-size 3 python 0, java 1, sql 2 (css is out of the vocabulary)
TAG_USERS = {
    "u1": {"train": [("the code is .", "a title", "python|sql"),   # 6 words, "title" OOV
                     ("it is", "to", "css|java|java")],            # OOV tag dropped, java once
           "test": [("code", "the", "")]},                          # no tag: kept, all -1
    "u2": {"train": [("a b c d e f g h i j", "it", "sql|python|java"),  # 11 words, cut to 6
                     ("x", "y", "java")],
           "test": [("is", "a", "python")]},
    "u3": {"train": [("the", "", "java|css")], "test": []},
}
#: each example's x (6 word ids) and y (5 tag ids), worked out by hand
TAG_EXPECTED = {
    ("the code is .", "a title", "python|sql"): ([1, 5, 2, 4, 3, 8], [0, 2, -1, -1, -1]),
    ("it is", "to", "css|java|java"): ([6, 2, 7, 0, 0, 0], [1, -1, -1, -1, -1]),
    ("code", "the", ""): ([5, 1, 0, 0, 0, 0], [-1, -1, -1, -1, -1]),
    ("a b c d e f g h i j", "it", "sql|python|java"): ([3, 8, 8, 8, 8, 8], [2, 0, 1, -1, -1]),
    ("x", "y", "java"): ([8, 8, 0, 0, 0, 0], [1, -1, -1, -1, -1]),
    ("is", "a", "python"): ([2, 3, 0, 0, 0, 0], [0, -1, -1, -1, -1]),
    ("the", "", "java|css"): ([1, 0, 0, 0, 0, 0], [1, -1, -1, -1, -1]),
}
TAG_FLAGS = ("--task", "tag", "--vocab-size", "7", "--tag-vocab-size", "3", "--max-len", "6",
             "--test-split", "global")


def expected_rows(user, split):
    rows = [TAG_EXPECTED[e] for e in TAG_USERS[user][split]]
    return [r[0] for r in rows], [r[1] for r in rows]


def written_rows(out, layout, client, split):
    if layout == "npz":
        x, y = load_client(out, split, client)
    else:
        x, y, offsets = open_packed(out)[split]
        x, y = x[offsets[client]:offsets[client + 1]], y[offsets[client]:offsets[client + 1]]
    assert x.dtype == y.dtype == np.int64 and x.shape[1:] == (6,) and y.shape[1:] == (5,)
    return x.tolist(), y.tolist()


@pytest.mark.parametrize("layout", ["packed", "npz"])
def test_tag_task_writes_word_ids_and_tag_ids_as_worked_out_by_hand(tmp_path, layout):
    raw = make_raw(tmp_path / "raw", compress=False, users=TAG_USERS)
    out = tmp_path / "tags"
    proc = run_script("--raw-dir", str(raw), *TAG_FLAGS, "--layout", layout, "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    config = read_config(out)
    assert config["client_names"] == ["u1", "u2", "u3"]
    for client, user in enumerate(config["client_names"]):
        for split in ("train", "test"):
            assert written_rows(out, layout, client, split) == expected_rows(user, split), (user, split)
    assert {k: config[k] for k in ("label_type", "num_classes", "max_labels", "label_pad", "vocab_size",
                                   "pad_id", "oov_id", "max_len", "input_shape", "class_names",
                                   "words_cut_samples", "tag_vocab_size")} == {
        "label_type": "multilabel", "num_classes": 3, "max_labels": 5, "label_pad": -1, "vocab_size": 9,
        "pad_id": 0, "oov_id": 8, "max_len": 6, "input_shape": [6], "class_names": ["python", "java", "sql"],
        "words_cut_samples": 1, "tag_vocab_size": 3}
    assert config["task"].startswith("tag prediction") and "bos_id" not in config
    assert "1 of 7 samples had more than --max-len 6 words" in proc.stdout
    # 7 samples holding 9 in-vocabulary tags; u1's tags: python, sql (train), java (train)
    assert "3 clients, 7 samples (9 labels), 3 classes" in proc.stdout
    if layout == "npz":
        assert config["Size of samples for labels in clients"][0] == [[0, 1], [1, 1], [2, 1]]
        assert config["train_samples"] == [2, 2, 1] and config["test_samples"] == [1, 1, 0]
    rerun = run_script("--raw-dir", str(raw), *TAG_FLAGS, "--layout", layout, "--out-dir", str(out))
    assert rerun.returncode == 0 and "already generated" in rerun.stdout
    # the word task on the same flags is another dataset: it regenerates the folder
    word = run_script("--raw-dir", str(raw), "--vocab-size", "7", "--max-len", "6", "--test-split", "global",
                      "--layout", layout, "--out-dir", str(out))
    assert word.returncode == 0 and "already generated" not in word.stdout, word.stderr
    assert "label_type" not in read_config(out)


def test_tag_task_default_cap_and_the_tag_vocabulary_of_tffs_sorted_counts(tmp_path):
    vocab = stackoverflow.TagVocabulary(WORDS, ["python", "java"], stackoverflow.DEFAULT_TAG_MAX_LEN)
    x, y, cut = vocab.samples([vocab.example(" ".join(["it"] * 130), "", "java|python", "w")])
    assert x.shape == (1, 128) and (x == 6).all() and y.tolist() == [[1, 0, -1, -1, -1]] and cut.tolist() == [True]
    make_tag_counts(tmp_path)
    archive = tmp_path / (stackoverflow.TAG_COUNT + ".tar.bz2")
    assert stackoverflow.read_tag_counts(archive, 4) == ["python", "java", "sql", "css"]  # ties in file order
    with pytest.raises(ReadError, match="fewer than --tag-vocab-size 5"):
        stackoverflow.read_tag_counts(archive, 5)


def test_tag_task_converts_between_layouts_bit_for_bit(tmp_path):
    from datagen.relayout import check_folder, convert_layout

    raw = make_raw(tmp_path / "raw", compress=False, users=TAG_USERS)
    proc = run_script("--raw-dir", str(raw), *TAG_FLAGS, "--out-dir", str(tmp_path / "packed"))
    assert proc.returncode == 0, proc.stderr
    convert_layout(tmp_path / "packed", tmp_path / "npz", "npz")
    convert_layout(tmp_path / "npz", tmp_path / "back", "packed")
    assert check_folder(tmp_path / "npz")["label_type"] == "multilabel"
    assert read_config(tmp_path / "npz")["Size of samples for labels in clients"][1] == [[0, 2], [1, 2], [2, 1]]
    for split in ("train", "test"):
        for a, b in zip(open_packed(tmp_path / "packed")[split], open_packed(tmp_path / "back")[split]):
            assert a.dtype == b.dtype and np.array_equal(a, b)
    assert read_config(tmp_path / "back")["content_digest"] == read_config(tmp_path / "packed")["content_digest"]
    # a label outside [-1, num_classes) is refused in one line
    y = np.load(tmp_path / "npz" / "train" / "0.npz")["y"].copy()
    x = np.load(tmp_path / "npz" / "train" / "0.npz")["x"]
    y[0, 4] = 3
    np.savez_compressed(tmp_path / "npz" / "train" / "0.npz", x=x, y=y)
    check = subprocess.run([sys.executable, "convert_layout.py", str(tmp_path / "npz"), "--check"],
                           cwd=REPO / "dataset", capture_output=True, text=True, timeout=60)
    assert check.returncode == 2 and check.stderr.count("\n") == 1 and "outside [-1, 3)" in check.stderr


def test_tag_count_download_from_local_mirror_checks_tffs_sha256(tmp_path, monkeypatch):
    www = make_raw(tmp_path / "www", users=TAG_USERS)
    with LocalServer(www) as server:
        monkeypatch.setenv(download.MIRROR_ENV, server.url)
        # the test's tag counts are not TFF's file: refused by TFF's published SHA-256
        with pytest.raises(download.ChecksumError, match="SHA-256"):
            stackoverflow.locate_tag_counts(None, tmp_path / "dl")
        assert server.requests[0] == "/stackoverflow.tag_count.tar.bz2"
        digest = download.file_digests(www / stackoverflow.TAG_FILE.name)["sha256"]
        monkeypatch.setattr(stackoverflow, "TAG_FILE", download.RemoteFile(stackoverflow.TAG_FILE.name, None,
                                                                           sha256=digest))
        path = stackoverflow.locate_tag_counts(None, tmp_path / "dl")
    assert path == tmp_path / "dl" / stackoverflow.TAG_FILE.name
    assert stackoverflow.read_tag_counts(path, 3) == ["python", "java", "sql"]


@pytest.mark.parametrize("damage", ["truncated", "not_json", "not_counts", "six_tags", "missing"])
def test_bad_tag_inputs_are_refused_in_one_line(tmp_path, damage):
    users = TAG_USERS
    if damage == "six_tags":
        users = {**TAG_USERS, "u2": {"train": [("it", "", "a|b|c|d|e|f")], "test": [("is", "", "a")]}}
    raw = make_raw(tmp_path / "raw", compress=False, users=users)
    archive = raw / stackoverflow.TAG_FILE.name
    if damage == "truncated":
        archive.write_bytes(archive.read_bytes()[:-30])
    elif damage == "not_json":
        (raw / stackoverflow.TAG_COUNT).write_text('{"python": 9, "java"')
        archive.unlink()
    elif damage == "not_counts":
        (raw / stackoverflow.TAG_COUNT).write_text('["python", "java"]')
        archive.unlink()
    elif damage == "missing":
        archive.unlink()
    flags = list(TAG_FLAGS)
    if damage == "six_tags":
        make_tag_counts(raw, {t: 10 - i for i, t in enumerate("abcdef")})
        flags[flags.index("--tag-vocab-size") + 1] = "6"
    out = tmp_path / "so"
    proc = run_script("--raw-dir", str(raw), *flags, "--out-dir", str(out))
    lines = proc.stderr.splitlines()  # the one error after the warning that user u3 has no test examples
    assert proc.returncode == 2 and lines[-1].startswith("error: "), proc.stderr
    assert all(line.startswith("warning: ") for line in lines[:-1]), proc.stderr
    assert "Traceback" not in proc.stderr and not (out / "config.json").exists()
    assert not (out / "train").exists() or not any((out / "train").iterdir())
    expected = {"truncated": "corrupt or truncated tag-count file", "not_json": "not JSON",
                "not_counts": "not a tag-count file", "six_tags": "user 'u2': an example has 6 tags",
                "missing": "stackoverflow.tag_count"}[damage]
    assert expected in proc.stderr, proc.stderr


def test_tag_task_options_are_checked(tmp_path):
    raw = make_raw(tmp_path / "raw", compress=False, users=TAG_USERS)
    for flags, message in ((("--task", "tag", "--few-shot", "1"), "--few-shot"),
                           (("--tag-vocab-size", "3"), "--tag-vocab-size applies to --task tag"),
                           (("--task", "tag", "--tag-vocab-size", "0"), "--tag-vocab-size must be at least 1"),
                           (("--task", "tag", "--tag-vocab-size", "9"), "fewer than --tag-vocab-size 9")):
        proc = run_script("--raw-dir", str(raw), "--vocab-size", "7", *flags, "--out-dir", str(tmp_path / "o"))
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


@pytest.mark.parametrize("layout", ["packed", "npz"])
def test_word_task_files_are_the_same_with_task_word(tmp_path, layout):
    raw = make_raw(tmp_path / "raw", compress=False)
    outs = []
    for extra in ((), ("--task", "word")):
        out = tmp_path / f"so{len(outs)}"
        proc = run_script("--raw-dir", str(raw), "--vocab-size", "7", "--max-len", "5", "--layout", layout,
                          *extra, "--out-dir", str(out))
        assert proc.returncode == 0, proc.stderr
        outs.append(out)
    files = sorted(p.relative_to(outs[0]) for p in outs[0].rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(outs[1]) for p in outs[1].rglob("*") if p.is_file())
    for name in files:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    config = read_config(outs[0])
    assert config["max_len"] == 5 and "label_type" not in config and "words_cut_samples" not in config


def test_tag_task_summary_of_the_packed_layout_is_read_back_as_the_npz_one_counts(tmp_path):
    """The packed writer computes the label skew from the y.npy it wrote ([rows, 5], -1 skipped);
    the npz layout from the counts it held: the same lines. A cap counts the kept samples only."""
    raw = make_raw(tmp_path / "raw", compress=False, users=TAG_USERS)
    summaries = []
    for layout in ("packed", "npz"):
        proc = run_script("--raw-dir", str(raw), *TAG_FLAGS, "--layout", layout, "--out-dir", str(tmp_path / layout))
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        summaries.append(lines[next(i for i, line in enumerate(lines) if line.startswith("Partition summary")):][:4])
    assert summaries[0] == summaries[1] and "mean 0." in summaries[0][3]
    proc = run_script("--raw-dir", str(raw), *TAG_FLAGS, "--samples-per-client", "1", "--seed", "3",
                      "--out-dir", str(tmp_path / "capped"))
    assert proc.returncode == 0, proc.stderr
    x, _, offsets = open_packed(tmp_path / "capped")["train"]
    kept = x[offsets[1]:offsets[2]].tolist()  # u2's one training sample: the cut one or not
    assert read_config(tmp_path / "capped")["words_cut_samples"] == int(kept == [[3, 8, 8, 8, 8, 8]])


def test_the_tag_task_trains_with_tffs_model_and_reports_recall_at_5(tmp_path):
    """Generated tag data, end to end: FedAvg with -m BoWLR trains on it from either layout with the
    same numbers, and the run's file and summary name the metric recall@5."""
    import h5py

    import main as fl_main

    raw = make_raw(tmp_path / "raw", compress=False, users=TAG_USERS)
    curves = {}
    for layout in ("npz", "packed"):
        out = tmp_path / f"tags-{layout}"
        proc = run_script("--raw-dir", str(raw), *TAG_FLAGS, "--layout", layout, "--out-dir", str(out))
        assert proc.returncode == 0, proc.stderr
        results = tmp_path / f"res-{layout}"
        code = fl_main.main(["-dev", "cpu", "--progress", "False", "-q", "-data", str(out), "-m", "BoWLR", "-gr", "2",
                             "-lbs", "1", "-lr", "1", "--results_dir", str(results), "--save_model", "False"])
        assert code == 0
        (found,) = results.glob("*.h5")
        with h5py.File(found) as f:
            assert f.attrs["metric"] == "recall@5"
            curves[layout] = (f["rs_test_acc"][()], f["rs_train_loss"][()])
    np.testing.assert_allclose(curves["packed"][0], curves["npz"][0])
    np.testing.assert_allclose(curves["packed"][1], curves["npz"][1], rtol=1e-6)
    assert np.isfinite(curves["npz"][1]).all() and curves["npz"][1][-1] < curves["npz"][1][0]
