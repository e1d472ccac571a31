"""``VGG9``: the VGG-style network of FedMA's CIFAR-10 experiments (Wang et al., ICLR 2020, the
VGG-9 of its appendix; ``moderate-cnn`` in the authors' code, IBM/FedMA).

Six 3x3 convolutions with padding 1 and ReLU in three blocks, (32, 64), (128, 128), (256, 256), each
block ending in a 2x2 max-pool (the second then a channel dropout of 0.05), a dropout of 0.1, FC 512,
ReLU, FC 512, ReLU, a dropout of 0.1 and the linear classifier (``head``); no normalisation layers.
On 3x32x32 CIFAR-10 images with 10 classes it has 3,491,530 parameters (counted by hand in
``tests/models/test_parameter_counts.py``); the FC input is computed from the input (4096 on 32x32,
2304 on 28x28). It is a chain model (``widths.py``), so FedMA matches its channels and neurons layer
by layer.

Deliberate differences: the first convolution takes the dataset's channel count (the paper's 3) and
the classifier the dataset's class count; PyTorch's default initialisation (the authors'
``moderate-cnn`` keeps it too). ``vgg9(..., widths=...)`` builds the same architecture at other
widths (the tests' small copies); ``-m VGG9`` is always the paper's.
"""
from __future__ import annotations

from argparse import Namespace
from typing import Sequence

from torch import nn

from flcore.registry import register_model
from flcore.trainmodel.models import SplitModel, _feature_dim

#: the paper's widths: six convolutions, then two FC layers
VGG9_WIDTHS = (32, 64, 128, 128, 256, 256, 512, 512)

#: three 2x2 max-pools leave a 1x1 map of 8x8 images
VGG9_MIN_SIZE = 8


@register_model("VGG9")
def vgg9(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None,
         widths: Sequence[int] = VGG9_WIDTHS) -> SplitModel:
    """FedMA's VGG-9 (see the module docstring), with ``widths`` units in its eight hidden layers."""
    if len(input_shape) != 3 or min(input_shape[1:]) < VGG9_MIN_SIZE:
        raise ValueError(f"VGG9 needs image input [C, H, W] of at least {VGG9_MIN_SIZE}x{VGG9_MIN_SIZE}, "
                         f"got {list(input_shape)}")
    if len(widths) != len(VGG9_WIDTHS):
        raise ValueError(f"VGG9 has {len(VGG9_WIDTHS)} hidden layers, got {len(widths)} widths")
    c1, c2, c3, c4, c5, c6, f1, f2 = (int(w) for w in widths)

    def conv(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU()]

    features = nn.Sequential(
        *conv(input_shape[0], c1), *conv(c1, c2), nn.MaxPool2d(2),
        *conv(c2, c3), *conv(c3, c4), nn.MaxPool2d(2), nn.Dropout2d(0.05),
        *conv(c4, c5), *conv(c5, c6), nn.MaxPool2d(2),
        nn.Flatten(),
    )
    dim = _feature_dim(features, input_shape)
    body = nn.Sequential(
        *features, nn.Dropout(0.1),
        nn.Linear(dim, f1), nn.ReLU(), nn.Linear(f1, f2), nn.ReLU(), nn.Dropout(0.1),
    )
    return SplitModel(body, nn.Linear(f2, num_classes))
