"""FedRep: two rounds by hand (head epochs with the body frozen, then body epochs with the head
frozen; bodies averaged), -pls 0 is FedBABU's training, uniform weighting, flags.

Shared with the other partial-sharing algorithms (``test_partial_sharing.py``): the head never
leaves the client, bytes count the body only, state under partial participation, engines."""
from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from torch import nn

from fltest import assert_same_training, build_server, engine_run, make_args, random_dataset, run_round
from test_partial_sharing import TwoLayer, body_mask, masked_descent, two_layer_server
from flcore.clients import clientfedrep
from flcore.clients.clientfedrep import FedRepClient, features_are_fixed
from flcore.flat import FlatModel
from flcore.trainmodel.layout import use_channels_last
from flcore.trainmodel.models import SplitModel
from utils.errors import FLError


def split_two_layer(dim: int = 2, hidden: int = 3, num_classes: int = 2) -> SplitModel:
    """TwoLayer's layers (the same initial weights under the same seed) as a ``SplitModel``, whose
    linear body lets FedRep's head steps take their shortcut (features computed once a round)."""
    two = TwoLayer(dim, hidden, num_classes)
    return SplitModel(two.body, two.head)


def count_body_steps(server) -> list[int]:
    """A list that counts the body's forward passes with autograd on (one per full step; the head
    steps' shortcut and the evaluations run the body without)."""
    calls: list[int] = []
    server.model.module.body.register_forward_hook(lambda *_: calls.append(1) if torch.is_grad_enabled() else None)
    return calls


@pytest.mark.parametrize("shortcut", [False, True])
@pytest.mark.parametrize("weighting, weights", [("samples", (0.4, 0.6)), ("uniform", (0.5, 0.5))])
def test_two_rounds_by_hand(weighting, weights, shortcut):
    # 3 head epochs then 2 body epochs per round, one full-batch step each; with the shortcut the
    # head steps train on the body's features computed once a round, to the same numbers.
    lr = 0.1
    data, server = two_layer_server("FedRep", "-pls", "3", "--fedrep_weighting", weighting, local_learning_rate=lr)
    if shortcut:
        torch.manual_seed(0)
        server = build_server(make_args("FedRep", "-pls", "3", "--fedrep_weighting", weighting, batch_size=6,
                                        local_epochs=2, drop_last=False, local_learning_rate=lr), data,
                              split_two_layer())
    full_steps = count_body_steps(server)
    w = server.global_params.double()
    body = body_mask(w)
    own = [w.clone(), w.clone()]
    for rnd in range(2):
        trained = []
        for i, c in enumerate(data.clients):
            x, y = c.train_x.double(), c.train_y
            v = masked_descent(torch.where(body, w, own[i]), x, y, 3, lr, trainable=~body)
            trained.append(masked_descent(v, x, y, 2, lr, trainable=body))
        w = torch.where(body, weights[0] * trained[0] + weights[1] * trained[1], w)
        own = trained
        updates = run_round(server, rnd).updates
        assert [u.num_steps for u in updates] == [5, 5]  # 3 head steps, then 2 body steps
        assert len(full_steps) == (rnd + 1) * 2 * (2 if shortcut else 5)  # the shortcut runs the body at body steps only
        for i in range(2):
            assert torch.allclose(server.eval_params(i).double(), torch.where(body, w, own[i]), atol=1e-6)
        assert torch.allclose(server.global_params.double(), w, atol=1e-6)


@pytest.mark.parametrize("join_ratio", [1.0, 0.5])
def test_no_head_epochs_is_fedbabu_training(join_ratio):
    """With -pls 0 the head never moves and the body phase is FedBABU's local step: the same global
    model bit for bit, and every client is evaluated with FedBABU's global model (no fine-tuning)."""
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=3)
    runs = {}
    for algo, flags in (("FedRep", ("-pls", "0")), ("FedBABU", ("-fte", "0"))):
        torch.manual_seed(0)
        args = make_args(algo, *flags, global_rounds=3, join_ratio=join_ratio, batch_size=4, local_learning_rate=0.1)
        runs[algo] = build_server(args, data, TwoLayer(4, 3, 3))
        runs[algo].train(progress=False)
    assert torch.equal(runs["FedRep"].global_params, runs["FedBABU"].global_params)
    for i in range(4):
        assert torch.equal(runs["FedRep"].eval_params(i), runs["FedBABU"].global_params)
    assert runs["FedRep"].history.test_acc == runs["FedBABU"].history.test_acc


