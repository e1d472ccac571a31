"""FedMA: the BBP-MAP cost by hand, permuted clients matched back exactly, a grown layer keeping the
function of the matched part, the layer-wise schedule (frozen layers, the head by label counts),
resume across a width change, and the models it refuses."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

import main
from flcore.protocol import ClientUpdate
from flcore.common.matching import bbp_map_cost, match_units, matched_average
from flcore.trainmodel.models import SplitModel
from flcore.trainmodel.widths import chain_of, gather, input_columns, with_widths
from fltest import (assert_same_training, build_server, dataset_from_arrays, engine_run, make_args,
                    random_dataset)
from test_resume import interrupted_and_resumed, read
from toydata import make_dataset
from utils.errors import FLError


def tiny_mlp(inputs: int = 4, hidden: int = 6, classes: int = 3) -> SplitModel:
    torch.manual_seed(0)
    return SplitModel(nn.Sequential(nn.Flatten(), nn.Linear(inputs, hidden), nn.ReLU()), nn.Linear(hidden, classes))


def fedma_server(hidden: int = 6, **flags):
    data = random_dataset(num_clients=2, dim=4, num_classes=3, sizes=[8, 12], seed=3)
    args = make_args("FedMA", batch_size=4, **flags)
    return build_server(args, data, tiny_mlp(hidden=hidden))


def client_params(server, weight, bias, head_weight, head_bias) -> torch.Tensor:
    vector = torch.zeros(server.model.num_total)
    views = server.model.unflatten(vector, params_only=False)
    for name, value in (("body.1.weight", weight), ("body.1.bias", bias), ("head.weight", head_weight),
                        ("head.bias", head_bias)):
        views[name].copy_(value)
    return vector


def upload(index: int, params: torch.Tensor, counts) -> ClientUpdate:
    return ClientUpdate(index, 10, 1, params, 0.0, extras={"label_counts": torch.tensor(counts, dtype=torch.float32)})


def forward(server, params: torch.Tensor, x: torch.Tensor, flat=None) -> torch.Tensor:
    flat = flat or server.model_of(params)
    flat.load(params)
    with torch.no_grad():
        return flat.module(x)


# ------------------------------------------------------------------ the Hungarian step by hand
def test_bbp_map_cost_and_assignment_match_a_hand_computation():
    """Client j's units w1 = (1, 0), w2 = (0, 2) against one global unit S = (2, 0) held by the other
    of J = 2 clients; σ² = σ0² = 1, γ0 = 0.5, two new units may open."""
    units = np.array([[1.0, 0.0], [0.0, 2.0]])
    cost = bbp_map_cost(units, np.array([[2.0, 0.0]]), np.array([1.0]), num_clients=2, sigma2=1.0, sigma0_2=1.0,
                        gamma=0.5, new_units=2)
    # existing unit: −(‖S + w‖² / (1 + 2) − ‖S‖² / (1 + 1)) − 2 log(1 / (2 − 1))
    w1_existing = -(9 / 3 - 4 / 2) - 2 * math.log(1.0)  # ‖(3, 0)‖² = 9
    w2_existing = -(8 / 3 - 4 / 2)  # ‖(2, 2)‖² = 8
    # k-th new unit: −‖w‖² / (1 + 1) − 2 log(γ0 / (J k))
    new = [[-1 / 2 - 2 * math.log(0.5 / (2 * k)) for k in (1, 2)], [-4 / 2 - 2 * math.log(0.5 / (2 * k)) for k in (1, 2)]]
    expected = np.array([[w1_existing, *new[0]], [w2_existing, *new[1]]])
    np.testing.assert_allclose(cost, expected, rtol=0, atol=1e-12)
    # −1 + 0.77 beats −0.67 + 2.27: w1 joins the global unit, w2 opens the first new one
    rows, cols = linear_sum_assignment(cost)
    assert cols[np.argsort(rows)].tolist() == [0, 1]


def test_two_clients_whose_units_are_permutations_are_matched_back_exactly():
    rng = np.random.default_rng(0)
    units = rng.normal(size=(6, 5))
    units *= 6 / np.linalg.norm(units, axis=1, keepdims=True)  # ‖w‖² = 36: matching a copy gains 12 > 2 log 3.5
    perm = rng.permutation(6)
    assigned, width = match_units([units, units[perm]], 1.0, 1.0, 7.0, max_width=9, iterations=3, rng=rng)
    assert width == 6
    assert assigned[1].tolist() == assigned[0][perm].tolist()  # B's unit l is A's unit perm[l]
    tensors = [torch.as_tensor(units), torch.as_tensor(units[perm])]
    average = matched_average(tensors, assigned, width)
    assert torch.equal(average[torch.as_tensor(assigned[0])], tensors[0])


def test_new_units_are_numbered_by_the_units_that_open_them_whatever_the_solver_tie():
    """B's three units are unlike A's, so all open new units. Which opening unit takes which new
    column is a tie (every pairing costs the same); a solver that breaks it the other way (the
    pairing reversed, as one ulp of the cost can) must not renumber the global units."""
    import flcore.common.matching as matching

    a = np.eye(3) * 6.0
    b = -np.eye(3) * 6.0
    plain, _ = match_units([a, b], 1.0, 1.0, 1.0, max_width=6, iterations=1, rng=np.random.default_rng(0))

    def reversed_tie(cost):
        rows, cols = linear_sum_assignment(cost)
        new = cols >= cost.shape[1] - cost.shape[0]  # the new-unit columns (one per unit)
        cols = cols.copy()
        cols[new] = cols[new][::-1]
        assert np.isclose(cost[rows, cols].sum(), cost[linear_sum_assignment(cost)].sum())  # still optimal
        return rows, cols

    original = matching.linear_sum_assignment
    matching.linear_sum_assignment = reversed_tie
    try:
        tied, _ = match_units([a, b], 1.0, 1.0, 1.0, max_width=6, iterations=1, rng=np.random.default_rng(0))
    finally:
        matching.linear_sum_assignment = original
    first = int(np.random.default_rng(0).permutation(2)[0])  # the client matched first keeps 0, 1, 2
    assert plain[first].tolist() == [0, 1, 2] and plain[1 - first].tolist() == [3, 4, 5]
    assert [x.tolist() for x in tied] == [x.tolist() for x in plain]


def test_matching_keeps_each_units_sums_as_a_from_scratch_sum_would():
    """The running sums of matched units (a client leaves, is matched again, joins) give the
    assignments of sums rebuilt from every other client at each match, over random layers."""
    import flcore.common.matching as matching

    def rebuilt(units, sigma2, sigma0_2, gamma, max_width, iterations, rng):
        assigned = [None] * len(units)

        def match(j):
            used = np.unique(np.concatenate([x for x in assigned if x is not None]))
            for i, x in enumerate(assigned):
                if x is not None:
                    assigned[i] = np.searchsorted(used, x)
            width = len(used)
            sums, counts = np.zeros((width, units[j].shape[1])), np.zeros(width)
            for other, chosen in enumerate(assigned):
                if chosen is not None:
                    sums[chosen] += units[other]
                    counts[chosen] += 1
            cost = bbp_map_cost(units[j], sums, counts, len(units), sigma2, sigma0_2, gamma,
                                min(len(units[j]), max_width - width))
            rows, cols = linear_sum_assignment(cost)
            chosen = np.empty(len(units[j]), dtype=np.int64)
            chosen[rows] = cols
            chosen[chosen >= width] = width + np.arange(int((chosen >= width).sum()))
            return chosen

        order = rng.permutation(len(units))
        assigned[order[0]] = np.arange(len(units[order[0]]))
        for j in order[1:]:
            assigned[j] = match(j)
        for _ in range(iterations - 1):
            for j in rng.permutation(len(units)):
                assigned[j] = None
                assigned[j] = match(j)
        return assigned

    rng = np.random.default_rng(5)
    for trial in range(40):
        clients, width, dim = int(rng.integers(2, 7)), int(rng.integers(1, 9)), int(rng.integers(1, 6))
        base = rng.normal(size=(width, dim))
        noise = float(rng.choice([0.05, 0.5, 2.0]))
        units = [(base[rng.permutation(width)] + noise * rng.normal(size=(width, dim)))[: int(rng.integers(1, width + 1))]
                 for _ in range(clients)]
        limit, gamma = width + int(rng.integers(0, 4)), float(rng.choice([0.2, 1.0, 5.0]))
        got, _ = matching.match_units(units, 1.0, 1.0, gamma, limit, 3, np.random.default_rng(trial))
        want = rebuilt(units, 1.0, 1.0, gamma, limit, 3, np.random.default_rng(trial))
        used = np.unique(np.concatenate(want))
        assert [x.tolist() for x in got] == [np.searchsorted(used, x).tolist() for x in want], trial


def test_server_averages_permuted_clients_into_either_one():
    """Client B is client A with its hidden units permuted (rows of the layer, columns of the head):
    the matched global model is A's model up to that permutation and computes A's function."""
    server = fedma_server()
    g = torch.Generator().manual_seed(1)
    weight, bias = 3 * torch.randn(6, 4, generator=g), torch.randn(6, generator=g)
    head_weight, head_bias = torch.randn(3, 6, generator=g), torch.randn(3, generator=g)
    perm = torch.randperm(6, generator=g)
    a = client_params(server, weight, bias, head_weight, head_bias)
    b = client_params(server, weight[perm], bias[perm], head_weight[:, perm], head_bias)
    package = server.make_package(0, [0, 1])
    server.aggregate([upload(0, a, [3, 4, 1]), upload(1, b, [0, 5, 7])], package)
    assert server.widths == [6] and server.global_params.numel() == a.numel()
    chosen_a, chosen_b = server.assignments[0][0], server.assignments[1][0]
    assert chosen_b.tolist() == chosen_a[perm.numpy()].tolist()
    named = server.matched.flat.unflatten(server.global_params)
    order = torch.as_tensor(chosen_a)
    assert torch.equal(named["body.1.weight"][order], weight) and torch.equal(named["body.1.bias"][order], bias)
    x = torch.randn(7, 4, generator=g)
    torch.testing.assert_close(forward(server, server.global_params, x), forward(server, a, x, server.model),
                               rtol=0, atol=1e-5)


def test_grown_layer_keeps_the_function_of_the_matched_part():
    """A's units {u0, u1, u2}, B's {u1, u0, v} with v unlike any: the global layer grows to 4 units
    (u0, u1, u2, v); A's and B's units are found in it unchanged, and each client's model taken back
    from it (what the server sends) is that client's layer."""
    server = fedma_server(hidden=3)
    g = torch.Generator().manual_seed(2)
    units, bias = 3 * torch.randn(3, 4, generator=g), torch.randn(3, generator=g)
    other, other_bias = -10 * torch.ones(1, 4), torch.tensor([5.0])
    head = torch.randn(3, 3, generator=g), torch.randn(3, generator=g)
    a = client_params(server, units, bias, *head)
    b_weight, b_bias = torch.cat([units[[1, 0]], other]), torch.cat([bias[[1, 0]], other_bias])
    b = client_params(server, b_weight, b_bias, head[0][:, [1, 0, 2]], head[1])
    server.aggregate([upload(0, a, [1, 1, 1]), upload(1, b, [1, 1, 1])], server.make_package(0, [0, 1]))
    assert server.widths == [4]  # floor(3 × 1.5): grown by the one unmatched unit
    assert server.global_params.numel() > a.numel()
    named = server.matched.flat.unflatten(server.global_params)
    x = torch.randn(5, 4, generator=g)
    hidden = torch.relu(x @ named["body.1.weight"].T + named["body.1.bias"])
    for params, chosen in ((a, server.assignments[0][0]), (b, server.assignments[1][0])):
        own = server.model.unflatten(params)
        assert torch.equal(named["body.1.weight"][torch.as_tensor(chosen)], own["body.1.weight"])
        torch.testing.assert_close(hidden[:, torch.as_tensor(chosen)], torch.relu(x @ own["body.1.weight"].T + own["body.1.bias"]))
    # what client A receives of the layer in the next round is its own layer
    payload = server.make_package(1, [0, 1]).payload(0)["model"]
    mask = server.clients[0].layer_masks[0]
    assert torch.equal(payload, a[mask])
    # a module of the new widths: an added unit whose head column is zero leaves A's function as it was
    grown = with_widths(server.model.module, [4])
    assert grown.body[1].weight.shape == (4, 4) and grown.head.weight.shape == (3, 4)
    own = server.model.unflatten(a)
    with torch.no_grad():
        grown.body[1].weight.copy_(torch.cat([own["body.1.weight"], other]))
        grown.body[1].bias.copy_(torch.cat([own["body.1.bias"], other_bias]))
        grown.head.weight.copy_(torch.cat([own["head.weight"], torch.zeros(3, 1)], 1))
        grown.head.bias.copy_(own["head.bias"])
        torch.testing.assert_close(grown(x), forward(server, a, x, server.model))


