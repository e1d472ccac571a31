"""Residual networks (He et al., CVPR 2016) under PFLlib's names ``ResNet10``, ``ResNet18``, ``ResNet34``.

PFLlib builds ``ResNet18``/``ResNet34`` with ``torchvision.models.resnet18/34(num_classes=...)`` and
``ResNet10`` with its own ``resnet10`` (torchvision's layout with one basic block per stage and
BatchNorm *without running statistics*, ``track_running_stats=False``). torchvision does not
import on every machine, so the layout is defined here: a 7x7/2 stem convolution with a 3x3/2
max-pool (the ImageNet stem PFLlib also uses on 32x32 CIFAR images), four stages of basic blocks
(64, 128, 256, 512 channels; stride 2 from the second stage, with a 1x1 projection shortcut),
global average pooling and the linear classifier as ``head``. The parameter counts are
torchvision's (11,689,512 for ResNet18 and 21,797,672 for ResNet34 with 1,000 classes; tested).

Differences, each deliberate:

* The stem takes the dataset's channel count (torchvision's is fixed to 3), so 1x28x28 MNIST works.
* ``ResNet10`` keeps PFLlib's BatchNorm without running statistics: it normalises with the
  statistics of the batch being evaluated as well (evaluation batches of 128 here).
* ``ResNet10-GN``/``ResNet18-GN``/``ResNet34-GN`` replace every BatchNorm with GroupNorm
  (:mod:`flcore.trainmodel.norms`), the same parameter count without buffers, so the batched
  engine can train them.
* Initialisation is torchvision's (Kaiming normal, fan-out, for convolutions; norm weights 1 and
  biases 0; PyTorch's default for the classifier).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from flcore.trainmodel.models import SplitModel
from flcore.trainmodel.norms import norm_layer, register_with_groupnorm_variant

STAGE_WIDTHS = (64, 128, 256, 512)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a shortcut; a 1x1 projection when the shape changes."""

    def __init__(self, in_channels: int, channels: int, stride: int, norm: str):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = norm_layer(norm, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = norm_layer(norm, channels)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False), norm_layer(norm, channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


def resnet(input_shape: Sequence[int], num_classes: int, blocks_per_stage: Sequence[int], norm: str) -> SplitModel:
    if len(input_shape) != 3:
        raise ValueError(f"ResNet needs image input [C, H, W], got {list(input_shape)}")
    layers: list[nn.Module] = [
        nn.Conv2d(input_shape[0], STAGE_WIDTHS[0], 7, stride=2, padding=3, bias=False),
        norm_layer(norm, STAGE_WIDTHS[0]), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1),
    ]
    in_channels = STAGE_WIDTHS[0]
    for stage, (width, count) in enumerate(zip(STAGE_WIDTHS, blocks_per_stage)):
        for index in range(count):
            stride = 2 if stage > 0 and index == 0 else 1
            layers.append(BasicBlock(in_channels, width, stride, norm))
            in_channels = width
    body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
    for module in body.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    return SplitModel(body, nn.Linear(in_channels, num_classes))


#: -m name -> (basic blocks per stage, normalisation); each also registers a "<name>-GN" variant
RESNETS = {
    "ResNet10": ((1, 1, 1, 1), "bn-batchstats"),  # PFLlib's resnet10
    "ResNet18": ((2, 2, 2, 2), "bn"),  # torchvision's resnet18
    "ResNet34": ((3, 4, 6, 3), "bn"),  # torchvision's resnet34
}
for _name, (_blocks, _norm) in RESNETS.items():
    register_with_groupnorm_variant(
        _name, lambda shape, classes, norm, blocks=_blocks: resnet(shape, classes, blocks, norm), norm=_norm
    )
