"""Channels-last convolutions (``--conv_layout``): same model, same flat layout, float-rounding
differences only, and the batched engine still vmaps the convolutions."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from fltest import build_server, image_dataset, make_args
from fltest import one_thread  # noqa: F401  (an autouse fixture: importing it switches it on here)
from flcore.flat import FlatModel
from flcore.registry import MODELS, load_all
from flcore.trainmodel.layout import ChannelsLastConv2d, plain_convolutions, resolve_conv_layout, use_channels_last


def _cnn(channels: int = 1, size: int = 28):
    load_all()
    torch.manual_seed(0)
    return MODELS.get("CNN")((channels, size, size), 10, None)


def test_only_plain_convolutions_change_class_and_nothing_else_changes():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv1d(4, 4, 1), nn.Linear(3, 2))
    keys = list(model.state_dict())
    assert use_channels_last(model) == 1
    assert type(model[0]) is ChannelsLastConv2d and type(model[2]) is nn.Conv1d and type(model[3]) is nn.Linear
    assert list(model.state_dict()) == keys
    assert resolve_conv_layout("auto", torch.device("cpu")) == "channels_last"
    assert resolve_conv_layout("auto", torch.device("cuda")) == "nchw"
    assert resolve_conv_layout("nchw", torch.device("cpu")) == "nchw"


def test_outputs_and_gradients_match_the_usual_layout_and_land_in_the_flat_buffer():
    for channels, size in ((1, 28), (3, 32)):  # one input channel is contiguous in both layouts
        usual = _cnn(channels, size)
        fast = copy.deepcopy(usual)
        use_channels_last(fast)
        flat_usual, flat_fast = FlatModel(usual), FlatModel(fast)
        x = torch.randn(6, channels, size, size)
        y = torch.randint(0, 10, (6,))
        for flat in (flat_usual, flat_fast):
            flat.zero_grad()
            F.cross_entropy(flat.module(x), y).backward()
        torch.testing.assert_close(fast(x), usual(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(flat_fast.grad, flat_usual.grad, atol=1e-5, rtol=1e-4)
        assert flat_fast.grad.abs().sum() > 0
        conv = fast.body[0]
        assert conv.weight.is_contiguous()  # stored as usual: a view of the flat vector
        with plain_convolutions():
            assert torch.equal(fast(x), usual(x))


def test_server_uses_channels_last_on_the_cpu_unless_told_otherwise():
    dataset = image_dataset([12, 9], shape=(1, 28, 28), num_classes=10)
    default = build_server(make_args("FedAvg", batch_size=4), dataset, _cnn())
    assert type(default.model.module.body[0]) is ChannelsLastConv2d
    usual = build_server(make_args("FedAvg", batch_size=4, conv_layout="nchw"), dataset, _cnn())
    assert type(usual.model.module.body[0]) is nn.Conv2d
    for server in (default, usual):
        package = server.make_package(0, [0, 1])
        server.aggregate(server.engine.train(server.clients, package), package)
    torch.testing.assert_close(default.global_params, usual.global_params, atol=1e-5, rtol=1e-4)


def test_batched_engine_still_vmaps_a_channels_last_model():
    load_all()
    dataset = image_dataset([12, 9, 14], shape=(1, 16, 16))
    model = MODELS.get("CNN")((1, 16, 16), 4, None)
    server = build_server(make_args("FedAvg", engine="batched", batch_size=4), dataset, model)
    assert type(server.model.module.body[0]) is ChannelsLastConv2d
    assert server.engine.model_fallback_reason() is None
    server.engine.train(server.clients, server.make_package(0, [0, 1, 2]))
    assert server.engine.stats["batched_clients"] == 3