def test_gather_takes_units_and_their_inputs():
    chain = chain_of(with_widths(tiny_mlp(), [5]))
    named = {"body.1.weight": torch.arange(20.0).reshape(5, 4), "body.1.bias": torch.arange(5.0),
             "head.weight": torch.arange(15.0).reshape(3, 5), "head.bias": torch.zeros(3)}
    out = gather(named, chain, [np.array([4, 0])])
    assert out["body.1.weight"].tolist() == [[16, 17, 18, 19], [0, 1, 2, 3]]
    assert out["head.weight"].tolist() == [[4, 0], [9, 5], [14, 10]]


# ------------------------------------------------------------------ the layer-wise schedule
def test_layer_wise_rounds_freeze_matched_layers_and_average_the_head_by_label_counts():
    server = fedma_server(local_epochs=1)
    assert server.phase() == (2, 0)  # the initial model is sent
    server.run_round(0, evaluate=False)
    assert server.step == 1 and server.phase() == (1, 1)  # hidden layer 0 matched: sent and frozen
    result = server.run_round(1, evaluate=False)
    package = result.package
    for update in result.updates:  # the frozen layer came back as it was sent
        mask = server.clients[update.index].layer_masks[0]
        assert torch.equal(update.params[mask], package.payload(update.index)["model"])
        assert update.nbytes() == int((~mask).sum()) * 4 + 3 * 4  # the head and the label counts
    # the head is each class's mean weighted by the clients' samples of that class
    counts = torch.stack([u.extras["label_counts"] for u in result.updates]).double()
    heads = [server.model.unflatten(u.params)["head.weight"] for u in result.updates]
    spread = []
    for update, head in zip(result.updates, heads):
        full = torch.zeros(3, server.widths[0], dtype=torch.float64)
        full[:, torch.as_tensor(server.assignments[update.index][0])] = head.double()
        spread.append(full)
    expected = sum(c[:, None] / counts.sum(0)[:, None] * s for c, s in zip(counts, spread))
    named = server.matched.flat.unflatten(server.global_params)
    torch.testing.assert_close(named["head.weight"].double(), expected, rtol=0, atol=1e-6)
    assert server.phase() == (2, 0)  # then the communication rounds: the whole model, all trained
    server.run_round(2, evaluate=True)
    assert len(server.history.extra_series["widths"]) == 3


