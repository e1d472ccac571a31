"""Multi-label data (config.json's "label_type": "multilabel", flcore/objectives.py): the loss,
recall@5 and micro-AUC against hand computations, TFF's bag-of-words model, training and
evaluation on both layouts and every engine, and one-line refusals of what cannot apply."""
from __future__ import annotations

import json
import math

import h5py
import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

import main
from fltest import build_server, make_args, run_main_two_rounds
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from multilabel_data import TAGS, WORDS, make_tag_dataset
from flcore.objectives import MultiLabel, SingleClass, objective_of
from flcore.trainmodel.text import NormalisedBag, bag_of_words_lr
from flcore.registry import OBJECTIVES
from fldata.loading import LABEL_TYPES, load_federated_dataset
from reporting.loading import PlotError, load_run
from reporting.series import METRICS, group_runs
from reporting.stats import summarize_runs
from reporting.tables import summary_cells
from utils.auc import segment_micro_auc
from utils.errors import FLError


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def test_the_loss_is_the_mean_binary_cross_entropy_of_the_multi_hot_labels():
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 3.0, -2.0]])
    y = torch.tensor([[0, 2], [1, -1]])
    targets = [[1, 0, 1], [0, 1, 0]]
    by_hand = [sum(-(t * math.log(sigmoid(z)) + (1 - t) * math.log(1 - sigmoid(z)))
                   for z, t in zip(row, truth)) / 3 for row, truth in zip(logits.tolist(), targets)]
    objective = MultiLabel()
    assert objective.loss(logits, y, reduction="none").tolist() == pytest.approx(by_hand, rel=1e-6)
    assert float(objective.loss(logits, y)) == pytest.approx(sum(by_hand) / 2, rel=1e-6)
    assert float(objective.loss(logits, y, reduction="sum")) == pytest.approx(sum(by_hand), rel=1e-6)


def test_recall_at_5_counts_the_true_labels_among_the_five_highest_scores():
    # 7 classes; row 0's top 5 are classes 6, 5, 4, 3, 2 (0 and 1 lowest): of its labels {0, 2, 5} two are hits
    logits = torch.tensor([[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
                           [0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0],
                           [0.0] * 7])
    y = torch.tensor([[0, 2, 5], [6, -1, -1], [-1, -1, -1]])
    objective = MultiLabel()
    assert objective.hits(logits, y).tolist() == [2.0, 0.0, 0.0]
    assert objective.units(y).tolist() == [3.0, 1.0, 0.0]
    # one class per sample: a hit is the argmax, out of one
    assert SingleClass().hits(logits[:2], torch.tensor([6, 1])).tolist() == [1.0, 0.0]
    assert SingleClass().units(torch.tensor([6, 1])) is None


def test_the_micro_auc_of_multi_label_rows_is_scikit_learns():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 5, generator=g)
    y = torch.tensor([[0, 3], [1, -1], [4, 2], [2, -1], [0, 1], [3, -1], [1, 4], [-1, -1], [2, 3]])
    lens = [4, 5]
    objective = MultiLabel()
    auc = segment_micro_auc(objective.scores(logits), y, lens, objective.positives(y, 5))
    truth = objective.positives(y, 5).numpy()
    scores = objective.scores(logits).numpy()
    expected = [roc_auc_score(truth[:4].ravel(), scores[:4].ravel()), roc_auc_score(truth[4:].ravel(), scores[4:].ravel())]
    assert auc.tolist() == pytest.approx(expected, abs=1e-9)


