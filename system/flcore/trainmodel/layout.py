"""Channels-last convolutions (``--conv_layout``): the CPU's fast path for the platform's CNNs.

oneDNN, PyTorch's CPU convolution library, is much faster when a convolution's weight is stored
channels-last (NHWC). Measured on the project's 2-core Xeon with the FedAvg CNN (torch 2.13 CPU):

=========================  ==================  ==================
                           MNIST 1x28x28       CIFAR 3x32x32
=========================  ==================  ==================
training, batch 10, 1 thr  1,900 -> 2,670 /s   1,390 -> 1,780 /s
evaluation, batch 128      4,000 -> 11,800 /s  3,500 -> 6,600 /s
=========================  ==================  ==================

The platform's parameters are views of one flat vector in the usual (NCHW) order, which every
algorithm, the state store and the result files rely on. So the weight is not stored
channels-last: :class:`ChannelsLastConv2d` converts it at each forward pass (a copy of the
convolution weights, a few microseconds) and autograd converts the gradient back. Outputs
differ from the NCHW path only by float rounding (about 1e-7). Tensors with a single input
channel count as contiguous in both layouts, so the conversion uses ``Tensor.to(memory_format=)``,
which sets channels-last strides even then (``contiguous(memory_format=)`` would not).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

#: ``--conv_layout`` choices
CONV_LAYOUTS = ("auto", "nchw", "channels_last")


_plain = threading.local()


@contextmanager
def plain_convolutions() -> Iterator[None]:
    """Convolve in the usual layout inside the block, on this thread (``torch.func.vmap`` has no
    channels-last layout for its batched weights; the batched engine trains in this block)."""
    before = getattr(_plain, "on", False)
    _plain.on = True
    try:
        yield
    finally:
        _plain.on = before


class ChannelsLastConv2d(nn.Conv2d):
    """``nn.Conv2d`` that convolves with a channels-last copy of its weight."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if getattr(_plain, "on", False):
            return super().forward(input)
        return self._conv_forward(input, self.weight.to(memory_format=torch.channels_last), self.bias)


def resolve_conv_layout(layout: str, device: torch.device) -> str:
    """``auto``: channels-last on the CPU (measured faster above); NCHW elsewhere (cuDNN's choice
    depends on the GPU and dtype, and the batched engine vmaps the convolutions there)."""
    if layout == "auto":
        return "channels_last" if device.type == "cpu" else "nchw"
    return layout


def use_channels_last(module: nn.Module) -> int:
    """Make every plain ``nn.Conv2d`` of ``module`` a :class:`ChannelsLastConv2d`; returns how many.

    Only the class changes (same parameters, names and state dict), so saved models load into the
    usual modules."""
    count = 0
    for sub in module.modules():
        if type(sub) is nn.Conv2d:
            sub.__class__ = ChannelsLastConv2d
            count += 1
    return count
