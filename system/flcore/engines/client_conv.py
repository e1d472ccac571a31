"""Per-client convolutions for the batched engine's vmapped step (``--batched_conv``).

Under ``torch.func.vmap`` over K clients, a 2-d convolution whose input and weight both carry
the client axis becomes one grouped convolution (``groups=K``). cuDNN runs that grouped
convolution for the platform's CNN as a loop over the groups: one kernel per client for the
32-to-64-channel layer's forward pass, input gradient and weight gradient (a kernel profile:
``SB_PROFILE=1 python experiments/gpu_step_runners.py cuda``). Those loops are most of the step.

``unfold`` (opt-in) runs each convolution as a custom autograd function with its own vmap rule:
the K clients' inputs are unfolded (im2col) as one strided view and one copy over all K·N
images, and the products with the K weights are batched matrix products, in the forward pass
and in both gradients (the input gradient is summed back with kh·kw strided adds). Outside
vmap (the one-client tail of a ragged cohort) it is ``F.conv2d`` and
``aten.convolution_backward``, as without this module. Results equal the grouped convolution's
up to float rounding (the products sum in another order; cuDNN's convolutions use TF32 where
``torch.backends.cudnn.allow_tf32`` is on, the default, these products follow
``torch.backends.cuda.matmul``'s setting, fp32 by default).

``grouped_nhwc`` (opt-in) keeps vmap's grouped convolution (the clients as groups) but lays its
input, weight and output gradient out channels-last, through the same custom function and
``aten.convolution_backward`` with ``groups=K``: whether cuDNN then takes all groups in one kernel
is for the GPU to tell (on a CPU oneDNN is no faster with it).

Why the strided view: ATen's im2col (``F.unfold`` / ``F.fold``) launches one kernel per image,
on CUDA as on the CPU, i.e. 500 launches per layer and pass at 50 clients x batch 10, and
written with it the step was several times slower than the grouped convolution. The strided
view is one copy instead. The default stays ``grouped`` until the GPU has measured ``unfold``
and ``grouped_nhwc`` (``PART=unfold bash experiments/gpu_speed.sh``); the figures, and those of
the CPU (where the batched engine is not ``auto``'s choice), are in ``docs/results/performance.md``
("Tried, not kept, and why"; "Where P2's captured step goes").
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

#: ``--batched_conv`` choices (the first is the default)
BATCHED_CONVS = ("grouped", "unfold", "grouped_nhwc")


def _pair(value: Any) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _to_front(tensor: torch.Tensor, dim: int | None, size: int) -> torch.Tensor:
    """``tensor`` with its vmapped axis first (expanded where it had none)."""
    if dim is None:
        return tensor.unsqueeze(0).expand(size, *tensor.shape)
    return tensor.movedim(dim, 0)


def _out_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _unfold(x: torch.Tensor, kernel: tuple[int, int], geometry: tuple) -> tuple[torch.Tensor, int, int]:
    """im2col of ``x`` [K, N, C, H, W] as [K, C·kh·kw, N·Ho·Wo], with Ho and Wo: a strided view of the
    (padded) input and one copy. Not ``F.unfold``: ATen's im2col launches one kernel per image (one per
    client and sample here: 500 a layer for P2), on CUDA as on the CPU."""
    (sh, sw), (ph, pw), (dh, dw) = geometry
    kh, kw = kernel
    k, n, c, height, width = x.shape
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    out_h = _out_size(height, kh, sh, ph, dh)
    out_w = _out_size(width, kw, sw, pw, dw)
    s_k, s_n, s_c, s_h, s_w = x.stride()
    windows = x.as_strided((k, c, kh, kw, n, out_h, out_w),
                           (s_k, s_c, dh * s_h, dw * s_w, s_n, sh * s_h, sw * s_w), x.storage_offset())
    return windows.reshape(k, c * kh * kw, n * out_h * out_w), out_h, out_w


def _fold_add(cols: torch.Tensor, x_shape: torch.Size, kernel: tuple[int, int], geometry: tuple) -> torch.Tensor:
    """The adjoint of :func:`_unfold`: ``cols`` [K, C·kh·kw, N·Ho·Wo] summed back onto [K, N, C, H, W],
    one strided add per kernel position (kh·kw kernels, in a fixed order: deterministic, where
    ``F.fold`` would again be one kernel per image on some builds)."""
    (sh, sw), (ph, pw), (dh, dw) = geometry
    kh, kw = kernel
    k, n, c, height, width = x_shape
    out_h = _out_size(height, kh, sh, ph, dh)
    out_w = _out_size(width, kw, sw, pw, dw)
    parts = cols.view(k, c, kh, kw, n, out_h, out_w).permute(0, 4, 1, 2, 3, 5, 6)  # [K, N, C, kh, kw, Ho, Wo]
    padded = cols.new_zeros(k, n, c, height + 2 * ph, width + 2 * pw)
    for i in range(kh):
        for j in range(kw):
            padded[..., i * dh : i * dh + sh * (out_h - 1) + 1 : sh,
                   j * dw : j * dw + sw * (out_w - 1) + 1 : sw] += parts[:, :, :, i, j]
    return padded[..., ph : ph + height, pw : pw + width]


def _as_rows(grad_out: torch.Tensor) -> torch.Tensor:
    """[K, N, O, Ho, Wo] -> [K, O, N·Ho·Wo], the layout of the products."""
    k, n, o = grad_out.shape[:3]
    return grad_out.transpose(1, 2).reshape(k, o, -1)


def _unfold_conv(x: torch.Tensor, weight: torch.Tensor, geometry: tuple) -> torch.Tensor:
    """[K, N, C, H, W] * [K, O, C, kh, kw] -> [K, N, O, Ho, Wo]: im2col and one batched product."""
    k = x.shape[0]
    cols, out_h, out_w = _unfold(x, tuple(weight.shape[-2:]), geometry)
    out = torch.bmm(weight.reshape(k, weight.shape[1], -1), cols)
    return out.view(k, weight.shape[1], x.shape[1], out_h, out_w).transpose(1, 2)


def _unfold_grads(x: torch.Tensor, weight: torch.Tensor, grad_out: torch.Tensor, geometry: tuple,
                  need_input: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    k, kernel = x.shape[0], tuple(weight.shape[-2:])
    rows = _as_rows(grad_out)                                               # [K, O, N·L]
    cols, _, _ = _unfold(x, kernel, geometry)                               # [K, C·kh·kw, N·L]
    grad_w = torch.bmm(rows, cols.transpose(1, 2)).view_as(weight)
    if not need_input:
        return None, grad_w
    grad_cols = torch.bmm(weight.reshape(k, weight.shape[1], -1).transpose(1, 2), rows)
    return _fold_add(grad_cols, x.shape, kernel, geometry), grad_w


def _as_groups(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[K, N, C, H, W] and [K, O, C, kh, kw] as one grouped convolution's channels-last input
    [N, K·C, H, W] and weight [K·O, C, kh, kw] (vmap's own rule, in the other layout)."""
    k, n, c, height, width = x.shape
    grouped_x = x.transpose(0, 1).reshape(n, k * c, height, width).contiguous(memory_format=torch.channels_last)
    grouped_w = weight.reshape(-1, *weight.shape[2:]).contiguous(memory_format=torch.channels_last)
    return grouped_x, grouped_w


