"""Models whose hidden widths change: the layer chain of a feed-forward model, the same model built
with other widths, and a model's units gathered by an assignment (FedMA, ``servers/serverfedma.py``).

A *chain model* is a :class:`~flcore.trainmodel.models.SplitModel` whose ``body`` is an
``nn.Sequential`` (or ``nn.Identity``) of ``Linear``, ``Conv2d`` (groups 1), ``BatchNorm1d/2d``,
``ReLU``, ``MaxPool2d``, ``AvgPool2d``, ``Flatten``, ``Dropout``/``Dropout2d`` and ``Identity``, and
whose ``head`` is one ``Linear``: the registry's MLR, DNN, MLP (2NN), CNN (FedAvgCNN), CNN-BN and
LeNet. Each ``Linear``/``Conv2d`` of the body is a *hidden layer* whose output units (neurons,
channels) may be permuted, matched and grown; a BatchNorm right after it belongs to its units. A
``Linear`` after ``Flatten`` sees each channel of the layer below as ``spatial`` consecutive inputs
(PyTorch flattens C, H, W in that order).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn.utils import skip_init

#: body modules a chain model may hold besides its hidden layers and their BatchNorm
NEUTRAL = (nn.ReLU, nn.MaxPool2d, nn.AvgPool2d, nn.Flatten, nn.Dropout, nn.Dropout2d, nn.Identity)


class NotAChain(ValueError):
    """The model is not a chain of layers whose units can be matched."""


@dataclass(frozen=True)
class HiddenLayer:
    """One matchable layer: its parameter names, width, and how its inputs see the layer below."""

    weight: str
    bias: str | None
    norm: tuple[str, ...]  # the BatchNorm's per-unit tensors (weight, bias, running_mean, running_var)
    width: int
    spatial: int  # inputs per unit of the layer below (1, or H*W for a Linear after Flatten)


@dataclass(frozen=True)
class Chain:
    """The hidden layers of a chain model, bottom-up, and its head."""

    hidden: tuple[HiddenLayer, ...]
    head_weight: str
    head_bias: str | None
    head_spatial: int

    @property
    def widths(self) -> list[int]:
        return [layer.width for layer in self.hidden]


def chain_of(module: nn.Module) -> Chain:
    """The layer chain of ``module``; :class:`NotAChain` says what does not fit."""
    body, head = getattr(module, "body", None), getattr(module, "head", None)
    if not isinstance(head, nn.Linear):
        raise NotAChain("its classifier head is not one Linear layer")
    if isinstance(body, NEUTRAL):  # MLR: the head on the (flattened) inputs
        children: list[tuple[str, nn.Module]] = []
    elif isinstance(body, nn.Sequential):
        children = list(body.named_children())
    else:
        raise NotAChain("its body is not a plain sequence of layers")
    hidden: list[HiddenLayer] = []
    pending: dict | None = None  # the layer being read: its BatchNorm may follow
    width, flattened_from = None, None  # units of the last hidden layer; channels seen by Flatten

    def close() -> None:
        nonlocal pending
        if pending is not None:
            hidden.append(HiddenLayer(**pending))
            pending = None

    def spatial_of(layer: nn.Module, inputs: int) -> int:
        if width is None:
            return 1
        if isinstance(layer, nn.Linear) and flattened_from is not None:
            if inputs % width:
                raise NotAChain(f"{inputs} inputs of a Linear layer do not split into {width} channels")
            return inputs // width
        if inputs != width:
            raise NotAChain(f"a layer takes {inputs} inputs from a layer of {width} units")
        return 1

    for name, child in children:
        if isinstance(child, (nn.Linear, nn.Conv2d)):
            if isinstance(child, nn.Conv2d) and child.groups != 1:
                raise NotAChain("it has grouped convolutions")
            close()
            inputs = child.in_features if isinstance(child, nn.Linear) else child.in_channels
            spatial = spatial_of(child, inputs)
            outputs = child.out_features if isinstance(child, nn.Linear) else child.out_channels
            pending = dict(weight=f"body.{name}.weight", bias=f"body.{name}.bias" if child.bias is not None else None,
                           norm=(), width=outputs, spatial=spatial)
            width, flattened_from = outputs, None
        elif isinstance(child, (nn.BatchNorm1d, nn.BatchNorm2d)):
            if pending is None or pending["norm"] or not child.affine or not child.track_running_stats:
                raise NotAChain("a BatchNorm layer does not directly follow a Linear/Conv2d layer")
            pending["norm"] = tuple(f"body.{name}.{t}" for t in ("weight", "bias", "running_mean", "running_var"))
        elif isinstance(child, nn.Flatten):
            flattened_from = width
        elif isinstance(child, NEUTRAL):
            continue
        else:
            raise NotAChain(f"its body holds a {type(child).__name__}")
    close()
    head_spatial = spatial_of(head, head.in_features)
    return Chain(tuple(hidden), "head.weight", "head.bias" if head.bias is not None else None, head_spatial)


def with_widths(module: nn.Module, widths: Sequence[int]) -> nn.Module:
    """A copy of the chain model ``module`` whose hidden layers have ``widths`` units (the inputs of
    each layer follow). Resized layers are left uninitialised (no draw from the global RNG): the
    caller sets every value."""
    chain = chain_of(module)
    if len(widths) != len(chain.hidden):
        raise ValueError(f"{len(widths)} widths for {len(chain.hidden)} hidden layers")
    grown = copy.deepcopy(module)
    previous = None
    spatials = [layer.spatial for layer in chain.hidden] + [chain.head_spatial]
    body = grown.body
    children = list(body.named_children()) if isinstance(body, nn.Sequential) else []
    index = -1
    for name, child in children:
        if isinstance(child, (nn.Linear, nn.Conv2d)):
            index += 1
            width = int(widths[index])
            inputs = None if previous is None else previous * spatials[index]
            setattr(body, name, _resized(child, inputs, width))
            previous = width
        elif isinstance(child, (nn.BatchNorm1d, nn.BatchNorm2d)):
            setattr(body, name, type(child)(previous, eps=child.eps, momentum=child.momentum))
    if previous is not None:
        grown.head = _resized(grown.head, previous * spatials[-1], grown.head.out_features)
    return grown


def _resized(layer: nn.Module, inputs: int | None, outputs: int) -> nn.Module:
    # the layer's own class, so what it adds to nn.Linear / nn.Conv2d stays: the CPU's channels-last
    # convolution (layout.py) made FedMA's global-model evaluation 3-4x slower per pooling when lost
    if isinstance(layer, nn.Linear):
        return skip_init(type(layer), layer.in_features if inputs is None else inputs, outputs,
                         bias=layer.bias is not None)
    return skip_init(type(layer), layer.in_channels if inputs is None else inputs, outputs, layer.kernel_size,
                     stride=layer.stride, padding=layer.padding, dilation=layer.dilation, bias=layer.bias is not None)


def input_columns(units: np.ndarray, spatial: int) -> np.ndarray:
    """The input columns (or input channels, ``spatial`` 1) that the units ``units`` of the layer
    below feed: unit c covers columns c*spatial .. c*spatial + spatial - 1."""
    units = np.asarray(units, dtype=np.int64)
    return (units[:, None] * spatial + np.arange(spatial)[None, :]).reshape(-1)


def gather(named: dict[str, torch.Tensor], chain: Chain, assignments: Sequence[np.ndarray]) -> dict[str, torch.Tensor]:
    """A model of the original widths taken from the (wider) model ``named``: unit l of hidden layer
    k is unit ``assignments[k][l]`` of ``named``, and every layer reads its inputs from the units
    chosen below. With identity assignments this is ``named`` itself."""
    out: dict[str, torch.Tensor] = {}
    below = None
    for layer, chosen in zip(chain.hidden, assignments):
        rows = torch.as_tensor(np.asarray(chosen, dtype=np.int64), device=named[layer.weight].device)
        weight = named[layer.weight][rows]
        if below is not None:
            weight = weight[:, _columns(below, layer.spatial, weight.device)]
        out[layer.weight] = weight
        for name in (layer.bias, *layer.norm):
            if name is not None:
                out[name] = named[name][rows]
        below = chosen
    weight = named[chain.head_weight]
    out[chain.head_weight] = weight if below is None else weight[:, _columns(below, chain.head_spatial, weight.device)]
    if chain.head_bias is not None:
        out[chain.head_bias] = named[chain.head_bias]
    return out


def spread_inputs(weight: torch.Tensor, below: np.ndarray | None, spatial: int, global_units: int) -> torch.Tensor:
    """``weight`` (units x inputs [x k x k]) of a client's layer with its inputs moved to the global
    units they were matched to (``below[l]`` for the client's unit l of the layer below); inputs from
    global units the client does not hold are zero: what the client's layer computes, as a function
    of the global layer below."""
    if below is None:
        return weight
    out = weight.new_zeros((weight.shape[0], global_units * spatial, *weight.shape[2:]))
    out[:, _columns(below, spatial, weight.device)] = weight
    return out


def _columns(units: np.ndarray, spatial: int, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(input_columns(units, spatial), device=device)
