"""ImageNet-style networks under PFLlib's names ``AlexNet``, ``GoogleNet`` and ``MobileNet`` (V2).

PFLlib takes these from torchvision (``googlenet(aux_logits=False)``) or from copies of
torchvision's code whose last classifier layer is moved into ``fc`` (``alexnet``, ``mobilenet_v2``).
torchvision does not import on every machine, so the layouts are defined here from the papers and
torchvision's documented configuration, with torchvision's parameter counts for 1,000 classes
(tested): AlexNet 61,100,840, GoogLeNet 6,624,904, MobileNetV2 3,504,872. ``head`` is the final
linear classifier (PFLlib's ``fc``); everything before it is ``body``.

Deliberate differences:

* The first convolution takes the dataset's channel count (torchvision's takes 3).
* GoogLeNet has no auxiliary classifiers (PFLlib passes ``aux_logits=False``) and, like torchvision,
  uses 3x3 convolutions in the "5x5" branch of its inception modules.
* ``GoogleNet-GN`` and ``MobileNet-GN`` replace BatchNorm with GroupNorm and drop the dropout
  before the classifier (:mod:`flcore.trainmodel.norms`), so that the batched engine trains them;
  the parameter counts are unchanged. AlexNet has neither BatchNorm nor a variant: its dropout
  keeps it in the sequential and threaded engines.
* AlexNet's strides need images of at least 63x63 (a clear error on 32x32 CIFAR images, where
  PFLlib's AlexNet fails too); GoogLeNet and MobileNetV2 run on 28x28 and up.
"""
from __future__ import annotations

from argparse import Namespace
from typing import Sequence

import torch
from torch import nn

from flcore.registry import register_model
from flcore.trainmodel.models import SplitModel
from flcore.trainmodel.norms import dropout, norm_layer, register_with_groupnorm_variant


def _image_channels(name: str, input_shape: Sequence[int], min_size: int = 1) -> int:
    if len(input_shape) != 3:
        raise ValueError(f"{name} needs image input [C, H, W], got {list(input_shape)}")
    if min(input_shape[1:]) < min_size:
        raise ValueError(f"{name} needs images of at least {min_size}x{min_size}, got {list(input_shape)}")
    return int(input_shape[0])


# ---------------------------------------------------------------------------------------- AlexNet
#: smallest image AlexNet's strides leave a 1x1 map for: conv 11/4 (p2) -> pool 3/2 -> pool 3/2 -> pool 3/2
ALEXNET_MIN_SIZE = 63


@register_model("AlexNet")
def alexnet(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """Krizhevsky's AlexNet in the one-GPU form of "One weird trick" (torchvision/PFLlib): five
    convolutions (64, 192, 384, 256, 256), a 6x6 adaptive average pool, two dropout + FC 4096."""
    channels = _image_channels("AlexNet", input_shape, ALEXNET_MIN_SIZE)
    body = nn.Sequential(
        nn.Conv2d(channels, 64, 11, stride=4, padding=2), nn.ReLU(), nn.MaxPool2d(3, stride=2),
        nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, stride=2),
        nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
        nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, stride=2),
        nn.AdaptiveAvgPool2d(6), nn.Flatten(),
        nn.Dropout(0.5), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(),
        nn.Dropout(0.5), nn.Linear(4096, 4096), nn.ReLU(),
    )
    return SplitModel(body, nn.Linear(4096, num_classes))


