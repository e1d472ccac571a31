"""Partial sharing, for every algorithm that keeps part of the model per client (FedPer, LG-FedAvg,
FedRep, FedBABU, FedBN, FedROD): the private part never leaves the client, upload bytes count
only the shared part, state under partial participation, engines against the sequential one on a
model with body and head parameters, runs through main, and the reductions to FedAvg / Local.

Also the helpers the per-algorithm tests share: a two-layer linear model split into body and head,
its loss on a flat vector (the platform's layout), and a small BatchNorm model.
"""
from __future__ import annotations

import h5py
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fltest import TinyLinear, assert_same_training, build_server, engine_run, make_args, random_dataset, run_main_two_rounds, run_round

PARTIAL = ["FedPer", "LG-FedAvg", "FedRep", "FedBABU", "FedBN", "FedROD"]


class TwoLayer(nn.Module):
    """body = Linear(dim, hidden), head = Linear(hidden, classes): both parts have parameters."""

    def __init__(self, dim: int = 2, hidden: int = 3, num_classes: int = 2):
        super().__init__()
        self.body = nn.Linear(dim, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class TinyBN(nn.Module):
    """A body with BatchNorm (FedBN's private part) and a linear head."""

    def __init__(self, dim: int, num_classes: int, hidden: int = 4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def unpack(w: torch.Tensor, dim: int = 2, hidden: int = 3, num_classes: int = 2):
    """(W1, b1, W2, b2) of :class:`TwoLayer` from its flat vector [W1, b1, W2, b2]."""
    sizes = [hidden * dim, hidden, num_classes * hidden, num_classes]
    W1, b1, W2, b2, *_ = torch.split(w, sizes + [w.numel() - sum(sizes)])
    return W1.view(hidden, dim), b1, W2.view(num_classes, hidden), b2


def two_layer_loss(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    W1, b1, W2, b2 = unpack(w)
    return F.cross_entropy((x @ W1.T + b1) @ W2.T + b2, y)


def masked_descent(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float,
                   trainable: torch.Tensor | None = None, loss=two_layer_loss) -> torch.Tensor:
    """``steps`` full-batch gradient steps on ``loss`` from w, moving only the ``trainable`` entries."""
    for _ in range(steps):
        v = w.detach().clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(loss(v, x, y), v)
        if trainable is not None:
            grad = grad * trainable
        w = w - lr * grad
    return w.detach()


def body_mask(w: torch.Tensor, dim: int = 2, hidden: int = 3) -> torch.Tensor:
    mask = torch.zeros(w.numel(), dtype=torch.bool)
    mask[: hidden * dim + hidden] = True
    return mask


def two_layer_server(algorithm: str, *flags: str, seed: int = 1, **settings):
    """(data, server): two clients of 4 and 6 samples (weights 0.4 / 0.6), 2 features, 2 classes,
    TwoLayer; by default one full batch per epoch and two local epochs."""
    data = random_dataset(num_clients=2, dim=2, num_classes=2, sizes=[4, 6], seed=seed)
    settings = {"batch_size": 6, "local_epochs": 2, "drop_last": False, **settings}
    torch.manual_seed(0)
    return data, build_server(make_args(algorithm, *flags, **settings), data, TwoLayer())


def model_for(algorithm: str, data) -> nn.Module:
    torch.manual_seed(0)
    dim, classes = data.input_shape[0], data.num_classes
    return TinyBN(dim, classes) if algorithm == "FedBN" else TwoLayer(dim, 3, classes)


def partial_server(algorithm: str, data, *flags: str, **settings):
    settings = {"batch_size": 4, "local_learning_rate": 0.1, **settings}
    return build_server(make_args(algorithm, *flags, engine="sequential", **settings), data, model_for(algorithm, data))


@pytest.mark.parametrize("algorithm, flags", [("FedPer", ()), ("LG-FedAvg", ()), ("FedRep", ("-pls", "2")),
                                              ("FedBABU", ("-fte", "1")), ("FedBN", ()), ("FedROD", ())])
def test_two_round_run_through_main(tmp_path, algorithm, flags):
    """Partial participation through main; FedBABU (the global model before fine-tuning) and FedROD
    (the generic model) also record the shared model's accuracy, the others have no such model."""
    path = run_main_two_rounds(tmp_path, algorithm, *flags, "-jr", "0.5")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
        assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
        assert ("rs_test_acc_global" in f) == (algorithm in ("FedBABU", "FedROD"))


@pytest.mark.parametrize("algorithm", PARTIAL)
def test_private_part_never_leaves_the_client(algorithm):
    """A client whose private part comes out of round 1's training altered by +1000 changes nothing
    on the server: its upload carries the server's values there and the global model is bit-identical
    (the alteration is the client's own: it keeps it and is evaluated with it)."""
    data = random_dataset(num_clients=3, dim=4, num_classes=3, seed=5)
    plain, altered = partial_server(algorithm, data), partial_server(algorithm, data)
    private = ~plain.shared_mask
    assert private.any() and plain.shared_mask.any()
    for server in (plain, altered):
        run_round(server, 0)
    client = altered.clients[1]
    honest_train = client.train_job

    def train_and_alter(job, model):
        params, loss = honest_train(job, model)
        return torch.where(private, params + 1000, params), loss

    client.train_job = train_and_alter
    ups = [run_round(server, 1).updates for server in (plain, altered)]
    assert torch.equal(plain.global_params, altered.global_params)
    for a, b in zip(*ups):
        assert torch.equal(a.params, b.params)
        assert torch.equal(b.params[private], plain.global_params[private])
    # the alteration happened, and stayed with the client
    assert torch.equal(altered.state.get("private", 1), plain.state.get("private", 1) + 1000)
    assert torch.equal(altered.state.get("private", 0), plain.state.get("private", 0))


@pytest.mark.parametrize("algorithm", PARTIAL)
def test_bytes_count_only_the_shared_part(algorithm):
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=6)
    server = partial_server(algorithm, data, global_rounds=2, join_ratio=0.5)
    server.train(progress=False)
    shared = int(server.shared_mask.sum())
    assert 0 < shared < server.global_params.numel()
    assert server.history.bytes_up == [2 * shared * 4] * 2
    assert server.history.bytes_down == [2 * shared * 4] * 2


@pytest.mark.parametrize("algorithm", PARTIAL)
def test_state_under_partial_participation(algorithm):
    """Only selected clients get a private part; an unselected client keeps its private part bit for
    bit and is evaluated with it; a never-selected client is evaluated with the initial one."""
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=7)
    server = partial_server(algorithm, data, join_ratio=0.5)
    private = ~server.shared_mask
    init = server.global_params.clone()
    seen: dict[int, torch.Tensor] = {}
    for rnd in range(3):
        cohort = run_round(server, rnd).cohort
        assert len(cohort) == 2
        assert server.state.indices("private") == sorted(set(seen) | set(cohort))
        for i in range(4):
            evaluated = server.eval_params(i)
            assert torch.equal(evaluated[server.shared_mask], server.global_params[server.shared_mask])
            assert torch.equal(server.global_params[private], init[private])  # the server never learns it
            if i in cohort:
                seen[i] = evaluated[private].clone()
            elif i in seen:
                assert torch.equal(evaluated[private], seen[i])
            else:
                assert torch.equal(evaluated, server.global_params)
    moved = [not torch.equal(seen[i], init[private]) for i in seen]
    # FedBABU's private part is the frozen head: it never moves; every other one is trained.
    assert not any(moved) if algorithm == "FedBABU" else all(moved)


@pytest.mark.parametrize("algorithm, flags", [("FedPer", {}), ("LG-FedAvg", {}), ("FedRep", {"plocal_epochs": 2}),
                                              ("FedBABU", {"fine_tuning_epochs": 1}), ("FedROD", {})])
def test_engines_give_the_sequential_models(algorithm, flags):
    """On a model whose body and head both have parameters (the engine suite's tiny model has no body
    parameters, so there FedBABU trains nothing and FedRep's body phase is empty): the threaded engine
    gives the sequential numbers bit for bit, the batched engine (vmap over the cohort) up to rounding."""
    def two_layer(data):
        return TwoLayer(data.input_shape[0], 3, data.num_classes)

    runs = {engine: engine_run(algorithm, engine, module_fn=two_layer, **flags)
            for engine in ("sequential", "threaded", "batched")}
    assert runs["batched"].engine.stats["batched_clients"] > 0
    assert runs["batched"].engine.stats.get("sequential_clients", 0) == 0
    assert_same_training(runs["sequential"], runs["threaded"], exact=True)
    assert_same_training(runs["sequential"], runs["batched"], atol=2e-5, rtol=1e-4)


# ------------------------------------------------------------------------------- reductions
class HeadlessLinear(nn.Module):
    """A linear classifier whose head has no parameters: an empty personal part for FedPer."""

    def __init__(self, dim: int, num_classes: int):
        super().__init__()
        self.body = nn.Linear(dim, num_classes)
        self.head = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _run(algorithm: str, data, module_cls, join_ratio: float):
    torch.manual_seed(0)
    module = module_cls(data.input_shape[0], data.num_classes)
    args = make_args(algorithm, global_rounds=3, join_ratio=join_ratio, batch_size=4, local_learning_rate=0.1)
    server = build_server(args, data, module)
    server.train(progress=False)
    return server


@pytest.mark.parametrize("join_ratio", [1.0, 0.5])
@pytest.mark.parametrize("algorithm, module_cls", [
    ("FedPer", HeadlessLinear),       # empty personal part (the head has no parameters)
    ("LG-FedAvg", TinyLinear),        # empty personal part (the body is the identity)
    ("FedBN", lambda dim, classes: TwoLayer(dim, 3, classes)),  # no normalisation layer
])
def test_empty_personal_part_is_fedavg(algorithm, module_cls, join_ratio):
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=8)
    ours, fedavg = _run(algorithm, data, module_cls, join_ratio), _run("FedAvg", data, module_cls, join_ratio)
    assert ours.shared_mask is None
    assert torch.equal(ours.global_params, fedavg.global_params)
    assert ours.history.test_acc == fedavg.history.test_acc
    assert ours.history.bytes_up == fedavg.history.bytes_up


