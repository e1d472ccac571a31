"""``--weight_decay λ``: L2 weight decay in the clients' local SGD as ``torch.optim.SGD``'s
(g ← g + λ·w, before the algorithm's term and the momentum buffer)."""
from __future__ import annotations

import pytest
import torch

from fltest import assert_same_training, build_server, engine_run, linear_grad, make_args, random_dataset, run_round
from fltest import one_thread  # noqa: F401  (fixture)
from utils.errors import FLError


@pytest.mark.parametrize("beta", [0.0, 0.9])
def test_three_steps_by_hand_match_torch_sgd(beta):
    data = random_dataset(num_clients=1, dim=2, num_classes=2, sizes=[6], seed=4)
    lr, decay = 0.5, 0.1
    server = build_server(make_args("FedAvg", batch_size=6, local_epochs=3, drop_last=False, local_learning_rate=lr,
                                    local_momentum=beta, weight_decay=decay), data)
    x, y = data.clients[0].train_x.double(), data.clients[0].train_y
    w0 = server.global_params.double()
    # torch.optim.SGD itself, on the same flat linear model
    w = w0.clone().requires_grad_(True)
    opt = torch.optim.SGD([w], lr=lr, momentum=beta, weight_decay=decay)
    for _ in range(3):
        opt.zero_grad()
        w.grad = linear_grad(w, x, y, 2)
        opt.step()
    run_round(server, 0)
    torch.testing.assert_close(server.global_params.double(), w.detach(), atol=1e-5, rtol=1e-5)
    without = build_server(make_args("FedAvg", batch_size=6, local_epochs=3, drop_last=False, local_learning_rate=lr,
                                     local_momentum=beta), data)
    run_round(without, 0)
    assert (without.global_params.double() - w.detach()).abs().max() > 1e-3  # the term changed the result


@pytest.mark.parametrize("algo, beta", [("FedAvg", 0.0), ("FedAvg", 0.9), ("FedProx", 0.9)])  # per-parameter; flat adjust_grad
def test_batched_engine_adds_the_decay_itself(algo, beta):
    """The batched engine trains decayed clients (it adds λ·w to its per-client gradients), with the
    sequential engine's results to its usual tolerance, and not the undecayed ones."""
    ref = engine_run(algo, "sequential", weight_decay=0.05, local_momentum=beta)
    out = engine_run(algo, "batched", weight_decay=0.05, local_momentum=beta)
    assert out.engine.stats["batched_clients"] > 0 and out.engine.stats["sequential_clients"] == 0
    assert_same_training(ref, out, atol=2e-5, rtol=1e-4)  # the batched engine's tolerance (tests/engines)
    undecayed = engine_run(algo, "sequential", local_momentum=beta)
    assert (undecayed.global_params - out.global_params).abs().max() > 1e-3


def test_own_optimiser_is_refused_in_one_line():
    data = random_dataset(num_clients=2, dim=2, num_classes=2)
    with pytest.raises(FLError, match="--weight_decay: .* own optimiser"):
        build_server(make_args("pFedMe", weight_decay=0.01), data)


def test_weight_decay_composes_with_dp_sgd():
    """-dp --weight_decay: the decay is the local-step chain's "term" link, added to DP-SGD's gradient.
    With no noise, a clipping bound no gradient reaches and PFLlib's shuffled batches, DP-SGD's mean of
    per-sample gradients is the batch gradient, so the run is the non-private run with the same decay
    (to float rounding), and a different one without it."""
    data = random_dataset(num_clients=3, dim=4, num_classes=3, seed=1)
    common = dict(global_rounds=2, batch_size=4, local_learning_rate=0.1, eval_auc=False, engine="sequential")
    dp = ["-dp", "-dps", "0", "--dp_clip", "1e6", "--dp_sampling", "shuffle"]
    private = build_server(make_args("FedAvg", *dp, weight_decay=0.05, **common), data)
    name = private.clients[0].local_step.name
    assert name.startswith("DP-SGD") and name.endswith(" then weight_decay"), name
    private.train(progress=False)
    plain = build_server(make_args("FedAvg", weight_decay=0.05, **common), data)
    plain.train(progress=False)
    undecayed = build_server(make_args("FedAvg", *dp, **common), data)
    undecayed.train(progress=False)
    torch.testing.assert_close(private.global_params, plain.global_params, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(private.global_params, undecayed.global_params, atol=1e-4)
