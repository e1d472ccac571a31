"""FedCP: the local step (conditional policy with its drawn noise, personalised + frozen global head,
MMD² to the global body) and the aggregation of the head mixture by hand on the two-layer model,
the noise-free evaluated model, what is uploaded, partial participation, refusals, main."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fltest import build_server, make_args, random_dataset, run_main_two_rounds, run_round
from fltest import one_thread  # noqa: F401  (fixture)
from flcore.trainmodel.models import SplitModel
from twolayer import HIDDEN, two_layer_server
from utils.errors import FLError
from utils.seeding import torch_generator

SHARED = ("body.", "global_head.", "policy.")
HEAD = ("head.weight", "head.bias")


def mmd_by_hand(a, b):
    def kernel(u, v):
        d = ((u[:, None, :] - v[None, :, :]) ** 2).sum(-1)
        return sum(torch.exp(-d / (2 * s)) for s in (10.0, 15.0, 20.0, 50.0))
    return (kernel(a, a) + kernel(b, b) - 2 * kernel(a, b)).mean()


def split_output(p, h, noise, v_head):
    """W_i(s ⊙ h) + W^g((1 − s) ⊙ h), s the personal entry of a two-way softmax of (logits + noise),
    the policy's input h ⊙ v from the head ``v_head``."""
    v = v_head.sum(0)
    v = v / v.norm()
    u = (h * v) @ p["policy.net.0.weight"].T + p["policy.net.0.bias"]
    mean, var = u.mean(-1, keepdim=True), u.var(-1, unbiased=False, keepdim=True)
    u = torch.relu((u - mean) / torch.sqrt(var + 1e-5) * p["policy.net.1.weight"] + p["policy.net.1.bias"])
    personal, shared = u[:, :HIDDEN], u[:, HIDDEN:]
    s = torch.softmax(torch.stack([personal + noise, shared]), dim=0)[0]
    return ((s * h) @ p["head.weight"].T + p["head.bias"]
            + ((1 - s) * h) @ p["global_head.weight"].T.detach() + p["global_head.bias"].detach())


def local_round(p, x, y, plan, noise, lr, lam):
    """FedCP steps from the named tensors ``p`` (float64) on the minibatches ``plan``, step t with
    ``noise[t]`` (row j of the noise goes with row j of the minibatch)."""
    received_body = (p["body.weight"].clone(), p["body.bias"].clone())
    v_head = p["head.weight"].clone()  # v_i is fixed at the round's start
    for idx, step_noise in zip(plan, noise):
        xb, yb = x[idx], y[idx]
        leaves = {k: v.detach().clone().requires_grad_(True) for k, v in p.items()}
        h = xb @ leaves["body.weight"].T + leaves["body.bias"]
        out = split_output(leaves, h, step_noise[: len(xb)], v_head)
        loss = F.cross_entropy(out, yb) + lam * mmd_by_hand(h, xb @ received_body[0].T + received_body[1])
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        p = {k: (leaves[k] - lr * g).detach() if g is not None else leaves[k].detach() for k, g in zip(leaves, grads)}
    return p


def drawn_noise(server, client, rnd, steps):
    """The logistic noise the client draws from (seed, round, client): log u − log(1 − u)."""
    u = torch.rand(steps, server.args.batch_size, HIDDEN, generator=torch_generator(server.args.seed, "fedcp-policy",
                                                                                    rnd, client.cid))
    u = u.clamp(1e-6, 1 - 1e-6).double()
    return torch.log(u) - torch.log1p(-u)