def _nhwc_conv(x: torch.Tensor, weight: torch.Tensor, geometry: tuple) -> torch.Tensor:
    k, n, o = x.shape[0], x.shape[1], weight.shape[1]
    out = F.conv2d(*_as_groups(x, weight), None, *geometry, groups=k)        # [N, K·O, Ho, Wo]
    return out.reshape(n, k, o, *out.shape[-2:]).transpose(0, 1)


def _nhwc_grads(x: torch.Tensor, weight: torch.Tensor, grad_out: torch.Tensor, geometry: tuple,
                need_input: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    k, n = x.shape[:2]
    grouped_x, grouped_w = _as_groups(x, weight)
    grouped_out = grad_out.transpose(0, 1).reshape(n, -1, *grad_out.shape[-2:]).contiguous(
        memory_format=torch.channels_last)
    stride, padding, dilation = geometry
    grad_x, grad_w, _ = torch.ops.aten.convolution_backward(
        grouped_out, grouped_x, grouped_w, None, list(stride), list(padding), list(dilation), False, [0, 0], k,
        [need_input, True, False])
    grad_w = grad_w.reshape(weight.shape)
    return (None if grad_x is None else grad_x.reshape(n, k, *x.shape[2:]).transpose(0, 1)), grad_w


#: the vmap rules of each kind: (convolution, gradients) of all K clients at once
_BATCHED_RULES = {"unfold": (_unfold_conv, _unfold_grads), "grouped_nhwc": (_nhwc_conv, _nhwc_grads)}


class _ConvGrads(torch.autograd.Function):
    """(input gradient or None, weight gradient) of a 2-d convolution without bias."""

    @staticmethod
    def forward(x, weight, grad_out, stride, padding, dilation, need_input, kind):
        grad_x, grad_w, _ = torch.ops.aten.convolution_backward(
            grad_out, x, weight, None, list(stride), list(padding), list(dilation), False, [0, 0], 1,
            [bool(need_input), True, False])
        return (grad_x, grad_w) if need_input else grad_w

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass  # a gradient of the gradient is not needed by the engine's step

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"--batched_conv {'|'.join(_BATCHED_RULES)}: second derivatives of a convolution are not "
                           "supported")

    @staticmethod
    def vmap(info, in_dims, x, weight, grad_out, stride, padding, dilation, need_input, kind):
        k = info.batch_size
        x, weight, grad_out = (_to_front(t, d, k) for t, d in zip((x, weight, grad_out), in_dims[:3]))
        grad_x, grad_w = _BATCHED_RULES[kind][1](x, weight, grad_out, (stride, padding, dilation), need_input)
        return ((grad_x, grad_w), (0, 0)) if need_input else (grad_w, 0)