def resumed_run_widths(tmp_path, monkeypatch, *flags: str) -> np.ndarray:
    """FedMA through main with a γ0 that grows every layer, uninterrupted and stopped after round 1
    then resumed: the two give the same results; returns the widths recorded per round."""
    data = make_dataset(tmp_path / "data", num_clients=4, input_shape=(1, 8, 8), train_sizes=[24, 31, 18, 40])
    flags = (*flags, "--fedma_gamma", "1000")
    reference, _ = interrupted_and_resumed(data, tmp_path, monkeypatch, "FedMA", *flags)
    return read(reference)[0]["rs_widths"]


def test_resume_is_exact_across_a_width_change(tmp_path, monkeypatch):
    widths = resumed_run_widths(tmp_path, monkeypatch)
    assert widths[0].tolist() == [150] and widths.shape == (4, 1)  # DNN's 100 units grown to the cap


# ------------------------------------------------------------------ refusals
def test_models_that_are_not_chains_are_refused():
    data = random_dataset(num_clients=2, dim=4, num_classes=3, seed=3)
    module = SplitModel(nn.Sequential(nn.Linear(4, 6), nn.GroupNorm(2, 6)), nn.Linear(6, 3))
    with pytest.raises(FLError, match="GroupNorm"):
        build_server(make_args("FedMA"), data, module)