def test_the_bag_of_words_model_is_a_dense_layer_on_the_normalised_bag():
    vocab = 6  # padding 0, words 1..4, out of vocabulary 5
    ids = torch.tensor([[1, 2, 2, 5, 0, 0], [0, 0, 0, 0, 0, 0], [4, 4, 4, 4, 4, 4]])
    bag = NormalisedBag(vocab)(ids)
    # the out-of-vocabulary id counts in the denominator and is dropped; padding is neither
    assert bag.tolist() == [[0.25, 0.5, 0.0, 0.0], [0.0] * 4, [0.0, 0.0, 0.0, 1.0]]
    # TFF's current rule: over the in-vocabulary words only
    assert NormalisedBag(vocab, "vocabulary")(ids)[0].tolist() == pytest.approx([1 / 3, 2 / 3, 0.0, 0.0])
    assert torch.equal(bag_of_words_lr([6], 3, make_args("FedAvg", "-vs", "6", "--bow_denominator", "vocabulary"))
                       .body(ids), NormalisedBag(vocab, "vocabulary")(ids))
    args = make_args("FedAvg", "-vs", str(vocab))
    model = bag_of_words_lr([6], 3, args)
    assert list(model.head.weight.shape) == [3, 4] and not model.head.bias.any()
    assert torch.allclose(model(ids), bag @ model.head.weight.T + model.head.bias)


def _recall_by_hand(module, dataset) -> float:
    hits = units = 0
    for client in dataset.clients:
        with torch.no_grad():
            logits = module(client.test_x)
        top = logits.topk(5, dim=1).indices.tolist()
        for row, labels in zip(top, client.test_y.tolist()):
            true = [label for label in labels if label >= 0]
            hits += sum(label in row for label in true)
            units += len(true)
    return hits / units


def test_the_evaluation_of_multi_label_data_is_the_micro_recall_at_5_of_every_test_label(tmp_path):
    folder = make_tag_dataset(tmp_path)
    dataset = load_federated_dataset(str(folder))
    assert isinstance(objective_of(dataset.config), MultiLabel)
    args = make_args("FedAvg", "-vs", str(WORDS + 2), "--eval_group", "1")
    torch.manual_seed(0)
    module = bag_of_words_lr([8], TAGS, args)
    server = build_server(args, dataset, module)
    result = server.evaluate_models(lambda _: server.global_params)
    assert result.test_acc == pytest.approx(_recall_by_hand(module, dataset), abs=1e-12)
    # the train loss is the objective's over every training row
    x = torch.cat([c.train_x for c in dataset.clients])
    y = torch.cat([c.train_y for c in dataset.clients])
    with torch.no_grad():
        assert result.train_loss == pytest.approx(float(MultiLabel().loss(module(x), y)), rel=1e-6)


def _run(tmp_path, folder, *flags: str, results: str = "res") -> tuple[int, str]:
    out = tmp_path / results
    rc = main.main(["-data", str(folder), "-m", "BoWLR", "-gr", "2", "-lr", "5", "-dev", "cpu", "--results_dir", str(out),
                    "--save_model", "False", "--progress", "False", *flags])
    return rc, out


@pytest.mark.parametrize("engine", ["sequential", "batched", "threaded"])
def test_fedavg_trains_multi_label_data_the_same_from_both_layouts_and_on_every_engine(tmp_path, capsys, engine):
    runs = {}
    for layout in ("npz", "packed"):
        folder = make_tag_dataset(tmp_path, name=f"Tags-{layout}", layout=layout)
        flags = ("--engine", engine) if layout == "packed" else ()
        rc, out = _run(tmp_path, folder, *flags, results=f"res-{layout}")
        assert rc == 0
        (path,) = out.glob("*.h5")
        with h5py.File(path) as f:
            runs[layout] = {key: f[key][()] for key in ("rs_test_acc", "rs_test_auc", "rs_train_loss")}
            assert f.attrs["metric"] == "recall@5"
    captured = capsys.readouterr()
    assert "best recall@5" in captured.out and "test recall@5" in captured.out
    assert "training sequentially" not in captured.err  # the batched engine batches the model
    for key, values in runs["npz"].items():
        np.testing.assert_allclose(runs["packed"][key], values, rtol=1e-5, atol=1e-7, err_msg=key)
    # training moved the model: the loss fell
    assert runs["npz"]["rs_train_loss"][-1] < runs["npz"]["rs_train_loss"][0]
    # a plot of the runs names what they measure; with an accuracy run beside them they are refused
    runs_read = [load_run(path) for path in sorted(tmp_path.glob("res-*/*.h5"))]
    assert group_runs(runs_read, METRICS["acc"]).metric.label == "Test recall@5 (%)"
    accuracy_run = load_run(run_main_two_rounds(tmp_path, "FedAvg"))
    assert group_runs([accuracy_run], METRICS["acc"]).metric.label == "Test accuracy (%)"
    with pytest.raises(PlotError, match="measure different things"):
        group_runs([*runs_read, accuracy_run], METRICS["acc"])
    # and the summary table says it beside the figures
    header, rows = summary_cells([summarize_runs(runs_read), summarize_runs([accuracy_run])])
    assert header[4] == "acc is" and [row[4] for row in rows] == ["recall@5", "accuracy"]


