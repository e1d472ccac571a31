"""GPFL: the local step (task, angle- and magnitude-level guidance, weight decay of GCE and CoV) and
the aggregation by hand on the two-layer model, with the conditions from the client's own trained
GCE (zero at first) or from the received one, the evaluated model, what is uploaded, partial
participation, refusals, main."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fltest import build_server, make_args, random_dataset, run_main_two_rounds, run_round
from fltest import one_thread  # noqa: F401  (fixture)
from flcore.trainmodel.models import SplitModel
from twolayer import CLASSES, HIDDEN, two_layer_server
from utils.errors import FLError

SHARED = ("body.", "gce.", "cov.")


def layer_norm(u, weight, bias):
    mean = u.mean(-1, keepdim=True)
    var = ((u - mean) ** 2).mean(-1, keepdim=True)
    return (u - mean) / torch.sqrt(var + 1e-5) * weight + bias


def valve(p, f, c):
    """ReLU((γ + 1) ⊙ f + β) with γ, β = LayerNorm(ReLU(Linear(c))) written out."""
    def branch(name):
        hidden = torch.relu(c @ p[f"cov.{name}.0.weight"].T + p[f"cov.{name}.0.bias"])
        return layer_norm(hidden, p[f"cov.{name}.2.weight"], p[f"cov.{name}.2.bias"])
    return torch.relu(f * (branch("gamma") + 1) + branch("beta"))


def conditions(gce, y):
    """[g, p_i] of a GCE for a client with labels y."""
    shares = torch.bincount(y, minlength=CLASSES).double() / len(y)
    return gce.mean(0), shares @ gce


def local_round(p, x, y, steps, lr, lam, mu, form, generic, personal):
    """``steps`` full-batch GPFL steps from the named tensors ``p`` (float64) with the conditions given."""
    received = p["gce.weight"].clone()
    p = {k: v.clone() for k, v in p.items()}
    trained = [k for k in p if k != "condition"]
    for _ in range(steps):
        leaves = {k: p[k].detach().clone().requires_grad_(True) for k in trained}
        f = x @ leaves["body.weight"].T + leaves["body.bias"]
        logits = valve(leaves, f, personal) @ leaves["head.weight"].T + leaves["head.bias"]
        guided = valve(leaves, f, generic)
        cosine = torch.stack([F.cosine_similarity(guided, e[None, :], dim=1) for e in leaves["gce.weight"]], 1)
        gap = guided - received[y]
        magnitude = gap.pow(2).sum().sqrt() if form == "batch" else gap.pow(2).sum(1).sqrt().mean()
        loss = F.cross_entropy(logits, y) + F.cross_entropy(cosine, y) + lam * magnitude
        grads = torch.autograd.grad(loss, [leaves[k] for k in trained])
        for k, g in zip(trained, grads):
            decay = mu * leaves[k].detach() if k.startswith(("gce.", "cov.")) else 0.0
            p[k] = (leaves[k] - lr * (g + decay)).detach()
    return p


@pytest.mark.parametrize("form,source", [("batch", "trained"), ("sample", "trained"), ("batch", "received")])
def test_two_rounds_by_hand(form, source):
    lr, lam, mu = 0.1, 0.3, 0.2
    data, server = two_layer_server("GPFL", "-lam", str(lam), "-mu", str(mu), "--gpfl_mlg", form,
                                    "--gpfl_condition", source, local_learning_rate=lr)
    flat = server.model
    start = {k: v.double() for k, v in flat.unflatten(server.global_params).items()}
    xy = [(c.train_x.double(), c.train_y) for c in data.clients]
    heads = [{k: start[k] for k in ("head.weight", "head.bias")}] * 2
    kept = [(torch.zeros(HIDDEN, dtype=torch.float64),) * 2] * 2  # "trained": zero before the first training
    for rnd in range(2):
        conds = kept if source == "trained" else [conditions(start["gce.weight"], y) for _, y in xy]
        trained = [local_round({**start, **heads[i]}, x, y, 2, lr, lam, mu, form, *conds[i])
                   for i, (x, y) in enumerate(xy)]
        heads = [{k: t[k] for k in ("head.weight", "head.bias")} for t in trained]
        kept = [conditions(t["gce.weight"], y) for t, (_, y) in zip(trained, xy)]  # each client's own trained GCE
        start = {k: (0.4 * trained[0][k] + 0.6 * trained[1][k]) if k.startswith(SHARED) else start[k] for k in start}
        run_round(server, rnd)
        got = {k: v.double() for k, v in flat.unflatten(server.global_params).items()}
        for k in start:
            assert torch.allclose(got[k], start[k], atol=1e-5), (rnd, k)
        for i, (x, y) in enumerate(xy):
            evaluated = {k: v.double() for k, v in flat.unflatten(server.eval_params(i)).items()}
            # evaluated with the p_i of its next round: its own trained GCE's, or the new global GCE's
            personal = kept[i][1] if source == "trained" else conditions(got["gce.weight"], y)[1]
            assert torch.allclose(evaluated["condition"], personal, atol=1e-6)
            for k in heads[i]:
                assert torch.allclose(evaluated[k], heads[i][k], atol=1e-5)
            f = x @ got["body.weight"].T + got["body.bias"]
            expected = valve(got, f, personal) @ heads[i]["head.weight"].T + heads[i]["head.bias"]
            flat.load(server.eval_params(i))
            flat.module.eval()
            assert torch.allclose(flat.module(x.float()).double(), expected, atol=1e-5)


def test_weight_decay_touches_only_gce_and_cov():
    _, server = two_layer_server("GPFL", "-mu", "0.5")
    client, n = server.clients[0], server.model.num_params
    w, g = torch.randn(n), torch.randn(n)
    decayed = server.model.mask(lambda seg: seg.name.startswith(("gce.", "cov.")))[:n]
    assert torch.equal(client.adjust_grad(w, g, {}), torch.where(decayed, g + 0.5 * w, g))
    assert not decayed.all() and decayed.any()


def test_heads_and_conditions_never_leave_the_client_and_partial_participation():
    data, server = two_layer_server("GPFL", num_clients=4, join_ratio=0.5)
    private = ~server.shared_mask
    names = {seg.name for seg in server.model.segments if bool(private[seg.start])}
    assert names == {"head.weight", "head.bias", "condition"}
    initial = server.global_params.clone()
    round0 = run_round(server, 0)
    for u in round0.updates:
        assert u.extras == {} and u.shared_numel == int(server.shared_mask.sum())
        assert torch.equal(u.params[private], initial[private])  # the server's own values, not the client's
    untrained = set(range(4)) - set(round0.cohort)
    for i in untrained:
        assert server.state.get("private", i) is None
        evaluated = server.eval_params(i)
        assert torch.equal(evaluated[server.shared_mask], server.global_params[server.shared_mask])
        assert torch.equal(server.model.unflatten(evaluated)["head.weight"], server.model.unflatten(initial)["head.weight"])
    kept = {i: server.state.get("private", i).clone() for i in round0.cohort}
    round1 = run_round(server, 1)
    for i in set(round0.cohort) - set(round1.cohort):
        assert torch.equal(server.state.get("private", i), kept[i])
    for i in round1.cohort:
        assert server.state.get("private", i) is not None


def test_models_without_a_linear_head_split_are_refused_in_one_line():
    data = random_dataset(num_clients=2, dim=3, num_classes=2, sizes=[4, 6])
    with pytest.raises(FLError, match="body \\(features\\) and head \\(classifier\\)"):
        build_server(make_args("GPFL"), data, nn.Linear(3, 2))
    with pytest.raises(FLError, match="one Linear layer"):
        build_server(make_args("GPFL"), data, SplitModel(nn.Linear(3, 4), nn.Sequential(nn.Linear(4, 2))))


def test_summary_and_shapes():
    _, server = two_layer_server("GPFL", "-lam", "0.01", "-mu", "0.1")
    assert server.summary() == {"lamda": 0.01, "mu": 0.1, "mlg": "batch", "condition": "trained"}
    assert server.model.unflatten(server.global_params)["gce.weight"].shape == (CLASSES, HIDDEN)


def test_two_round_run_through_main(tmp_path):
    run_main_two_rounds(tmp_path, "GPFL", "-lam", "0.01", "-mu", "0.1")