class _ClientConv2d(torch.autograd.Function):
    """``F.conv2d(x, weight, None, stride, padding, dilation)`` whose vmap rule, and its gradient's,
    are ``kind``'s in :data:`_BATCHED_RULES` instead of vmap's grouped convolution."""

    @staticmethod
    def forward(x, weight, stride, padding, dilation, kind):
        return F.conv2d(x, weight, None, stride, padding, dilation)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, stride, padding, dilation, kind = inputs
        ctx.save_for_backward(x, weight)  # not the columns: recomputed in one kernel, they would hold C·kh·kw x the input
        ctx.geometry = (stride, padding, dilation)
        ctx.kind = kind

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        # under autocast (--precision bf16) the forward convolved in bf16 and the gradient arrives in bf16,
        # while the saved input and weight may be fp32: one dtype for the products (autograd casts the
        # returned gradients back to each input's dtype)
        x, weight = x.to(grad_out.dtype), weight.to(grad_out.dtype)
        need_input = bool(ctx.needs_input_grad[0])
        grads = _ConvGrads.apply(x, weight, grad_out, *ctx.geometry, need_input, ctx.kind)
        grad_x, grad_w = grads if need_input else (None, grads)
        return grad_x, grad_w, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, x, weight, stride, padding, dilation, kind):
        k = info.batch_size
        x, weight = _to_front(x, in_dims[0], k), _to_front(weight, in_dims[1], k)
        return _BATCHED_RULES[kind][0](x, weight, (stride, padding, dilation)), 0


def client_conv2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1,
                  kind: str = "unfold") -> torch.Tensor | None:
    """``F.conv2d`` through :class:`_ClientConv2d` with ``kind``'s vmap rule; None where it does not
    apply (grouped convolutions, string padding, an unbatched 3-d input), so the caller convolves as usual."""
    if groups != 1 or isinstance(padding, str) or input.dim() != 4:
        return None
    out = _ClientConv2d.apply(input, weight, _pair(stride), _pair(padding), _pair(dilation), kind)
    return out if bias is None else out + bias.view(1, -1, 1, 1)


class ClientConvolutions(TorchFunctionMode):
    """Inside the block, 2-d convolutions run through :func:`client_conv2d` with ``kind``'s vmap rule."""

    def __init__(self, kind: str = "unfold"):
        super().__init__()
        self.kind = kind

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.conv2d:  # F.conv2d is the same builtin; the mode is off inside this handler
            out = client_conv2d(*args, **kwargs, kind=self.kind)
            if out is not None:
                return out
        return func(*args, **kwargs)


def batched_convolutions(kind: str) -> contextlib.AbstractContextManager:
    """The context the batched step convolves in: ``grouped`` (vmap's own rule), ``unfold`` or
    ``grouped_nhwc``."""
    if kind not in BATCHED_CONVS:
        raise ValueError(f"--batched_conv {kind}: choose one of {', '.join(BATCHED_CONVS)}")
    return ClientConvolutions(kind) if kind in _BATCHED_RULES else contextlib.nullcontext()