@pytest.mark.parametrize("flags, says", [
    (("-algo", "MOON"), "-algo MOON is not written for multilabel labels"),
    (("--attack", "label_flip", "--attack_fraction", "0.25"), "data poisoning"),
    (("-dlg", "True"), "the dlg feature is not written for multilabel labels"),
    (("--few_shot", "2"), "--few_shot picks rows per client and class"),
])
def test_what_reads_labels_as_classes_is_refused_in_one_line(tmp_path, capsys, flags, says):
    rc, out = _run(tmp_path, make_tag_dataset(tmp_path), *flags)
    err = capsys.readouterr().err
    assert rc == 2 and says in err and "Traceback" not in err
    assert not list(out.glob("*.h5"))
    line = next(line for line in err.splitlines() if line.startswith("error:"))
    if flags[0] == "-algo":  # the refusal names the algorithms that do train on it
        assert "FedAvg" in line and "FedProx" in line and "MOON" not in line.split("train on them:")[1]


def test_the_bag_of_words_flag_is_refused_for_another_model(tmp_path, capsys):
    rc, _ = _run(tmp_path, make_tag_dataset(tmp_path), "-algo", "FedAvg", "-m", "fastText", "-fd", "8",
                 "--bow_denominator", "vocabulary")
    assert rc == 2 and "--bow_denominator is a flag of -m BoWLR; -m fastText does not read it" in capsys.readouterr().err


def test_model_attacks_and_the_other_features_take_multi_label_data(tmp_path):
    rc, _ = _run(tmp_path, make_tag_dataset(tmp_path), "-algo", "FedProx", "-mu", "0.1", "--attack", "sign_flip",
                 "--attack_fraction", "0.25", "--robust", "median", "-dp", "True", "-dps", "1.0")
    assert rc == 0


@pytest.mark.parametrize("change, says", [
    ({"y": lambda y: y[:, 0]}, "expected [rows, 5] label ids"),
    ({"y": lambda y: np.where(y == 0, -2, y)}, "outside [-1, 12)"),
    ({"config": {"max_labels": None}}, "multi-label data need whole numbers"),
    ({"config": {"label_type": "tags"}}, "\"label_type\" 'tags' is not one of class, multilabel"),
])
def test_multi_label_files_that_lie_are_refused_in_one_line(tmp_path, change, says):
    folder = make_tag_dataset(tmp_path)
    if "y" in change:
        with np.load(folder / "train" / "1.npz") as archive:
            x, y = archive["x"], archive["y"]
        np.savez(folder / "train" / "1.npz", x=x, y=change["y"](y))
    if "config" in change:
        config = json.loads((folder / "config.json").read_text())
        config.update(change["config"])
        (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(FLError, match=None) as caught:
        load_federated_dataset(str(folder))
    assert says in str(caught.value)


def test_the_loader_knows_every_label_type_the_platform_trains():
    assert set(LABEL_TYPES) == set(OBJECTIVES.names())


def test_a_dataset_of_one_class_per_sample_keeps_its_rule(tmp_path):
    """Two-dimensional labels without "label_type": "multilabel" are still refused."""
    folder = make_tag_dataset(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["label_type"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(FLError, match="expected one label per sample"):
        load_federated_dataset(str(folder))
