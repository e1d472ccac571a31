"""A model whose parameters are views into one flat vector.

The simulator keeps one working ``nn.Module`` and moves client models in and out of it as
flat vectors: loading a model is one ``copy_``, an SGD step is one ``add_`` over every
parameter, and per-client state (control variates, previous updates, personal models) is a
plain 1-D tensor of the same layout. Float buffers (BatchNorm statistics) follow the
parameters in the vector so that they are aggregated with the model; integer buffers
(``num_batches_tracked``) stay in the module and are never aggregated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn
from torch.func import functional_call

#: module types whose parameters and buffers are "normalisation layers" (FedBN keeps them local)
NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm)


@dataclass(frozen=True)
class Segment:
    """Where one named tensor of the model lives inside the flat vector."""

    name: str
    start: int
    stop: int
    shape: tuple[int, ...]
    is_param: bool
    in_head: bool
    in_norm: bool = False
    in_batchnorm: bool = False


class FlatModel:
    """Rebinds ``module``'s parameters and float buffers as views of ``self.vector``.

    ``vector[:num_params]`` are the trainable parameters, ``vector[num_params:]`` the float
    buffers; ``grad`` (length ``num_params``) receives the gradients through views bound as
    ``p.grad``, so ``zero_grad`` is a single ``zero_``.
    """

    def __init__(self, module: nn.Module, device: torch.device | str = "cpu"):
        self.module = module.to(device)
        self.device = torch.device(device)
        params = list(self.module.named_parameters())
        buffers = [(n, b) for n, b in self.module.named_buffers() if b.is_floating_point()]
        head_names = self._head_names()
        norm_names = self._names_in(NORM_LAYERS)
        batchnorm_names = self._names_in((nn.modules.batchnorm._BatchNorm,))
        self.num_params = sum(p.numel() for _, p in params)
        self.num_total = self.num_params + sum(b.numel() for _, b in buffers)
        dtype = params[0][1].dtype if params else torch.float32
        self.vector = torch.empty(self.num_total, dtype=dtype, device=self.device)
        self.grad = torch.zeros(self.num_params, dtype=dtype, device=self.device)
        segments: list[Segment] = []
        offset = 0
        for name, param in params:
            stop = offset + param.numel()
            self.vector[offset:stop].copy_(param.detach().reshape(-1))
            param.data = self.vector[offset:stop].view_as(param)
            param.grad = self.grad[offset:stop].view_as(param)
            segments.append(Segment(name, offset, stop, tuple(param.shape), True, name in head_names, name in norm_names,
                                    name in batchnorm_names))
            offset = stop
        for name, buffer in buffers:
            stop = offset + buffer.numel()
            self.vector[offset:stop].copy_(buffer.detach().reshape(-1))
            self._rebind_buffer(name, self.vector[offset:stop].view_as(buffer))
            segments.append(Segment(name, offset, stop, tuple(buffer.shape), False, name in head_names, name in norm_names,
                                    name in batchnorm_names))
            offset = stop
        self.segments: tuple[Segment, ...] = tuple(segments)

    def _head_names(self) -> set[str]:
        head = getattr(self.module, "head", None)
        if not isinstance(head, nn.Module):
            return set()
        return {f"head.{n}" for n, _ in head.named_parameters()} | {f"head.{n}" for n, _ in head.named_buffers()}

    def _names_in(self, types: tuple[type, ...]) -> set[str]:
        """Qualified names of the parameters and buffers of the submodules of ``types``."""
        names = set()
        for prefix, sub in self.module.named_modules():
            if isinstance(sub, types):
                dot = f"{prefix}." if prefix else ""
                names |= {dot + n for n, _ in sub.named_parameters(recurse=False)}
                names |= {dot + n for n, _ in sub.named_buffers(recurse=False)}
        return names

    def _rebind_buffer(self, qualified: str, view: torch.Tensor) -> None:
        owner_name, _, attr = qualified.rpartition(".")
        owner = self.module.get_submodule(owner_name) if owner_name else self.module
        owner._buffers[attr] = view

    @property
    def params(self) -> torch.Tensor:
        """The trainable part of the vector (a view)."""
        return self.vector[: self.num_params]

    def load(self, vector: torch.Tensor) -> None:
        self.vector.copy_(vector)

    def snapshot(self) -> torch.Tensor:
        """A detached copy of the whole vector (parameters and float buffers)."""
        return self.vector.detach().clone()

    def zero_grad(self) -> None:
        self.grad.zero_()

    def checkpoint_state(self) -> dict[str, torch.Tensor | dict[str, torch.Tensor]]:
        """What a checkpoint keeps (runner/checkpoint.py): the vector (parameters and float
        buffers) and the integer buffers (BatchNorm's batch counts), which are not in it."""
        ints = {n: b.detach().clone() for n, b in self.module.named_buffers() if not b.is_floating_point()}
        return {"vector": self.vector.detach().clone(), "int_buffers": ints}

    def load_checkpoint_state(self, state: dict) -> None:
        self.vector.copy_(state["vector"])
        buffers = dict(self.module.named_buffers())
        for name, value in state["int_buffers"].items():
            buffers[name].copy_(value)

    def head_mask(self) -> torch.Tensor:
        """Boolean mask over the vector, True on the classifier head (``module.head``)."""
        return self.mask(lambda seg: seg.in_head)

    def mask(self, keep) -> torch.Tensor:
        """Boolean mask over the vector, True on the segments for which ``keep(segment)`` holds."""
        mask = torch.zeros(self.num_total, dtype=torch.bool, device=self.device)
        for seg in self.segments:
            if keep(seg):
                mask[seg.start : seg.stop] = True
        return mask

    def shared_mask(self, parts: str | Sequence[str]) -> torch.Tensor | None:
        """The entries an algorithm uploads and aggregates; None when that is the whole vector.

        ``parts``: ``"all"``, ``"body"``, ``"head"``, ``"no_norm"`` (everything but normalisation
        layers' parameters and statistics, FedBN), ``"no_batchnorm"`` (BatchNorm layers only), or a sequence of parameter-name prefixes
        (named groups, e.g. ``("body.0.", "head.")``)."""
        if parts == "all":
            return None
        rules = {
            "body": lambda seg: not seg.in_head,
            "head": lambda seg: seg.in_head,
            "no_norm": lambda seg: not seg.in_norm,
            "no_batchnorm": lambda seg: not seg.in_batchnorm,
        }
        if isinstance(parts, str):
            if parts not in rules:
                raise ValueError(f"unknown shared part {parts!r}; use all, body, head, no_norm, no_batchnorm or name prefixes")
            rule = rules[parts]
        else:
            prefixes = tuple(parts)
            rule = lambda seg: seg.name.startswith(prefixes)  # noqa: E731
        mask = self.mask(rule)
        return None if bool(mask.all()) else mask

    @property
    def net(self) -> "Net":
        """The working model as a loss hook sees it (features, logits, other models' outputs)."""
        return Net(self.module, self)

    def param_segments(self) -> list[Segment]:
        return [seg for seg in self.segments if seg.is_param]

    def unflatten(self, vector: torch.Tensor, params_only: bool = True) -> dict[str, torch.Tensor]:
        """Named views of ``vector`` (possibly batched on a leading axis) in the module's shapes."""
        lead = vector.shape[:-1]
        return {
            seg.name: vector[..., seg.start : seg.stop].reshape(*lead, *seg.shape)
            for seg in self.segments
            if seg.is_param or not params_only
        }


class Net:
    """The model as a loss hook sees it: ``net(x)`` logits, ``net.features(x)``, ``net.head(f)``,
    and ``net.at(vector)`` another model of the same architecture (the global model, the client's
    previous model) evaluated through ``torch.func.functional_call`` on a flat vector, so no
    module is ever copied.

    ``params`` (named tensors) makes the net functional: the batched engine passes each client's
    vmapped parameter views, so the same loss hook runs under ``torch.func.vmap``."""

    def __init__(self, module: nn.Module, flat: FlatModel, params: dict[str, torch.Tensor] | None = None):
        self.module = module
        self.flat = flat
        self.params = params

    def part(self, sub: str, *inputs: torch.Tensor) -> torch.Tensor:
        """Submodule ``sub`` of the model (``""`` = the whole model) applied to ``inputs`` (several
        for a submodule that takes them: GPFL's valve gets the features and a condition)."""
        target = self.module if not sub else getattr(self.module, sub)
        if self.params is None:
            return target(*inputs)
        if not sub:
            return functional_call(target, self.params, inputs)
        prefix = f"{sub}."
        named = {k[len(prefix):]: v for k, v in self.params.items() if k.startswith(prefix)}
        return functional_call(target, named, inputs)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.part("", x)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The body's output (``module.body``): the representation the head classifies."""
        return self.part("body", x)

    def head(self, features: torch.Tensor) -> torch.Tensor:
        return self.part("head", features)

    def at(self, vector: torch.Tensor) -> "Net":
        """The same architecture with the parameters (and float buffers) of the flat ``vector``.

        Buffers are passed as copies: a BatchNorm layer in train mode updates its running
        statistics in place, which must never write into a vector the server sent."""
        named = {}
        for seg in self.flat.segments:
            if seg.start >= vector.shape[-1]:
                continue
            view = vector[..., seg.start : seg.stop].reshape(*vector.shape[:-1], *seg.shape)
            named[seg.name] = view if seg.is_param else view.clone()
        return Net(self.module, self.flat, named)