def test_unsupported_model_or_plugin_is_one_line_and_exit_2(tmp_path, capsys):
    data = make_dataset(tmp_path / "data", num_clients=2, input_shape=(1, 16, 16))
    for flags in (["-m", "ResNet10"], ["-m", "DNN", "--robust", "median"], ["-m", "DNN", "-nnc", "1"]):
        code = main.main(["-data", str(data), "-algo", "FedMA", "-gr", "1", "-dev", "cpu", "--progress", "False",
                          "-q", "--results_dir", str(tmp_path / "r"), *flags])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.count("\n") == 0 and "FedMA" in err, err
        assert not list(tmp_path.glob("r/*.h5"))


def test_engines_agree_on_a_model_with_hidden_layers():
    """The frozen layers and partial participation (60%) on a model with a hidden layer: the threaded
    engine gives the sequential numbers exactly, the batched engine up to float rounding."""
    def mlp(data):
        return SplitModel(nn.Sequential(nn.Flatten(), nn.Linear(6, 8), nn.ReLU()), nn.Linear(8, 3))

    ref = engine_run("FedMA", "sequential", module_fn=mlp, global_rounds=3)
    assert ref.step == 3 and len(ref.history.extra_series["widths"]) == 3  # both phases
    assert_same_training(ref, engine_run("FedMA", "threaded", module_fn=mlp, global_rounds=3, workers=2), exact=True)
    # Matching is discrete: where two choices nearly tie (opening a unit or joining one, for units
    # that are small against σ = 1), float rounding may pick the other. With a small γ0 no unit is
    # opened, the choices are clear and the engines agree.
    ref = engine_run("FedMA", "sequential", module_fn=mlp, global_rounds=3, fedma_gamma=0.01)
    batched = engine_run("FedMA", "batched", module_fn=mlp, global_rounds=3, fedma_gamma=0.01)
    assert batched.engine.stats["batched_clients"] > 0
    assert batched.widths == ref.widths
    assert_same_training(ref, batched, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name, shape", [("MLR", (1, 8, 8)), ("DNN", (1, 8, 8)), ("MLP", (1, 8, 8)),
                                         ("CNN", (1, 16, 16)), ("CNN-BN", (1, 16, 16)), ("LeNet", (1, 16, 16)),
                                         ("HARCNN", (9, 1, 128)), ("VGG9", (1, 8, 8))])
