"""Whether a built model can take a dataset's inputs, found before any training.

A model may build for an input shape and still fail on it later: GoogLeNet's strides leave 1x1
maps of 28x28 and 32x32 images, where ``GoogleNet-GN``'s GroupNorm layers of one channel per
group get one value per sample to normalise: their output is a constant (the layer's bias, so the
branch behind it learns nothing from the input), and a batch of one sample (a client's last
evaluation batch, say) stops the run with ``Expected more than 1 value per channel``.
:func:`dry_run` passes one sample through the model in evaluation and in training mode and raises
``ValueError`` with one readable line instead, before any training.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def _single_value_groups(name: str):
    """A forward pre-hook refusing a GroupNorm input whose groups hold one value per sample."""

    def hook(layer: nn.GroupNorm, inputs: tuple[torch.Tensor, ...]) -> None:
        x = inputs[0]
        per_group = x.shape[1] // layer.num_groups * math.prod(x.shape[2:])
        if per_group <= 1:
            raise ValueError(
                f"its GroupNorm layer {name} gets feature maps of {list(x.shape[1:])} per sample, one value per "
                f"group, which normalises to a constant; use larger inputs or another model"
            )

    return hook


def dry_run(module: nn.Module, sample: torch.Tensor) -> torch.Tensor:
    """Run one input of ``sample`` through ``module`` in evaluation mode (returned: its output) and
    in training mode, leaving the module's parameters, buffers, mode and the global random state as
    they were. Raises ``ValueError`` (or the layer's ``RuntimeError``) when the model cannot take
    the input. A model with BatchNorm gets two copies of the input: BatchNorm needs two samples in
    a batch by design (and PFLlib's ResNet10 normalises with the batch's statistics in evaluation
    too), while a batch of one is legal for every other layer, so it is checked with one."""
    has_batchnorm = any(isinstance(m, _BatchNorm) for m in module.modules())
    one = torch.cat([sample[:1], sample[:1]]) if has_batchnorm else sample[:1]
    buffers = {name: b.clone() for name, b in module.named_buffers()}  # BatchNorm's running statistics
    hooks = [m.register_forward_pre_hook(_single_value_groups(name))
             for name, m in module.named_modules() if isinstance(m, nn.GroupNorm)]
    was_training = module.training
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():  # dropout draws no number of the run's
            module.eval()
            out = module(one)[:1]
            module.train()
            module(one)
    finally:
        for hook in hooks:
            hook.remove()
        with torch.no_grad():
            for name, b in module.named_buffers():
                b.copy_(buffers[name])
        module.train(was_training)
    return out
