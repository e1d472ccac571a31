"""FedGen (Zhu et al., ICML 2021): the client's generated-feature term and the server's generator."""
from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn.functional as F

from fltest import assert_same_training, build_server, make_args, random_dataset, run_round
from fltest import one_thread  # noqa: F401
from utils.seeding import torch_generator

FLAGS = dict(batch_size=4, local_learning_rate=0.1, eval_auc=False, save_model=False, global_rounds=3, drop_last=True)


def data():
    return random_dataset(num_clients=3, dim=4, num_classes=3, sizes=[8, 12, 16], seed=5)


def fedgen(*flags: str, **settings):
    return build_server(make_args("FedGen", "-nd", "5", "-hd", "7", "-se", "3", *flags, **{**FLAGS, **settings}), data())


def test_alpha_zero_is_fedavg_exactly():
    gen = fedgen("--fedgen_alpha", "0")
    avg = build_server(make_args("FedAvg", **FLAGS), data())
    gen.train(progress=False)
    avg.train(progress=False)
    assert gen.trained_generator
    assert_same_training(avg, gen, exact=True)


def test_teacher_weights_by_label_share_and_by_samples():
    server = fedgen()
    counts = torch.tensor([[2.0, 0.0, 1.0], [1.0, 3.0, 0.0]], dtype=torch.float64)
    updates = [type("U", (), {"num_samples": 3})(), type("U", (), {"num_samples": 4})()]
    by_label = server.teacher_weights(updates, counts)
    assert torch.allclose(by_label, torch.tensor([[2 / 3, 0.0, 1.0], [1 / 3, 1.0, 0.0]], dtype=torch.float64))
    server.hp = dataclasses.replace(server.hp, fedgen_teacher="samples")
    assert torch.allclose(server.teacher_weights(updates, counts)[:, 0], torch.tensor([3 / 7, 4 / 7], dtype=torch.float64))


def test_client_step_by_hand_with_generated_features():
    server = fedgen("--fedgen_alpha", "0.5", batch_size=8, join_ratio=1.0)
    run_round(server, 0)
    assert server.trained_generator
    package = server.make_package(1, [0, 1, 2])
    assert package.nbytes(0) > server.global_params.numel() * 4  # the generator and prior are downloaded
    client = server.clients[2]
    job = client.plan_job(package)
    client.open_job(job)
    feats, labels = job.ctx["gen_features"], job.ctx["gen_labels"]
    assert feats.shape == (job.steps, 8, 4) and labels.shape == (job.steps, 8)
    w = package.global_params.clone()
    x_all, y_all = client.data.train_x, client.data.train_y
    for step, idx in enumerate(job.plan):
        w.requires_grad_(True)
        weight, bias = w[:12].view(3, 4), w[12:]
        loss = F.cross_entropy(x_all[idx] @ weight.T + bias, y_all[idx])
        loss = loss + 0.5 * F.cross_entropy(feats[step] @ weight.T + bias, labels[step])
        (grad,) = torch.autograd.grad(loss, w)
        w = (w - job.lr * grad).detach()
    params, _ = client.train_job(job, server.model)
    assert torch.allclose(params, w, atol=1e-6)
    update = client.finish_job(job, params, 0.0)
    assert torch.equal(update.extras["label_counts"], torch.bincount(y_all, minlength=3).float())


def test_generator_step_against_the_ensemble_objective_by_hand():
    server = fedgen("-se", "1", join_ratio=1.0)
    before = copy.deepcopy(server.generator.module)
    result = run_round(server, 0)
    counts = torch.stack([torch.bincount(server.clients[u.index].data.train_y, minlength=3) for u in result.updates]).double()
    alpha = counts / counts.sum(0, keepdim=True)
    draw = torch_generator(server.args.seed, "fedgen-server", 0)
    labels = torch.multinomial(counts.sum(0).float(), 4, replacement=True, generator=draw)
    before.train()
    z = before(before.draw_noise(4, draw, torch.device("cpu")), labels)
    logits = sum(alpha[k, labels].float().unsqueeze(1) * (z @ u.params[:12].view(3, 4).T + u.params[12:15])
                 for k, u in enumerate(result.updates))
    loss = F.cross_entropy(logits, labels)
    optimizer = torch.optim.Adam(before.parameters(), lr=server.hp.generator_learning_rate)
    loss.backward()
    optimizer.step()
    for (name, want), got in zip(before.named_parameters(), server.generator.module.parameters()):
        if name == "hidden.0.bias":
            # BatchNorm follows: its gradient is zero in exact arithmetic, so Adam's step there is
            # the sign of rounding noise and differs between any two ways of computing it
            continue
        assert torch.allclose(want, got, atol=1e-6), name


def test_uploads_carry_label_counts_and_round_zero_has_no_generator():
    server = fedgen(join_ratio=1.0)
    first = run_round(server, 0)
    assert "generator" not in first.package.extras
    # without a generator the zero-weighted term is not even built (nor, at α = 0, in any round)
    assert server.clients[0].begin_round(first.package, 3) == {}
    second = run_round(server, 1)
    assert set(server.clients[0].begin_round(second.package, 3)) == {"gen_features", "gen_labels", "gen_weight"}
    assert fedgen("--fedgen_alpha", "0").clients[0].begin_round(second.package, 3) == {}
    for update in first.updates:
        assert update.nbytes() == (server.global_params.numel() + 3) * 4
