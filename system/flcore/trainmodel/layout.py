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

import contextlib
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

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


# ---------------------------------------------------------------------------- the batched step's convolutions
#: ``--batched_conv`` choices: how the batched engine's vmapped step convolves
BATCHED_CONVS = ("grouped", "unfold")


def _pair(value: Any) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)  # type: ignore[return-value]


def unfolded_conv2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> torch.Tensor | None:
    """``F.conv2d`` as unfold (im2col) and one matrix product ``W[O, C·kh·kw] @ cols[C·kh·kw, B·L]``;
    None where that does not apply (groups, string padding, an unbatched input), so the caller
    convolves as usual. Under ``vmap`` over clients the product becomes one batched matrix product
    per layer, and autograd's weight gradient one more, where vmap's own rule turns the clients
    into the groups of a grouped convolution. Equal to ``F.conv2d`` up to float rounding."""
    if groups != 1 or isinstance(padding, str) or input.dim() != 4:
        return None
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    batch, _, height, width = input.shape
    out_channels, _, kh, kw = weight.shape
    out_h = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = F.unfold(input, (kh, kw), dilation=(dh, dw), padding=(ph, pw), stride=(sh, sw))  # [B, C·kh·kw, L]
    cols = cols.transpose(0, 1).reshape(cols.shape[1], batch * out_h * out_w)
    out = (weight.reshape(out_channels, -1) @ cols).view(out_channels, batch, out_h, out_w).transpose(0, 1)
    return out if bias is None else out + bias.view(1, out_channels, 1, 1)


class UnfoldedConvolutions(TorchFunctionMode):
    """Inside the block, on this thread, 2-d convolutions run as :func:`unfolded_conv2d`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.conv2d:  # (F.conv2d is the same function); nested calls bypass the mode
            out = unfolded_conv2d(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def batched_convolutions(kind: str) -> contextlib.AbstractContextManager:
    """The context the batched step convolves in: ``grouped`` (vmap's own rule) or ``unfold``."""
    if kind not in BATCHED_CONVS:
        raise ValueError(f"unknown batched convolution {kind!r}")
    return UnfoldedConvolutions() if kind == "unfold" else contextlib.nullcontext()