def test_flags():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    server = build_server(make_args("FedRep"), data, TwoLayer())
    assert server.summary() == {"plocal_epochs": 1, "fedrep_weighting": "samples"}
    with pytest.raises(FLError):
        build_server(make_args("FedRep", "-pls", "-1"), data, TwoLayer())




def test_the_shortcut_only_where_the_bodys_output_is_fixed():
    """The body's features are computed once only for ``head(body(x))`` with plain layers: dropout
    (random in train mode), BatchNorm (batch statistics, running averages) and a model of another
    forward pass take the full step."""
    def flat(body):
        return FlatModel(SplitModel(body, nn.Linear(3, 2)))

    assert features_are_fixed(flat(nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.ReLU())))
    assert features_are_fixed(flat(nn.Sequential(nn.Conv2d(1, 3, 2), nn.GroupNorm(1, 3), nn.AdaptiveAvgPool2d(1),
                                                 nn.Flatten())))
    cpu_layout = nn.Sequential(nn.Conv2d(1, 3, 2), nn.ReLU(), nn.Flatten())
    assert use_channels_last(cpu_layout) == 1 and features_are_fixed(flat(cpu_layout))  # the CPU's conv layout
    assert not features_are_fixed(flat(nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5))))
    assert not features_are_fixed(flat(nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))))
    assert not features_are_fixed(FlatModel(TwoLayer(4, 3, 2)))  # its own forward: not known to be head(body(x))

    class Wider(SplitModel):
        def forward(self, x):
            return self.head(self.body(x)) * 2

    assert not features_are_fixed(FlatModel(Wider(nn.Linear(4, 3), nn.Linear(3, 2))))


@pytest.mark.parametrize("flags", [{}, {"weight_decay": 0.01, "local_momentum": 0.9}])
def test_the_shortcut_gives_the_full_steps_numbers(monkeypatch, flags):
    """Minibatches over ragged clients, 60% participation, weight decay and momentum: the head steps on
    the round's features give the full steps' models up to float rounding, and the threaded engine
    (workers take the shortcut too) the sequential numbers bit for bit."""
    def model(data):
        return split_two_layer(data.input_shape[0], 4, data.num_classes)

    shortcut = {engine: engine_run("FedRep", engine, module_fn=model, plocal_epochs=2, **flags)
                for engine in ("sequential", "threaded")}
    assert_same_training(shortcut["sequential"], shortcut["threaded"], exact=True)
    monkeypatch.setattr(clientfedrep, "features_are_fixed", lambda model: False)
    full = engine_run("FedRep", "sequential", module_fn=model, plocal_epochs=2, **flags)
    assert_same_training(full, shortcut["sequential"], atol=1e-6, rtol=1e-5)


def test_the_shortcut_keeps_fedrep_on_every_engine_and_feature():
    """A shortcut of the base step is not recorded as an override: FedRep's clients still train in the
    threaded engine's workers, in the batched engine's vmap, under DP-SGD and data attacks. A subclass
    that replaces the hook again is recorded, and only the gradient's hook may be a shortcut."""
    caps = FedRepClient.capabilities
    assert "compute_gradient" not in caps.overrides and caps.keeps_base_training

    class OwnStep(FedRepClient):
        def compute_gradient(self, model, idx, ctx=None):
            return super().compute_gradient(model, idx, ctx)

    assert "compute_gradient" in OwnStep.capabilities.overrides and not OwnStep.capabilities.keeps_base_training
    with pytest.raises(TypeError, match="only compute_gradient"):
        class OwnLoop(FedRepClient):  # noqa: F841 - defining it is the test
            base_step_shortcuts: ClassVar[tuple[str, ...]] = ("sgd",)

            def sgd(self, *args):
                return super().sgd(*args)
