"""PFLlib's core models, each split into a feature extractor (``body``) and a classifier (``head``).

Every model returns logits. PFLlib's ``Mclr_Logistic`` and ``DNN`` return log-softmax and then
apply cross-entropy; since log_softmax is idempotent that gives the same loss and gradients, so
returning logits changes nothing numerically and lets every model share one loss.

The input shape and class count come from the dataset's config.json, so ``CNN`` works on
1x28x28 (MNIST) and 3x32x32 (CIFAR-10) inputs without a ``dim`` flag.
"""
from __future__ import annotations

import math
from argparse import Namespace
from typing import Sequence

import torch
from torch import nn

from flcore.registry import register_model


class SplitModel(nn.Module):
    """``forward(x) = head(body(x))``; personalised algorithms share or keep ``body``/``head``."""

    def __init__(self, body: nn.Module, head: nn.Module):
        super().__init__()
        self.body = body
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _flat_dim(input_shape: Sequence[int]) -> int:
    return int(math.prod(input_shape))


def _feature_dim(body: nn.Module, input_shape: Sequence[int]) -> int:
    with torch.no_grad():
        was_training = body.training
        body.eval()
        dim = body(torch.zeros(2, *input_shape)).shape[1]
        body.train(was_training)
    return int(dim)


@register_model("MLR", "Mclr_Logistic")
def mlr(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """Multinomial logistic regression (PFLlib ``Mclr_Logistic``)."""
    return SplitModel(nn.Flatten(), nn.Linear(_flat_dim(input_shape), num_classes))


@register_model("DNN")
def dnn(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """One hidden layer of 100 units with ReLU (PFLlib ``DNN``, mid_dim=100)."""
    body = nn.Sequential(nn.Flatten(), nn.Linear(_flat_dim(input_shape), 100), nn.ReLU())
    return SplitModel(body, nn.Linear(100, num_classes))


@register_model("DNN-PFLlib")
def dnn_pfllib(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """PFLlib's ``DNN`` as its ``main.py`` splits it (``BaseHeadSplit``) for FedAvg and 19 pFL
    algorithms: setting ``fc`` to Identity leaves ``DNN.forward``'s final log_softmax on the body, so
    the features are the log-softmax of the 100 ReLU units. For side-by-side runs against PFLlib
    (``experiments/pfllib_side_by_side.py``); use ``DNN`` otherwise."""
    body = nn.Sequential(nn.Flatten(), nn.Linear(_flat_dim(input_shape), 100), nn.ReLU(), nn.LogSoftmax(dim=1))
    return SplitModel(body, nn.Linear(100, num_classes))


@register_model("MLP", "2NN")
def mlp(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """McMahan et al.'s 2NN: two hidden layers of 200 units with ReLU (AdaFL's MNIST model)."""
    body = nn.Sequential(
        nn.Flatten(), nn.Linear(_flat_dim(input_shape), 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU()
    )
    return SplitModel(body, nn.Linear(200, num_classes))


@register_model("CNN", "FedAvgCNN")
def cnn(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """McMahan et al.'s MNIST CNN as PFLlib's ``FedAvgCNN``: two 5x5 conv (32, 64) + 2x2 max-pool,
    FC 512, linear classifier. Its FC input is 1024 for 28x28 and 1600 for 32x32 inputs."""
    if len(input_shape) != 3:
        raise ValueError(f"CNN needs image input [C, H, W], got {list(input_shape)}")
    channels = input_shape[0]
    conv = nn.Sequential(
        nn.Conv2d(channels, 32, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
    )
    dim = _feature_dim(conv, input_shape)
    body = nn.Sequential(*conv, nn.Linear(dim, 512), nn.ReLU())
    return SplitModel(body, nn.Linear(512, num_classes))


@register_model("SageflowCNN")
def sageflow_cnn(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """The official Sageflow code's MNIST model (savertm/Sageflow ``CNNMnist``): two 5x5 convolutions
    (32, 64) padded by 2, each with ReLU and 2x2 max-pooling, FC 1024 with ReLU, a linear classifier;
    3,274,634 parameters on 1x28x28. It differs from ``CNN`` (no padding, FC 512: 582,026) only in
    padding and width, and is here for side-by-side runs with that code
    (``experiments/sageflow_mnist.py --protocol official``)."""
    if len(input_shape) != 3:
        raise ValueError(f"SageflowCNN needs image input [C, H, W], got {list(input_shape)}")
    conv = nn.Sequential(
        nn.Conv2d(input_shape[0], 32, kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
    )
    dim = _feature_dim(conv, input_shape)
    body = nn.Sequential(*conv, nn.Linear(dim, 1024), nn.ReLU())
    return SplitModel(body, nn.Linear(1024, num_classes))


@register_model("SimpleCNN")
def simple_cnn(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """NIID-Bench's simple CNN (Li, Diao, Chen, He, ICDE 2022; ``SimpleCNN``/``SimpleCNNMNIST`` in its
    code, ``CNN``/``CNNMnist`` in Flower's ``baselines/niid_bench``): two 5x5 convolutions (6, 16), no
    padding, each with ReLU and 2x2 max-pooling, then FC 120 and FC 84 with ReLU (the body), and a
    linear classifier. 44,426 parameters on 1x28x28 and 62,006 on 3x32x32 (10 classes)."""
    if len(input_shape) != 3:
        raise ValueError(f"SimpleCNN needs image input [C, H, W], got {list(input_shape)}")
    conv = nn.Sequential(
        nn.Conv2d(input_shape[0], 6, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
    )
    dim = _feature_dim(conv, input_shape)
    body = nn.Sequential(*conv, nn.Linear(dim, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU())
    return SplitModel(body, nn.Linear(84, num_classes))


@register_model("LeNet")
def lenet(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """PFLlib's LeNet: conv 5x5 (20) + pool, conv 5x5 (50) + dropout + pool, a 256-unit
    bottleneck with BatchNorm and dropout, then a linear classifier. PFLlib wraps the classifier
    in ``weight_norm``; we use a plain linear layer so every parameter is a view of the flat
    model vector (weight_norm re-parametrises the weight)."""
    if len(input_shape) != 3:
        raise ValueError(f"LeNet needs image input [C, H, W], got {list(input_shape)}")
    conv = nn.Sequential(
        nn.Conv2d(input_shape[0], 20, kernel_size=5), nn.MaxPool2d(2), nn.ReLU(),
        nn.Conv2d(20, 50, kernel_size=5), nn.Dropout2d(p=0.5), nn.MaxPool2d(2), nn.ReLU(),
        nn.Flatten(),
    )
    dim = _feature_dim(conv, input_shape)
    body = nn.Sequential(*conv, nn.Linear(dim, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Dropout(p=0.5))
    return SplitModel(body, nn.Linear(256, num_classes))


@register_model("CNN-BN")
def cnn_bn(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """The FedAvg CNN with BatchNorm (for FedBN, Li et al. ICLR 2021): ``BatchNorm2d`` after each
    convolution and ``BatchNorm1d`` after the FC 512 layer, each before its ReLU (FedBN's placement).
    The running statistics are float buffers, so they are part of the flat model vector."""
    if len(input_shape) != 3:
        raise ValueError(f"CNN-BN needs image input [C, H, W], got {list(input_shape)}")
    conv = nn.Sequential(
        nn.Conv2d(input_shape[0], 32, kernel_size=5), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, kernel_size=5), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
    )
    dim = _feature_dim(conv, input_shape)
    body = nn.Sequential(*conv, nn.Linear(dim, 512), nn.BatchNorm1d(512), nn.ReLU())
    return SplitModel(body, nn.Linear(512, num_classes))
