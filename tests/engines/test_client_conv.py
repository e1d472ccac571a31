"""client_conv.py: per-client convolutions under vmap as im2col + batched matrix products."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad, grad_and_value, vmap

from flcore.engines import client_conv
from flcore.engines.client_conv import ClientConvolutions, batched_convolutions, client_conv2d

GEOMETRIES = [dict(), dict(stride=2, padding=1), dict(stride=(1, 2), padding=(2, 0)), dict(padding=2, dilation=2)]


def _params(k: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {"w1": torch.randn(k, 6, 3, 3, 3, generator=gen), "b1": torch.randn(k, 6, generator=gen),
            "w2": torch.randn(k, 5, 6, 3, 3, generator=gen)}


def _loss(geometry):
    def loss(p, x, y):
        h = F.relu(F.conv2d(x, p["w1"], p["b1"], **geometry))
        h = F.conv2d(h, p["w2"], None, **{"padding": 1, **geometry})  # an input that needs its gradient
        return F.cross_entropy(h.mean((2, 3)), y)
    return loss


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("shared_input", [False, True])
@pytest.mark.parametrize("kind", ["unfold", "grouped_nhwc"])
def test_vmapped_gradients_equal_the_grouped_convolution(geometry, shared_input, kind, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    k, n = 4, 3
    params = _params(k, gen)
    x = torch.randn(n, 3, 11, 9, generator=gen) if shared_input else torch.randn(n, k, 3, 11, 9, generator=gen)
    y = torch.randint(0, 5, (k, n), generator=gen)
    step = vmap(grad_and_value(_loss(geometry)), in_dims=(0, None if shared_input else 1, 0))
    grouped_grads, grouped_loss = step(params, x, y)
    # each kind's rule reaches all K clients' inputs through one function: count its calls
    spied = "_unfold" if kind == "unfold" else "_as_groups"
    calls, original = [], getattr(client_conv, spied)
    monkeypatch.setattr(client_conv, spied, lambda *a, **kw: calls.append(tuple(a[0].shape[:2])) or original(*a, **kw))
    with ClientConvolutions(kind):
        grads, losses = step(params, x, y)
    # two forward passes and two weight gradients, each over all K clients at once
    assert calls.count((k, n)) == 4 and len(calls) == 4
    torch.testing.assert_close(losses, grouped_loss, atol=1e-5, rtol=1e-5)
    for name in params:
        torch.testing.assert_close(grads[name], grouped_grads[name], atol=1e-4, rtol=1e-5)


def test_without_vmap_it_is_conv2d_and_its_gradients():
    gen = torch.Generator().manual_seed(1)
    params = {k: v[0] for k, v in _params(1, gen).items()}
    x, y = torch.randn(2, 3, 8, 8, generator=gen), torch.tensor([1, 4])
    plain = grad(_loss({}))(params, x, y)
    with ClientConvolutions():
        ours = grad(_loss({}))(params, x, y)
        conv = nn.Conv2d(3, 6, 3, padding=1)
        torch.testing.assert_close(conv(x), F.conv2d(x, conv.weight, conv.bias, padding=1))
    for name in params:
        torch.testing.assert_close(ours[name], plain[name], atol=1e-6, rtol=1e-6)


def test_declines_what_it_does_not_cover():
    x, w = torch.randn(2, 4, 7, 7), torch.randn(4, 2, 3, 3)
    assert client_conv2d(x, w, groups=2) is None
    assert client_conv2d(x, torch.randn(3, 4, 3, 3), padding="same") is None
    assert client_conv2d(x[0], torch.randn(3, 4, 3, 3)) is None  # an unbatched [C, H, W] input
    with ClientConvolutions():  # convolved as usual
        torch.testing.assert_close(F.conv2d(x, w, groups=2), torch.conv2d(x, w, groups=2))


def test_second_derivatives_are_refused_in_one_line():
    x, w = torch.randn(1, 2, 5, 5, requires_grad=True), torch.randn(3, 2, 3, 3, requires_grad=True)
    with ClientConvolutions():
        out = F.conv2d(x, w)
    (gw,) = torch.autograd.grad(out.square().sum(), w, create_graph=True)
    with pytest.raises(RuntimeError, match="second derivatives"):
        gw.sum().backward()


def test_an_unknown_kind_is_refused_in_one_line():
    with pytest.raises(ValueError, match="--batched_conv im2col: choose one of grouped, unfold, grouped_nhwc"):
        batched_convolutions("im2col")


def test_the_nhwc_kind_convolves_one_channels_last_grouped_convolution():
    """``grouped_nhwc`` lays the K clients out as vmap's grouped convolution does (client k's
    channels at k·C ... k·C + C − 1, its filters at k·O ...), channels-last."""
    gen = torch.Generator().manual_seed(3)
    k, n, c, o = 3, 2, 4, 5
    x, w = torch.randn(k, n, c, 6, 7, generator=gen), torch.randn(k, o, c, 3, 3, generator=gen)
    grouped_x, grouped_w = client_conv._as_groups(x, w)
    assert grouped_x.shape == (n, k * c, 6, 7) and grouped_w.shape == (k * o, c, 3, 3)
    assert grouped_x.is_contiguous(memory_format=torch.channels_last)
    assert grouped_w.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(grouped_x[:, c:2 * c], x[1]) and torch.equal(grouped_w[o:2 * o], w[1])
    out = client_conv._nhwc_conv(x, w, ((1, 1), (1, 1), (1, 1)))
    for client in range(k):
        torch.testing.assert_close(out[client], F.conv2d(x[client], w[client], padding=1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["unfold", "grouped_nhwc"])
def test_bf16_autocast_trains_through_each_kind_as_through_the_grouped_convolution(kind):
    """``--precision bf16``: the forward pass convolves in bf16 and the gradient arrives in bf16 while the
    saved input and weight are fp32; each kind trains as close to fp32 as the grouped convolution does."""
    from fltest import build_server, image_dataset, make_args
    from flcore.registry import MODELS

    dataset = image_dataset([9, 14, 21, 6])

    def round_of(precision, conv):
        args = make_args("FedAvg", engine="batched", batch_size=4, local_learning_rate=0.05, eval_auc=False,
                         precision=precision, batched_conv=conv)
        torch.manual_seed(0)
        server = build_server(args, dataset, MODELS.get("CNN")(dataset.input_shape, dataset.num_classes, None))
        cohort = list(range(len(server.clients)))
        return server.engine.train([server.clients[i] for i in cohort], server.make_package(0, cohort))

    full, grouped, other = round_of("fp32", "grouped"), round_of("bf16", "grouped"), round_of("bf16", kind)
    for f, g, o in zip(full, grouped, other):
        assert o.params.dtype == torch.float32 and not torch.equal(o.params, f.params)  # it did train in bf16
        assert (o.params - f.params).abs().max() < 2e-2 and (o.params - g.params).abs().max() < 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")
@pytest.mark.parametrize("algo", ["FedAvg", "SCAFFOLD"])
@pytest.mark.parametrize("kind", ["unfold", "grouped_nhwc"])
def test_each_kind_trains_as_the_grouped_convolution_on_the_gpu(algo, kind, monkeypatch):
    """Captured in a CUDA graph, ``unfold`` and ``grouped_nhwc`` train as vmap's grouped convolution does."""
    from fltest import assert_same_training
    from test_devices import cnn_run

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # compare float32 arithmetic
    device = torch.device("cuda")
    grouped = cnn_run(algo, "batched", device, batched_conv="grouped", step_runner="graph")
    other = cnn_run(algo, "batched", device, batched_conv=kind, step_runner="graph")
    assert other.engine.batched_conv == kind and other.engine.runner.captured > 0
    assert_same_training(grouped, other, atol=1e-4, rtol=1e-4)
