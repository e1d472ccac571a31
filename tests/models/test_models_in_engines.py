"""The GroupNorm variants run in the batched engine; BatchNorm, dropout and recurrent models fall
back to sequential training cleanly; a batched text model trains as the sequential engine does."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from fltest import build_server, dataset_from_arrays, make_args
from modelcases import BIG, CASES, build, inputs
from test_models_through_main import run_main, write_token_dataset


#: smaller images where only the kind of layers matters (Digit5CNN's FC layers shrink from 25M weights)
SMALL = {"Digit5CNN": (3, 8, 8), "Digit5CNN-GN": (3, 8, 8)}


def _server(name: str, engine: str = "batched"):
    case = CASES[name]._replace(input_shape=SMALL.get(name, CASES[name].input_shape))
    g = torch.Generator().manual_seed(0)
    clients = [(inputs(case, 3, g), torch.arange(3) % case.num_classes, inputs(case, 2, g), torch.arange(2))
               for _ in range(2)]
    dataset = dataset_from_arrays(clients, case.num_classes)
    torch.manual_seed(0)
    return build_server(make_args("FedAvg", engine=engine, batch_size=3, vocab_size=100, feature_dim=32), dataset,
                        build(name, case))


def _slow_if_big(*names):
    return [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n for n in names]


@pytest.mark.parametrize("name", _slow_if_big("ResNet10-GN", "ResNet18-GN", "GoogleNet-GN", "MobileNet-GN", "Digit5CNN-GN"))
def test_groupnorm_variants_are_batched(name):
    assert _server(name).engine.model_fallback_reason() is None


@pytest.mark.parametrize("name", _slow_if_big("ResNet10", "ResNet18", "GoogleNet", "MobileNet", "CNN-BN", "Digit5CNN"))
def test_batchnorm_models_fall_back(name):
    reason = _server(name).engine.model_fallback_reason()
    assert reason is not None and ("BatchNorm" in reason or "dropout" in reason)


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # torch: vmap over an LSTM loops
@pytest.mark.parametrize("name", ["LSTM", "BiLSTM", "TextCNN", "Transformer", "fastText"])
def test_text_models_get_a_clean_answer_from_the_batched_engine(name):
    reason = _server(name).engine.model_fallback_reason()
    assert reason is None or isinstance(reason, str)  # a reason to train sequentially, never an exception


def test_batched_fasttext_trains_as_the_sequential_engine(tmp_path, capsys):
    data = write_token_dataset(tmp_path)
    results = {}
    for engine in ("sequential", "batched"):
        code, _, err = run_main(capsys, "-data", str(data), "-m", "fastText", "-vs", "40", "-fd", "16", "-gr", "2",
                                "-lr", "0.1", "--engine", engine, "--results_dir", str(tmp_path / engine))
        assert code == 0, err
        with h5py.File(tmp_path / engine / "TinyText_FedAvg_test_0.h5") as f:
            results[engine] = f["rs_train_loss"][()], f["rs_test_acc"][()]
    assert np.allclose(results["sequential"][0], results["batched"][0], rtol=1e-5, atol=1e-6)
    assert np.array_equal(results["sequential"][1], results["batched"][1])


@pytest.mark.slow
def test_batched_groupnorm_resnet_trains_as_the_sequential_engine(tmp_path, capsys):
    from toydata import make_dataset

    data = make_dataset(tmp_path, name="TinyImages", num_clients=3, input_shape=(3, 16, 16), num_classes=4,
                        train_sizes=[10, 7, 12], test_size=4, eight_bit=True)
    results = {}
    for engine in ("sequential", "batched"):
        code, out, err = run_main(capsys, "-data", str(data), "-m", "ResNet10-GN", "-gr", "2", "-lr", "0.05",
                                  "--engine", engine, "--results_dir", str(tmp_path / engine), "-q", "False")
        assert code == 0, err
        assert "training sequentially" not in out + err
        with h5py.File(tmp_path / engine / "TinyImages_FedAvg_test_0.h5") as f:
            results[engine] = f["rs_train_loss"][()]
    assert np.allclose(results["sequential"], results["batched"], rtol=1e-4, atol=1e-5)