@pytest.mark.parametrize("mix", [0.5, 1.0])
def test_two_rounds_by_hand(mix):
    lr, lam = 0.1, 2.0
    data, server = two_layer_server("FedCP", "-lam", str(lam), "--fedcp_head_mix", str(mix), local_learning_rate=lr)
    flat = server.model
    start = {k: v.double() for k, v in flat.unflatten(server.global_params).items()}
    assert torch.equal(start["global_head.weight"], start["head.weight"])  # the global head starts as the head
    xy = [(c.train_x.double(), c.train_y) for c in data.clients]
    heads = [{k: start[k] for k in HEAD}] * 2
    for rnd in range(2):
        trained = [local_round({**start, **heads[i]}, x, y, server.clients[i].batch_plan(rnd),
                               drawn_noise(server, server.clients[i], rnd, 2), lr, lam) for i, (x, y) in enumerate(xy)]
        for t in trained:  # frozen while training
            assert torch.equal(t["global_head.weight"], start["global_head.weight"])
        heads = [{k: t[k] for k in HEAD} for t in trained]
        uploads = [{**t, **{f"global_{k}": mix * t[k] + (1 - mix) * start[f"global_{k}"] for k in HEAD}} for t in trained]
        start = {k: (0.4 * uploads[0][k] + 0.6 * uploads[1][k]) if k.startswith(SHARED) else start[k] for k in start}
        run_round(server, rnd)
        got = {k: v.double() for k, v in flat.unflatten(server.global_params).items()}
        for k in start:
            assert torch.allclose(got[k], start[k], atol=1e-5), (rnd, k)
        for i, (x, _) in enumerate(xy):
            evaluated = {k: v.double() for k, v in flat.unflatten(server.eval_params(i)).items()}
            for k in HEAD:
                assert torch.allclose(evaluated[k], heads[i][k], atol=1e-5)
            # evaluation: the noise-free policy with this client's head
            h = x @ got["body.weight"].T + got["body.bias"]
            expected = split_output({**got, **heads[i]}, h, torch.zeros(()), heads[i]["head.weight"])
            flat.load(server.eval_params(i))
            flat.module.eval()
            assert torch.allclose(flat.module(x.float()).double(), expected, atol=1e-5)


def test_the_personal_head_is_uploaded_only_in_the_mixture_and_partial_participation():
    """The head's own place in the upload carries the server's values (W_i reaches the server only
    through m·W_i + (1 − m)·W^g in the global head's place, by the method's design)."""
    data, server = two_layer_server("FedCP", num_clients=4, join_ratio=0.5)
    private = ~server.shared_mask
    assert {seg.name for seg in server.model.segments if bool(private[seg.start])} == set(HEAD)
    initial = server.global_params.clone()
    round0 = run_round(server, 0)
    for u in round0.updates:
        assert u.extras == {} and u.shared_numel == int(server.shared_mask.sum())
        assert torch.equal(u.params[private], initial[private])
    for i in set(range(4)) - set(round0.cohort):
        assert server.state.get("private", i) is None
        assert torch.equal(server.eval_params(i), server.global_params)  # the initial head, the new rest
    kept = {i: server.state.get("private", i).clone() for i in round0.cohort}
    round1 = run_round(server, 1)
    for i in set(round0.cohort) - set(round1.cohort):
        assert torch.equal(server.state.get("private", i), kept[i])
    assert all(server.state.get("private", i) is not None for i in round1.cohort)


def test_noise_is_drawn_from_seed_round_and_client():
    _, server = two_layer_server("FedCP")
    client, package = server.clients[1], server.make_package(3, [0, 1])
    first, again = client.begin_round(package, 2), client.begin_round(package, 2)
    assert torch.equal(first["fedcp_noise"], again["fedcp_noise"])
    assert not torch.equal(first["fedcp_noise"], server.clients[0].begin_round(package, 2)["fedcp_noise"])
    assert not torch.equal(first["fedcp_noise"], client.begin_round(server.make_package(4, [0, 1]), 2)["fedcp_noise"])
    assert torch.allclose(first["fedcp_noise"].double(), drawn_noise(server, client, 3, 2), atol=1e-5)


def test_models_without_a_linear_head_split_are_refused_in_one_line():
    data = random_dataset(num_clients=2, dim=3, num_classes=2, sizes=[4, 6])
    with pytest.raises(FLError, match="body \\(features\\) and head \\(classifier\\)"):
        build_server(make_args("FedCP"), data, nn.Linear(3, 2))
    with pytest.raises(FLError, match="one Linear layer with a bias"):
        build_server(make_args("FedCP"), data, SplitModel(nn.Linear(3, 4), nn.Linear(4, 2, bias=False)))


def test_two_round_run_through_main(tmp_path):
    run_main_two_rounds(tmp_path, "FedCP", "-lam", "5")