def test_registry_chain_models_grow_and_give_back_their_original(name, shape):
    """A supported model built one unit wider in every hidden layer runs, and the original model's
    units gathered from a copy of itself (identity assignments) are the original."""
    from flcore.flat import FlatModel
    from flcore.registry import MODELS, load_all

    load_all()
    torch.manual_seed(0)
    module = MODELS.get(name)(shape, 4, None)
    chain = chain_of(module)
    grown = with_widths(module, [w + 1 for w in chain.widths]).eval()
    assert grown(torch.zeros(2, *shape)).shape == (2, 4)
    assert chain_of(grown).widths == [w + 1 for w in chain.widths]
    flat = FlatModel(module)
    named = flat.unflatten(flat.vector, params_only=False)
    taken = gather(named, chain, [np.arange(w) for w in chain.widths])
    assert set(taken) == set(named) and all(torch.equal(taken[k], named[k]) for k in named)


# ------------------------------------------------------------------ a VGG-style net: FedMA's VGG-9
#: VGG-9's eight hidden layers (six convolutions, two FC layers) at a few units each
TINY_VGG_WIDTHS = (3, 4, 4, 5, 5, 6, 6, 4)


def tiny_vgg(shape=(1, 8, 8), classes: int = 3) -> SplitModel:
    from flcore.trainmodel.vgg import vgg9

    torch.manual_seed(0)
    return vgg9(shape, classes, widths=TINY_VGG_WIDTHS)