# -------------------------------------------------------------------------------------- GoogLeNet
class ConvNormReLU(nn.Sequential):
    """Convolution without bias, normalisation, then ``activation`` (ReLU unless given)."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, norm: str, stride: int = 1,
                 groups: int = 1, eps: float = 1e-5, activation: type[nn.Module] = nn.ReLU):
        super().__init__(
            nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=(kernel - 1) // 2,
                      groups=groups, bias=False),
            norm_layer(norm, out_channels, eps=eps),
            activation(),
        )


class Inception(nn.Module):
    """Four parallel branches concatenated on the channel axis: 1x1; 1x1 -> 3x3; 1x1 -> "5x5"
    (3x3, as torchvision); 3x3 max-pool -> 1x1."""

    def __init__(self, in_channels: int, c1: int, c3_reduce: int, c3: int, c5_reduce: int, c5: int,
                 pool_proj: int, norm: str):
        super().__init__()

        def conv(cin: int, cout: int, kernel: int) -> nn.Module:
            return ConvNormReLU(cin, cout, kernel, norm, eps=1e-3)  # torchvision's BatchNorm eps

        self.branch1 = conv(in_channels, c1, 1)
        self.branch2 = nn.Sequential(conv(in_channels, c3_reduce, 1), conv(c3_reduce, c3, 3))
        self.branch3 = nn.Sequential(conv(in_channels, c5_reduce, 1), conv(c5_reduce, c5, 3))
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1, ceil_mode=True), conv(in_channels, pool_proj, 1))
        self.out_channels = c1 + c3 + c5 + pool_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


#: Szegedy et al. 2015, Table 1: (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj); "M" = max-pool
GOOGLENET_STAGES: tuple = (
    (64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64), "M",
    (192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
    (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128), "M2",
    (256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128),
)


def googlenet(input_shape: Sequence[int], num_classes: int, norm: str) -> SplitModel:
    """GoogLeNet (Szegedy et al., CVPR 2015) as torchvision's ``googlenet(aux_logits=False)``."""
    channels = _image_channels("GoogleNet", input_shape)

    def conv(cin: int, cout: int, kernel: int, stride: int = 1) -> nn.Module:
        return ConvNormReLU(cin, cout, kernel, norm, stride=stride, eps=1e-3)

    layers: list[nn.Module] = [
        conv(channels, 64, 7, stride=2), nn.MaxPool2d(3, stride=2, ceil_mode=True),
        conv(64, 64, 1), conv(64, 192, 3), nn.MaxPool2d(3, stride=2, ceil_mode=True),
    ]
    width = 192
    for stage in GOOGLENET_STAGES:
        if stage == "M":
            layers.append(nn.MaxPool2d(3, stride=2, ceil_mode=True))
        elif stage == "M2":
            layers.append(nn.MaxPool2d(2, stride=2, ceil_mode=True))
        else:
            layers.append(Inception(width, *stage, norm=norm))
            width = layers[-1].out_channels
    body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), dropout(0.2, norm))
    head = nn.Linear(width, num_classes)
    # torchvision's initialisation: truncated normal (std 0.01) for convolutions and the classifier
    for module in [*body.modules(), head]:
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.trunc_normal_(module.weight, std=0.01, a=-2, b=2)
    return SplitModel(body, head)


register_with_groupnorm_variant("GoogleNet", googlenet)


# ------------------------------------------------------------------------------------ MobileNetV2
def _divisible_by_8(value: float) -> int:
    """MobileNet's channel rounding: the nearest multiple of 8, never 10% below ``value``."""
    rounded = max(8, int(value + 4) // 8 * 8)
    return rounded + 8 if rounded < 0.9 * value else rounded


class InvertedResidual(nn.Module):
    """1x1 expansion (ReLU6), 3x3 depthwise (ReLU6), linear 1x1 projection; a shortcut when the
    shape is kept."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, expansion: int, norm: str):
        super().__init__()
        hidden = in_channels * expansion
        layers: list[nn.Module] = []
        if expansion != 1:
            layers.append(ConvNormReLU(in_channels, hidden, 1, norm, activation=nn.ReLU6))
        layers += [
            ConvNormReLU(hidden, hidden, 3, norm, stride=stride, groups=hidden, activation=nn.ReLU6),
            nn.Conv2d(hidden, out_channels, 1, bias=False), norm_layer(norm, out_channels),
        ]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


#: Sandler et al. 2018, Table 2: (expansion t, channels c, repeats n, stride s)
MOBILENET_V2_STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def mobilenet_v2(input_shape: Sequence[int], num_classes: int, norm: str) -> SplitModel:
    """MobileNetV2 (Sandler et al., CVPR 2018), width 1.0, dropout 0.2 before the classifier."""
    channels = _image_channels("MobileNet", input_shape)
    width = _divisible_by_8(32)
    layers: list[nn.Module] = [ConvNormReLU(channels, width, 3, norm, stride=2, activation=nn.ReLU6)]
    for expansion, out_channels, repeats, stride in MOBILENET_V2_STAGES:
        for index in range(repeats):
            layers.append(InvertedResidual(width, _divisible_by_8(out_channels), stride if index == 0 else 1, expansion, norm))
            width = _divisible_by_8(out_channels)
    last = _divisible_by_8(1280)
    layers.append(ConvNormReLU(width, last, 1, norm, activation=nn.ReLU6))
    body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), dropout(0.2, norm))
    head = nn.Linear(last, num_classes)
    # torchvision's initialisation
    for module in body.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out")
    nn.init.normal_(head.weight, 0, 0.01)
    nn.init.zeros_(head.bias)
    return SplitModel(body, head)


register_with_groupnorm_variant("MobileNet", mobilenet_v2, aliases=("MobileNetV2",))
