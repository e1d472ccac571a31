"""Local-step strategies compose (flcore/clients/localstep.py): a chain in increasing order, the
refusals of chains that mean nothing, and data poisoning under every engine."""
from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from fltest import build_server, make_args, random_dataset
from flcore.clients.localstep import PLAIN_SGD, LocalStepChain, compose
from flcore.extension import LocalStep
from flcore.features import attacks
from utils.errors import FLError


def strategy(name: str, transforms: set[str], order: int) -> LocalStep:
    cls = type(name, (LocalStep,), {"name": name, "transforms": frozenset(transforms), "order": order,
                                    "carried": (f"{name}_count",)})
    return cls()


def test_strategies_are_chained_in_increasing_order():
    poison, noise, plan = strategy("poison", {"data"}, 10), strategy("noise", {"gradient"}, 50), strategy("plan", {"plan"}, 5)
    assert compose([]) is PLAIN_SGD and compose([noise]) is noise
    chain = compose([noise, poison, plan])
    assert isinstance(chain, LocalStepChain) and chain.links == (plan, poison, noise)
    assert chain.name == "plan then poison then noise" and not chain.plain
    assert chain.carried == ("plan_count", "poison_count", "noise_count")
    assert PLAIN_SGD.plain and PLAIN_SGD.links == ()


@pytest.mark.parametrize("steps, message", [
    ([("a", {"plan"}, 1), ("b", {"plan", "gradient"}, 2)], "a and b each draw the round's minibatches"),
    ([("a", {"gradient"}, 1), ("b", {"gradient"}, 2)], "a and b each compute the step's gradient"),
    ([("noise", {"gradient"}, 10), ("poison", {"data"}, 20)],
     "poison would change the minibatch after noise took its gradient"),
])
def test_chains_that_mean_nothing_are_refused_in_one_line(steps, message):
    with pytest.raises(FLError, match=message):
        compose([strategy(*step) for step in steps])


class _Doubled(LocalStep):
    """A data strategy that doubles every input (its gradient is checked below)."""

    name: ClassVar[str] = "doubled"
    transforms: ClassVar[frozenset[str]] = frozenset({"data"})
    order: ClassVar[int] = 20

    def transform_batch(self, client, x, y, package):
        return 2 * x, y


def test_data_strategies_apply_in_order_before_the_gradient():
    """label flipping (order 10), then doubling (20): the plain gradient of the doubled inputs with the
    flipped labels, as one backward pass on them by hand."""
    data = random_dataset(num_clients=4, dim=3, num_classes=3, sizes=[8] * 4, seed=1)
    args = make_args("FedAvg", num_clients=4, attack="label_flip", attack_fraction=0.25, batch_size=4)
    server = build_server(args, data)
    flipper = int(attacks.attacker_mask(0, 0.25, False, 4, 0).argmax())
    client, model = server.clients[flipper], server.model
    client.local_step = compose([_Doubled(), client.local_step])
    idx = torch.tensor([1, 4, 5, 6])
    client.step_gradient(model, idx, {}, server.package(0, [0, 1, 2, 3]), 0)
    got = model.grad.clone()
    model.zero_grad()
    client.local_loss(model.net, 2 * data.clients[flipper].train_x[idx], 2 - data.clients[flipper].train_y[idx],
                      {}).backward()
    assert torch.equal(got, model.grad)


def test_label_flipping_trains_alike_under_every_engine():
    """The batched engine trains the poisoning strategy's clients by the sequence, as the others do."""
    data = random_dataset(num_clients=4, dim=3, num_classes=3, sizes=[8, 12, 9, 16], seed=4)
    params = {}
    for engine in ("sequential", "threaded", "batched"):
        args = make_args("FedAvg", engine=engine, num_clients=4, attack="label_flip", attack_fraction=0.25,
                         batch_size=4, global_rounds=2)
        server = build_server(args, data)
        for rnd in range(2):
            server.run_round(rnd, evaluate=False)
        params[engine] = server.global_params
    assert torch.equal(params["sequential"], params["threaded"]) and torch.equal(params["sequential"], params["batched"])