def image_dataset(num_clients: int = 3, shape=(1, 8, 8), classes: int = 3, seed: int = 4):
    """Images around one prototype per class, each client holding two of the classes."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(classes, *shape, generator=g)
    clients = []
    for c in range(num_clients):
        splits = []
        for n in (12 + 4 * c, 6):
            y = torch.tensor([(c + k % 2) % classes for k in range(n)])
            splits += [prototypes[y] + 0.3 * torch.randn(n, *shape, generator=g), y]
        clients.append(tuple(splits))
    return dataset_from_arrays(clients, classes)


def permuted_vgg(server, params: torch.Tensor, perms: list[torch.Tensor]) -> torch.Tensor:
    """The same network with the units of hidden layer k reordered by ``perms[k]`` (the rows of the
    layer, the input channels or flattened input columns of the layer above)."""
    chain = server.matched.chain
    named = server.model.unflatten(params.clone(), params_only=False)
    out = {name: value.clone() for name, value in named.items()}
    below = None
    for layer, perm in zip(chain.hidden, perms):
        weight = named[layer.weight][perm]
        if below is not None:
            weight = weight[:, torch.as_tensor(input_columns(below.numpy(), layer.spatial))]
        out[layer.weight] = weight
        out[layer.bias] = named[layer.bias][perm]
        below = perm
    out[chain.head_weight] = named[chain.head_weight][:, torch.as_tensor(input_columns(below.numpy(), chain.head_spatial))]
    vector = torch.zeros_like(params)
    for name, view in server.model.unflatten(vector, params_only=False).items():
        view.copy_(out[name])
    return vector


def test_vgg_stack_of_permuted_clients_is_matched_back_exactly():
    """Client B is client A with the channels of all six convolutions and the neurons of both FC
    layers permuted (conv -> conv with and without pooling between, conv -> flatten -> FC): every
    layer is matched back to A's units and the global model computes A's function."""
    data = image_dataset(num_clients=2)
    server = build_server(make_args("FedMA", batch_size=4), data, tiny_vgg())
    chain = server.matched.chain
    assert [layer.spatial for layer in chain.hidden] == [1, 1, 1, 1, 1, 1, 1, 1]  # 8x8 pooled three times: 1x1
    g = torch.Generator().manual_seed(5)
    a = torch.randn(server.model.num_total, generator=g)
    views = server.model.unflatten(a, params_only=False)
    for layer in chain.hidden:  # units of norm 6: matching a copy clearly beats opening a new unit
        rows = torch.cat([views[layer.weight].reshape(layer.width, -1), views[layer.bias][:, None]], 1)
        scale = 6 / rows.norm(dim=1)
        views[layer.weight].mul_(scale.reshape(-1, *[1] * (views[layer.weight].dim() - 1)))
        views[layer.bias].mul_(scale)
    perms = [torch.randperm(w, generator=g) for w in chain.widths]
    b = permuted_vgg(server, a, perms)
    server.aggregate([upload(0, a, [3, 4, 1]), upload(1, b, [0, 5, 7])], server.make_package(0, [0, 1]))
    assert server.widths == list(TINY_VGG_WIDTHS)
    for k, perm in enumerate(perms):
        assert server.assignments[1][k].tolist() == server.assignments[0][k][perm.numpy()].tolist(), k
    x = torch.randn(5, 1, 8, 8, generator=g)
    server.matched.flat.module.eval()
    server.model.module.eval()
    expected = forward(server, a, x, server.model)
    torch.testing.assert_close(forward(server, server.global_params, x), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    torch.testing.assert_close(forward(server, b, x, server.model), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def test_tiny_vgg_trains_two_rounds_under_fedma():
    """Two rounds of the layer-wise phase on a VGG-9 of a few units a layer: every hidden layer is
    matched in round 1, the first convolution then frozen and sent, the layers above retrained."""
    data = image_dataset()
    server = build_server(make_args("FedMA", batch_size=4, local_epochs=2, global_rounds=2, eval_gap=1,
                                    local_learning_rate=0.05), data, tiny_vgg())
    server.train(progress=False)
    assert server.step == 2 and server.phase() == (2, 2)
    widths = server.history.extra_series["widths"]
    assert len(widths) == 2 and all(len(w) == 8 for w in widths)
    assert server.matched.flat.num_total == server.global_params.numel()
    frozen = server.clients[0].layer_masks[0]
    for client in server.clients:  # each trained its own model of the original widths from the matched layer
        local = server.state.get("local", client.index)
        assert local.numel() == server.model.num_total and torch.isfinite(local).all()
    result = server.run_round(2, evaluate=False)
    for update in result.updates:
        mask = server.clients[update.index].layer_masks[1]
        sent = result.package.payload(update.index)["model"]
        assert torch.equal(update.params[frozen | mask], sent)  # conv 1 and conv 2 came back as sent
        assert not torch.equal(update.params[~(frozen | mask)], server.clients[0].initial_params[~(frozen | mask)])
    accuracy = server.history.test_acc
    assert len(accuracy) >= 2 and all(0.0 <= a <= 1.0 for a in accuracy)


def test_resume_is_exact_for_a_vgg_stack(tmp_path, monkeypatch):
    """Resume across a width change with the tiny VGG-9 (registered for the test only)."""
    from flcore.registry import MODELS

    def factory(input_shape, num_classes, args=None):
        from flcore.trainmodel.vgg import vgg9

        return vgg9(input_shape, num_classes, widths=TINY_VGG_WIDTHS)

    monkeypatch.setitem(MODELS._entries, "VGG9-tiny", factory)
    widths = resumed_run_widths(tmp_path, monkeypatch, "-m", "VGG9-tiny")
    assert widths.shape == (4, 8) and (widths[-1] > TINY_VGG_WIDTHS).any()  # grown


def test_resized_layers_keep_their_class_so_the_cpu_layout_survives_growth():
    """The global model at new widths convolves channels-last as the working model does (it lost the
    layout once: plain nn.Conv2d layers, 3-4x slower pooling in every evaluation of the global model)."""
    from flcore.registry import MODELS, load_all
    from flcore.trainmodel.layout import ChannelsLastConv2d, use_channels_last

    load_all()
    torch.manual_seed(0)
    module = MODELS.get("CNN")((1, 28, 28), 10, None)
    assert use_channels_last(module) == 2
    chain = chain_of(module)
    grown = with_widths(module, [w + 1 for w in chain.widths])
    convs = [m for m in grown.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 2 and all(type(m) is ChannelsLastConv2d for m in convs)
    assert [m.out_channels for m in convs] == [w + 1 for w in chain.widths[:2]]
    for m in grown.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            torch.nn.init.normal_(m.weight, std=0.1)
            torch.nn.init.zeros_(m.bias)
    x = torch.randn(3, 1, 28, 28)
    inner = {}
    convs[0].register_forward_hook(lambda mod, inp, out: inner.setdefault("out", out))
    grown.eval()(x)
    assert inner["out"].is_contiguous(memory_format=torch.channels_last)