@pytest.mark.parametrize("join_ratio", [1.0, 0.5])
def test_fedper_with_nothing_shared_is_local(join_ratio):
    """TinyLinear's body is the identity: FedPer shares nothing and each client trains alone."""
    data = random_dataset(num_clients=4, dim=4, num_classes=3, seed=9)
    ours, local = _run("FedPer", data, TinyLinear, join_ratio), _run("Local", data, TinyLinear, join_ratio)
    for i in range(4):
        assert torch.equal(ours.eval_params(i), local.eval_params(i))
    assert ours.history.test_acc == local.history.test_acc


def check_two_rounds_by_hand(algorithm: str, shares_body: bool) -> None:
    """FedPer (shares the body) and LG-FedAvg (shares the head) on :class:`TwoLayer`, two rounds by
    hand: each client trains its whole model (2 full-batch steps) from the global shared part and
    its own private part; the server averages the shared part (0.4 / 0.6) and keeps no private part."""
    lr = 0.1
    data, server = two_layer_server(algorithm, local_learning_rate=lr)
    w = server.global_params.double()
    shared = body_mask(w) if shares_body else ~body_mask(w)
    own = [w.clone(), w.clone()]
    for rnd in range(2):
        trained = [masked_descent(torch.where(shared, w, own[i]), c.train_x.double(), c.train_y, 2, lr)
                   for i, c in enumerate(data.clients)]
        uploads = [torch.where(shared, t, w) for t in trained]
        w = torch.where(shared, 0.4 * trained[0] + 0.6 * trained[1], w)
        own = trained
        updates = run_round(server, rnd).updates
        assert [u.num_steps for u in updates] == [2, 2]
        for i in range(2):
            assert torch.allclose(updates[i].params.double(), uploads[i], atol=1e-6)
            assert torch.allclose(server.eval_params(i).double(), torch.where(shared, w, own[i]), atol=1e-6)
        assert torch.allclose(server.global_params.double(), w, atol=1e-6)
