"""FedBN: the first round against FedAvg (same training, normalisation layers kept), the next
round's start point merges each client's own normalisation layers, which layers stay local, two
rounds with ``-m CNN-BN`` through main.

Shared with the other partial-sharing algorithms (``test_partial_sharing.py``): normalisation
layers never leave the client, bytes count the rest only, state under partial participation,
FedBN on a model without normalisation layers is FedAvg."""
from __future__ import annotations

import h5py
import pytest
import torch
from torch import nn

import main
from flcore.flat import FlatModel
from flcore.registry import MODELS
from fltest import build_server, make_args, random_dataset, run_round
from toydata import make_dataset
from test_partial_sharing import TinyBN


def _server(algorithm: str, data):
    torch.manual_seed(0)
    args = make_args(algorithm, batch_size=4, local_learning_rate=0.1, engine="sequential")
    return build_server(args, data, TinyBN(4, 3))


def test_norm_layers_stay_with_each_client():
    data = random_dataset(num_clients=3, dim=4, num_classes=3, seed=11)
    fedbn, fedavg = _server("FedBN", data), _server("FedAvg", data)
    shared = fedbn.shared_mask
    norm = fedbn.model.mask(lambda seg: seg.in_norm)
    assert torch.equal(~shared, norm) and int(norm.sum()) == 4 * 4  # weight, bias, running mean and var
    init = fedbn.global_params.clone()
    ours, theirs = run_round(fedbn, 0).updates, run_round(fedavg, 0).updates
    # Round 0 starts everyone from the same model: the shared part is FedAvg's average bit for bit,
    # the normalisation layers stay the initial ones on the server and each client's own after training.
    assert torch.equal(fedbn.global_params[shared], fedavg.global_params[shared])
    assert torch.equal(fedbn.global_params[norm], init[norm])
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert torch.equal(a.params[shared], b.params[shared])
        assert torch.equal(fedbn.eval_params(i)[norm], b.params[norm])
        assert not torch.equal(b.params[norm], init[norm])
    # Round 1: each client starts from the global shared part and its own normalisation layers.
    package = fedbn.make_package(1, [0, 1, 2])
    for i, client in enumerate(fedbn.clients):
        job = client.plan_job(package)
        client.open_job(job)
        assert torch.equal(job.start, torch.where(shared, fedbn.global_params, theirs[i].params))



class BNAndGN(nn.Module):
    """A body with a BatchNorm and a GroupNorm layer."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 4), nn.GroupNorm(2, 4))
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


@pytest.mark.parametrize("local, private_names", [
    ("norm", {"body.1.weight", "body.1.bias", "body.1.running_mean", "body.1.running_var",
              "body.3.weight", "body.3.bias"}),
    ("batchnorm", {"body.1.weight", "body.1.bias", "body.1.running_mean", "body.1.running_var"}),
])
def test_which_layers_stay_local(local, private_names):
    data = random_dataset(num_clients=2, dim=4, num_classes=3, seed=12)
    server = build_server(make_args("FedBN", "--fedbn_local", local), data, BNAndGN())
    assert server.summary() == {"fedbn_local": local}
    expected = server.model.mask(lambda seg: seg.name in private_names)
    assert torch.equal(~server.shared_mask, expected)
    updates = run_round(server, 0).updates
    assert all(u.shared_numel == int((~expected).sum()) for u in updates)


def test_two_rounds_with_cnn_bn_through_main(tmp_path):
    """FedBN on the BatchNorm CNN through main: every BatchNorm2d/1d layer (affine parameters and
    running statistics, 2 x (32 + 64 + 512) x 2 entries) stays local, so each upload is that much
    smaller than the whole model."""
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 28, 28), train_sizes=[12, 16, 20])
    results = tmp_path / "res"
    rc = main.main(["-data", str(folder), "--results_dir", str(results), "-dev", "cpu", "-gr", "2", "-m", "CNN-BN",
                    "-algo", "FedBN", "--progress", "False", "-q", "True", "--save_model", "False"])
    assert rc == 0
    total = FlatModel(MODELS.get("CNN-BN")((1, 28, 28), 10)).num_total
    local = 4 * (32 + 64 + 512)
    with h5py.File(next(results.glob("*.h5")), "r") as f:
        acc = f["rs_test_acc"][:]
        assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
        assert list(f["rs_bytes_up"][:]) == [3 * (total - local) * 4] * 2
