"""DLG / iDLG (``-dlg``): the attack recovers a training image from a clean gradient of a tiny
model, fails when the gradient carries DP-SGD noise, reads single-sample labels off the gradient,
and runs as a round callback that records ``rs_dlg_psnr`` and saves a picture.

Threshold: a reconstruction "recovers" the image when its PSNR (pixels scaled to [0, 1]) is above
30 dB, i.e. a root-mean-square pixel error under 3.2% of the range; with the noise of DP-SGD
(noise multiplier σ = 1 times the clipping bound, see :func:`dp_noised`) it must stay under 12 dB
(an RMS error of a quarter of the range: no more than a blur of the mean intensity)."""
from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import main
from conftest import MNIST_RAW
from fltest import build_server, dataset_from_arrays, make_args, one_thread  # noqa: F401 - fixture
from flcore.features.dlg import idlg_label, match_order, psnr, reconstruct, ssim, to_unit_range
from flcore.flat import FlatModel
from toydata import make_dataset
from reporting.results import read_results

RECOVERED_DB = 30.0
FAILED_DB = 12.0


class TinyConv(nn.Module):
    """A one-convolution net with sigmoid activations (twice differentiable everywhere, as the
    paper's LeNet variant): 7,954 parameters on 28x28 inputs."""

    def __init__(self, side: int = 28, num_classes: int = 10, bias: bool = True):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 4, 5, stride=2, padding=2), nn.Sigmoid(), nn.Flatten())
        self.head = nn.Linear(4 * ((side + 1) // 2) ** 2, num_classes, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def digit_like(side: int = 28, shift: int = 0) -> torch.Tensor:
    """A hand-drawn-looking "7" in [-1, 1] (MNIST's normalisation): a bar and a diagonal stroke,
    softened by a 3x3 blur."""
    canvas = torch.zeros(side, side)
    top = side // 5
    canvas[top : top + 2, side // 5 + shift : side - side // 5] = 1.0
    for i in range(side - 2 * top):
        col = side - side // 5 - 1 - (i * (side // 2)) // (side - 2 * top) + shift
        canvas[top + i, max(col - 1, 0) : col + 1] = 1.0
    soft = F.avg_pool2d(canvas[None, None], 3, stride=1, padding=1)[0]
    return soft * 2 - 1


def mnist_image() -> tuple[torch.Tensor, int]:
    from datagen.readers import parse_idx

    images = parse_idx(gzip.decompress((MNIST_RAW / "t10k-images-idx3-ubyte.gz").read_bytes()))
    labels = parse_idx(gzip.decompress((MNIST_RAW / "t10k-labels-idx1-ubyte.gz").read_bytes()))
    return torch.tensor(images[0], dtype=torch.float32)[None] / 127.5 - 1, int(labels[0])


def observed_gradient(model: FlatModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    w = model.params.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.cross_entropy(model.net.at(w)(x), y), w)
    return grad


def dp_noised(grad: torch.Tensor, sigma: float = 1.0, seed: int = 1) -> torch.Tensor:
    """DP-SGD's release of a one-sample gradient, ``clip(g, C) + N(0, (σ·C)²)``, with the clipping
    bound C = ||g||: the smallest bound that leaves this gradient as it is, so the noise alone is
    what the attack faces (clipping to a smaller C also rescales the gradient, which defeats this
    attack by itself: 3.8 dB on a real MNIST image with C = 1, ||g|| = 14.4, no noise)."""
    return grad + sigma * float(grad.norm()) * torch.randn(grad.shape, generator=torch.Generator().manual_seed(seed))


def attack(model: FlatModel, target: torch.Tensor, shape, batch: int = 1, labels=None, iterations: int = 8):
    model.module.eval()
    return reconstruct(lambda w, x: model.net.at(w)(x), model.params.detach(), target, shape, batch, 10,
                       labels=labels, iterations=iterations, generator=torch.Generator().manual_seed(0))


def psnr_of(true: torch.Tensor, recon: torch.Tensor) -> float:
    return psnr(to_unit_range(true, -1, 1), to_unit_range(recon, -1, 1))


def tiny_model(side: int = 28, bias: bool = True) -> FlatModel:
    torch.manual_seed(0)
    return FlatModel(TinyConv(side, bias=bias))


def test_dlg_recovers_a_digit_like_image_and_fails_under_dp_noise():
    model = tiny_model()
    x, y = digit_like()[None], torch.tensor([7])
    grad = observed_gradient(model, x, y)
    label = idlg_label(grad, model.segments, 10)
    assert label == 7
    clean = attack(model, grad, x.shape[1:], labels=torch.tensor([label]))
    clean_db = psnr_of(x[0], clean.inputs[0])
    assert clean_db > RECOVERED_DB, clean_db
    noisy = dp_noised(grad)
    noisy_db = psnr_of(x[0], attack(model, noisy, x.shape[1:], labels=torch.tensor([idlg_label(noisy, model.segments, 10)])).inputs[0])
    assert noisy_db < FAILED_DB, noisy_db
    assert clean_db - noisy_db > 20


@pytest.mark.skipif(not (MNIST_RAW / "t10k-images-idx3-ubyte.gz").exists(), reason=f"MNIST not found in {MNIST_RAW}")
def test_dlg_recovers_a_real_mnist_image_and_fails_under_dp_noise():
    image, digit = mnist_image()
    model = tiny_model()
    x, y = image[None], torch.tensor([digit])
    grad = observed_gradient(model, x, y)
    clean = attack(model, grad, x.shape[1:], labels=torch.tensor([idlg_label(grad, model.segments, 10)]))
    clean_db = psnr_of(x[0], clean.inputs[0])
    assert clean_db > RECOVERED_DB, clean_db
    noisy = dp_noised(grad)
    noisy_db = psnr_of(x[0], attack(model, noisy, x.shape[1:], labels=torch.tensor([idlg_label(noisy, model.segments, 10)])).inputs[0])
    assert noisy_db < FAILED_DB, noisy_db


@pytest.mark.parametrize("bias", [True, False])
def test_idlg_reads_every_label_of_a_one_sample_batch(bias):
    model = tiny_model(side=8, bias=bias)
    g = torch.Generator().manual_seed(3)
    for label in range(10):
        x = torch.randn(1, 1, 8, 8, generator=g)
        grad = observed_gradient(model, x, torch.tensor([label]))
        assert idlg_label(grad, model.segments, 10) == label


def test_idlg_has_no_label_when_the_classifier_is_not_uploaded():
    model = tiny_model(side=8)
    grad = observed_gradient(model, torch.randn(1, 1, 8, 8), torch.tensor([2]))
    head = model.head_mask()[: model.num_params]
    assert idlg_label(torch.where(head, torch.zeros_like(grad), grad), model.segments, 10) is None


def test_dlg_recovers_a_batch_of_two_with_their_labels():
    """Without iDLG's label (batches of several samples) the labels are optimised too (DLG)."""
    model = tiny_model(side=12)
    x = torch.stack([digit_like(12), -digit_like(12, shift=1)])
    y = torch.tensor([7, 3])
    found = attack(model, observed_gradient(model, x, y), x.shape[1:], batch=2, iterations=20)
    order = match_order(x, found.inputs)
    assert found.labels[order].tolist() == [7, 3]
    assert min(psnr_of(t, r) for t, r in zip(x, found.inputs[order])) > RECOVERED_DB


def test_psnr_and_ssim_by_hand():
    image = torch.rand(1, 9, 9, generator=torch.Generator().manual_seed(0))
    assert psnr(image, image) == 100.0
    assert psnr(torch.zeros(1, 4, 4), torch.full((1, 4, 4), 0.1)) == pytest.approx(20.0)
    assert ssim(image, image) == pytest.approx(1.0)
    # constant images: only the luminance term is left, (2·a·b + c1) / (a² + b² + c1)
    c1 = 0.01**2
    assert ssim(torch.full((1, 8, 8), 0.2), torch.full((1, 8, 8), 0.4)) == pytest.approx((2 * 0.08 + c1) / (0.2 + c1))
    assert ssim(image, 1 - image) < 0
    assert np.isnan(ssim(torch.rand(5), torch.rand(5)))
    assert to_unit_range(torch.tensor([-3.0, 0.0, 3.0]), -1, 1).tolist() == [0.0, 0.5, 1.0]


def test_match_order_pairs_a_shuffled_batch():
    batch = torch.randn(4, 1, 5, 5, generator=torch.Generator().manual_seed(0))
    shuffled = batch[[2, 0, 3, 1]] + 0.01
    assert torch.allclose(shuffled[match_order(batch, shuffled)], batch + 0.01)


# --------------------------------------------------------------------- the round callback
def one_sample_clients(num_clients: int = 3, side: int = 28):
    """Clients holding one training image each (batch size 1, one epoch: one local step, so the
    upload is exactly ``w - lr * grad`` of that image)."""
    clients = []
    for c in range(num_clients):
        x = digit_like(side, shift=c)[None] * (1 - 0.2 * c)
        clients.append((x, torch.tensor([(7 + c) % 10]), x.clone(), torch.tensor([(7 + c) % 10])))
    return dataset_from_arrays(clients, 10)


def test_attack_callback_records_psnr_and_saves_the_picture(tmp_path):
    """Rounds 0 and 2 are attacked (-dlgg 2), with learning-rate decay: the delta is divided by
    the rate of its own round, so round 2 is recovered as well as round 0."""
    data = one_sample_clients()
    args = make_args("FedAvg", "-dlg", "-ld", "True", "-ldg", "0.5", global_rounds=3, batch_size=1,
                     local_learning_rate=0.1, dlg_gap=2, dlg_clients=2, dlg_iters=8, eval_auc=False, engine="sequential")
    torch.manual_seed(0)
    server = build_server(args, data, TinyConv())
    server.runtime.artifacts = tmp_path / "run"
    server.train(progress=False)
    torch.manual_seed(0)
    unattacked = build_server(make_args("FedAvg", "-ld", "True", "-ldg", "0.5", global_rounds=3, batch_size=1,
                                        local_learning_rate=0.1, eval_auc=False, engine="sequential"), data, TinyConv())
    unattacked.train(progress=False)
    assert torch.equal(server.global_params, unattacked.global_params)  # the attack only watches
    series = server.history.extra_series
    assert series["dlg_rounds"] == [0, 2]
    assert min(series["dlg_psnr"]) > RECOVERED_DB, series["dlg_psnr"]
    assert min(series["dlg_ssim"]) > 0.9
    assert series["dlg_label_acc"] == [1.0, 1.0]
    assert (tmp_path / "run_dlg_round0.png").stat().st_size > 0
    assert (tmp_path / "run_dlg_round2.png").exists() and not (tmp_path / "run_dlg_round1.png").exists()


def test_attack_through_main_writes_the_series_and_the_picture(tmp_path, capsys):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 8, 8), train_sizes=[1, 4, 6], eight_bit=True)
    results = tmp_path / "res"
    code = main.main(["-data", str(folder), "-m", "DNN", "-gr", "2", "-dev", "cpu", "-dlg", "-dlgg", "1", "-lbs", "1",
                      "-bnpc", "2", "--dlg_iters", "5", "--results_dir", str(results), "--progress", "False",
                      "--save_model", "False"])
    out = capsys.readouterr().out
    assert code == 0
    h5 = read_results(results / f"{folder.name}_FedAvg_test_0.h5")
    assert h5["rs_dlg_rounds"].tolist() == [0, 1]
    assert np.isfinite(h5["rs_dlg_psnr"]).all() and len(h5["rs_dlg_ssim"]) == 2
    assert h5["attrs"]["dlg_psnr_mean"] == pytest.approx(float(np.mean(h5["rs_dlg_psnr"])))
    assert "DLG attack: mean PSNR" in out
    assert sorted(p.name for p in results.glob("*.png")) == [f"{folder.name}_FedAvg_test_0_dlg_round{t}.png" for t in (0, 1)]


def test_attack_refuses_token_ids(tmp_path, capsys):
    folder = tmp_path / "Text"
    (folder / "train").mkdir(parents=True)
    (folder / "test").mkdir()
    for cid in range(2):
        for split in ("train", "test"):
            np.savez(folder / split / f"{cid}.npz", x=np.ones((4, 6), dtype=np.int64), y=np.arange(4) % 2)
    (folder / "config.json").write_text('{"num_clients": 2, "num_classes": 2, "input_shape": [6]}')
    code = main.main(["-data", str(folder), "-m", "fastText", "-vs", "4", "-gr", "1", "-lbs", "2", "-dev", "cpu", "-dlg",
                      "--results_dir", str(tmp_path), "--progress", "False"])
    err = capsys.readouterr().err
    assert code == 2 and "token ids" in err and len(err.strip().splitlines()) == 1


def test_dp_sgd_defeats_the_attack_on_what_clients_upload():
    """The same one-step uploads as above, without and with ``-dp`` (DP-SGD, σ = 1, PFLlib's
    clipping bound 1): recovered without, not with."""
    data = one_sample_clients()
    psnr_by_dp = {}
    for flags in ([], ["-dp", "-dps", "1", "--dp_clip", "1"]):
        args = make_args("FedAvg", "-dlg", *flags, global_rounds=1, batch_size=1, local_learning_rate=0.1,
                         dlg_clients=3, dlg_iters=8, eval_auc=False, engine="sequential")
        torch.manual_seed(0)
        server = build_server(args, data, TinyConv())
        server.train(progress=False)
        psnr_by_dp[bool(flags)] = server.history.extra_series["dlg_psnr"][0]
    assert psnr_by_dp[False] > RECOVERED_DB and psnr_by_dp[True] < FAILED_DB, psnr_by_dp
