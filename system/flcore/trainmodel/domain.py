"""PFLlib's models for particular datasets: ``HARCNN`` (sensor windows), ``AmazonMLP`` (Amazon
Review feature vectors) and ``Digit5CNN`` (the Digit5 feature-shift domains), each adapting its
first layer to the dataset's input shape and its classifier to the class count.

``head`` is always the final linear classifier. PFLlib's ``HARCNN`` calls its whole three-layer
MLP ``fc``, so PFLlib's head-splitting algorithms (FedPer, FedRep, ...) personalise all three
layers there; here the first two belong to ``body``, as in the other models.
"""
from __future__ import annotations

import math
from argparse import Namespace
from typing import Sequence

from torch import nn

from flcore.registry import register_model
from flcore.trainmodel.models import SplitModel, _feature_dim
from flcore.trainmodel.norms import dropout, norm_layer, norm_layer_1d, register_with_groupnorm_variant


@register_model("HARCNN")
def harcnn(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """PFLlib's HARCNN (after jindongwang's activity-recognition CNN): inputs [channels, 1, time]
    (UCI HAR: 9 signals x 128 steps; PAMAP2: 9 x 256), two (1, 9) convolutions (32, 64) each with
    ReLU and a (1, 2) max-pool of stride 2, FC 1024, FC 512, linear classifier. PFLlib passes the
    flattened size by hand (1664 for HAR, 3712 for PAMAP2); it is computed from the input here."""
    if len(input_shape) != 3:
        raise ValueError(f"HARCNN needs sensor windows [channels, 1, time], got {list(input_shape)}")
    conv = nn.Sequential(
        nn.Conv2d(input_shape[0], 32, kernel_size=(1, 9)), nn.ReLU(), nn.MaxPool2d((1, 2), stride=2),
        nn.Conv2d(32, 64, kernel_size=(1, 9)), nn.ReLU(), nn.MaxPool2d((1, 2), stride=2),
        nn.Flatten(),
    )
    dim = _feature_dim(conv, input_shape)
    body = nn.Sequential(*conv, nn.Linear(dim, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU())
    return SplitModel(body, nn.Linear(512, num_classes))


@register_model("AmazonMLP")
def amazon_mlp(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """KD3A's Amazon Review MLP as in PFLlib: 5,000 input features (any count here) -> 1000 -> 500
    -> 100 with ReLU, linear classifier (2 classes in PFLlib; the dataset's count here)."""
    body = nn.Sequential(
        nn.Flatten(), nn.Linear(int(math.prod(input_shape)), 1000), nn.ReLU(),
        nn.Linear(1000, 500), nn.ReLU(), nn.Linear(500, 100), nn.ReLU(),
    )
    return SplitModel(body, nn.Linear(100, num_classes))


def digit5_cnn(input_shape: Sequence[int], num_classes: int, norm: str) -> SplitModel:
    """KD3A's Digit-Five CNN as in PFLlib: three 5x5 convolutions (64, 64, 128) with BatchNorm and
    ReLU, 3x3/2 max-pools after the first two, FC 3072 (BatchNorm, ReLU, dropout 0.5), FC 2048
    (BatchNorm, ReLU), linear classifier. The FC input is 8192 on 3x32x32 images (PFLlib's fixed
    value), computed from the input here; PFLlib fixes 10 classes, the dataset's count is used."""
    if len(input_shape) != 3:
        raise ValueError(f"Digit5CNN needs image input [C, H, W], got {list(input_shape)}")
    encoder = nn.Sequential(
        nn.Conv2d(input_shape[0], 64, 5, padding=2), norm_layer(norm, 64), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1),
        nn.Conv2d(64, 64, 5, padding=2), norm_layer(norm, 64), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1),
        nn.Conv2d(64, 128, 5, padding=2), norm_layer(norm, 128), nn.ReLU(),
        nn.Flatten(),
    )
    dim = _feature_dim(encoder, input_shape)
    body = nn.Sequential(
        *encoder,
        nn.Linear(dim, 3072), norm_layer_1d(norm, 3072), nn.ReLU(), dropout(0.5, norm),
        nn.Linear(3072, 2048), norm_layer_1d(norm, 2048), nn.ReLU(),
    )
    return SplitModel(body, nn.Linear(2048, num_classes))


register_with_groupnorm_variant("Digit5CNN", digit5_cnn)
