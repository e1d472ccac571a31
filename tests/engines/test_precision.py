"""``--precision`` (flcore/engines/precision.py): opt-in bf16/TF32 local training, fp32 by default."""
from __future__ import annotations

import importlib.util

import pytest
import torch

import main
from flcore.engines.precision import check_precision
from fltest import build_server, image_dataset, make_args
from fltest import one_thread  # noqa: F401  (fixture)
from flcore.registry import MODELS
from toydata import make_dataset
from utils.errors import FLError

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")


def test_fp32_is_the_default_and_changes_nothing():
    args = make_args("FedAvg")
    assert args.precision == "fp32"
    assert check_precision(args, torch.device("cpu")) == "fp32"


def test_refused_with_dp_sgd_and_where_unsupported():
    with pytest.raises(FLError, match="-dp"):
        check_precision(make_args("FedAvg", "-dp", "True", precision="bf16"), torch.device("cpu"))
    with pytest.raises(FLError, match="tf32 needs an NVIDIA GPU"):
        check_precision(make_args("FedAvg", precision="tf32"), torch.device("cpu"))


def test_main_refuses_in_one_line_with_exit_2(tmp_path, capsys):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 16, 16), num_classes=3)
    base = ["-data", str(folder), "--results_dir", str(tmp_path / "res"), "-dev", "cpu", "-gr", "1", "-m", "CNN",
            "--progress", "False", "-q", "True", "--save_model", "False"]
    # without opacus, -dp is refused first, for want of it (one line too; the GPU machine's image has none)
    has_opacus = importlib.util.find_spec("opacus") is not None
    for extra in ([["--precision", "bf16", "-dp", "True"]] if has_opacus else []) + [["--precision", "tf32"]]:
        assert main.main(base + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--precision" in err[0], err
    assert not list((tmp_path / "res").glob("*.h5"))


def _cnn_round(engine: str, precision: str, device="cpu", **flags):
    dataset = image_dataset([9, 14, 21, 6])
    args = make_args("FedAvg", engine=engine, batch_size=4, local_learning_rate=0.05, eval_auc=False,
                     precision=precision, **flags)
    torch.manual_seed(0)
    server = build_server(args, dataset, MODELS.get("CNN")(dataset.input_shape, dataset.num_classes, None))
    cohort = list(range(len(server.clients)))
    return server.engine.train([server.clients[i] for i in cohort], server.make_package(0, cohort))


@pytest.mark.parametrize("engine", ["sequential", "threaded", "batched"])
def test_bf16_trains_in_bf16_with_fp32_weights(engine):
    flags = {"workers": 2} if engine == "threaded" else {}
    full = _cnn_round(engine, "fp32", **flags)
    half = _cnn_round(engine, "bf16", **flags)
    for f, h in zip(full, half):
        assert h.params.dtype == torch.float32
        assert not torch.equal(f.params, h.params)  # the products did round to bf16
        change = (f.params - h.params).abs().max()
        assert change < 2e-2 and abs(f.loss - h.loss) < 5e-2


def test_bf16_engines_agree():
    seq = _cnn_round("sequential", "bf16")
    bat = _cnn_round("batched", "bf16")
    for s, b in zip(seq, bat):
        torch.testing.assert_close(b.params, s.params, atol=1e-2, rtol=0)
