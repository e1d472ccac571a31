"""pFedMe: inner/outer steps and the β server step by hand, β = 1 is averaging, θ_i kept, main; the
paper's reading (every client trains, the cohort uploads) by hand and against the default."""
from __future__ import annotations

import h5py
import pytest
import torch

from flcore.servers.serverbase import weighted_average
from fltest import (assert_same_training, build_server, linear_grad, make_args, random_dataset, run_main_two_rounds,
                    run_round, trained_server, two_client_server)
from fltest import one_thread  # noqa: F401  (an autouse fixture: importing it switches it on here)


def by_hand(data, g, lr, lrp, lam, mu, inner):
    """Each client's upload w and personal model θ after 2 local steps from ``g`` (K = ``inner``
    inner steps on θ per outer step on w), in float64."""
    uploads, personal = [], []
    for client in data.clients:
        x, y = client.train_x.double(), client.train_y
        theta, w = g.clone(), g.clone()
        for _ in range(2):
            for _ in range(inner):
                theta = theta - lrp * (linear_grad(theta, x, y, 2) + lam * (theta - w) + mu * theta)
            w = w - lr * lam * (w - theta)
        uploads.append(w)
        personal.append(theta)
    return uploads, personal


def test_local_and_server_steps_match_hand_computation():
    # K = 2 inner steps per local epoch.
    lr, lrp, lam, mu, beta, inner = 0.2, 0.1, 2.0, 0.01, 0.5, 2
    data, server = two_client_server("pFedMe", "-K", str(inner), "-lrp", str(lrp), "-lam", str(lam), "--pfedme_mu",
                                     str(mu), "-bt", str(beta), seed=1, local_learning_rate=lr)
    g = server.global_params.double()
    uploads, personal = by_hand(data, g, lr, lrp, lam, mu, inner)
    updates = run_round(server, 0).updates
    for i, update in enumerate(updates):
        assert update.num_steps == 2
        assert torch.allclose(update.params.double(), uploads[i], atol=1e-6, rtol=0)
        assert torch.allclose(server.eval_params(i).double(), personal[i], atol=1e-6, rtol=0)
    mean = 0.4 * uploads[0] + 0.6 * uploads[1]
    assert torch.allclose(server.global_params.double(), (1 - beta) * g + beta * mean, atol=1e-6, rtol=0)


def test_beta_one_is_plain_averaging_and_beta_zero_freezes():
    data = random_dataset(num_clients=3, dim=3, num_classes=2, seed=2)
    server = build_server(make_args("pFedMe", "-bt", "1", batch_size=3, local_learning_rate=0.1), data)
    for rnd in range(2):
        updates = run_round(server, rnd).updates
        assert torch.equal(server.global_params, weighted_average(updates))
    frozen = build_server(make_args("pFedMe", "-bt", "0", batch_size=3, local_learning_rate=0.1), data)
    start = frozen.global_params.clone()
    run_round(frozen, 0)
    assert torch.equal(frozen.global_params, start)


def test_personal_models_survive_partial_participation():
    data = random_dataset(num_clients=3, dim=3, num_classes=2, sizes=[6, 9, 7], seed=3)
    server = build_server(make_args("pFedMe", batch_size=3, local_learning_rate=0.1), data)
    assert all(server.eval_params(i) is server.global_params for i in range(3))
    run_round(server, 0, [0, 1])
    theta1 = server.state.get("personal", 1).clone()
    run_round(server, 1, [0])
    run_round(server, 2, [0, 2])
    assert torch.equal(server.eval_params(1), theta1)  # kept while away
    assert not torch.equal(server.eval_params(0), server.eval_params(2))
    assert server.eval_params(2) is not server.global_params
    assert [c.participations for c in server.clients] == [3, 1, 1]


def test_two_round_run_through_main(tmp_path):
    path = run_main_two_rounds(tmp_path, "pFedMe", "-K", "2")
    with h5py.File(path, "r") as f:
        acc = f["rs_test_acc"][:]
        acc_global = f["rs_test_acc_global"][:]
    assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
    assert len(acc_global) == 3


# ------------------------------------------- who trains: the cohort (default) or every client (paper)
def test_paper_reading_by_hand_an_unsampled_client_updates_its_personal_model():
    # Cohort [0]: client 0 uploads w_0 (the mean of one upload), client 1 also runs the round from g.
    lr, lrp, lam, mu, beta, inner = 0.2, 0.1, 2.0, 0.01, 0.5, 2
    flags = ("-K", str(inner), "-lrp", str(lrp), "-lam", str(lam), "--pfedme_mu", str(mu), "-bt", str(beta))
    data, server = two_client_server("pFedMe", *flags, "--pfedme_all_clients", "True", seed=1,
                                     local_learning_rate=lr)
    _, cohort_only = two_client_server("pFedMe", *flags, seed=1, local_learning_rate=lr)
    g = server.global_params.double()
    uploads, personal = by_hand(data, g, lr, lrp, lam, mu, inner)
    updates = run_round(server, 0, [0]).updates
    run_round(cohort_only, 0, [0])
    assert [u.index for u in updates] == [0]
    expected_global = (1 - beta) * g + beta * uploads[0]
    for run in (server, cohort_only):
        assert torch.allclose(run.global_params.double(), expected_global, atol=1e-6, rtol=0)
        assert torch.allclose(run.eval_params(0).double(), personal[0], atol=1e-6, rtol=0)
    assert torch.allclose(server.eval_params(1).double(), personal[1], atol=1e-6, rtol=0)
    assert cohort_only.eval_params(1) is cohort_only.global_params  # never trained by default
    assert [c.participations for c in server.clients] == [1, 1]
    assert [c.participations for c in cohort_only.clients] == [1, 0]
    nbytes = server.global_params.numel() * server.global_params.element_size()
    assert server.history.extra_series["bytes_down_unsampled"] == [nbytes]


def test_both_readings_agree_under_full_participation():
    data = random_dataset(num_clients=3, dim=3, num_classes=2, sizes=[6, 9, 7], seed=4)
    runs = [trained_server(data, "pFedMe", "-K", "2", "--pfedme_all_clients", flag, global_rounds=3, batch_size=3,
                           local_learning_rate=0.1, eval_auc=False) for flag in ("False", "True")]
    default, paper = runs
    assert_same_training(default, paper, exact=True)
    assert default.history.bytes_up == paper.history.bytes_up
    assert default.history.bytes_down == paper.history.bytes_down
    assert paper.history.extra_series["bytes_down_unsampled"] == [0, 0, 0]


def test_partial_participation_every_client_trains_and_only_the_cohort_uploads():
    data = random_dataset(num_clients=4, dim=3, num_classes=2, sizes=[6, 9, 7, 8], seed=5)
    settings = dict(global_rounds=3, batch_size=3, local_learning_rate=0.1, join_ratio=0.5, eval_auc=False)
    default = trained_server(data, "pFedMe", "-K", "2", **settings)
    paper = trained_server(data, "pFedMe", "-K", "2", "--pfedme_all_clients", "True", **settings)
    # the same cohorts upload the same w_i: the global model and the upload records are those of the default
    assert torch.equal(default.global_params, paper.global_params)
    assert paper.history.clients_per_round == default.history.clients_per_round == [2, 2, 2]
    assert paper.history.bytes_up == default.history.bytes_up
    assert paper.history.bytes_down == default.history.bytes_down
    # 2 of the 4 clients are sampled: the broadcast to the other 2 costs what the cohort downloads
    assert paper.history.extra_series["bytes_down_unsampled"] == paper.history.bytes_down
    assert [c.participations for c in paper.clients] == [3, 3, 3, 3]
    assert sum(c.participations for c in default.clients) == 6
    assert sorted(paper.state.indices("personal")) == [0, 1, 2, 3]
    # a client outside the last cohort holds the θ it computed in that round, not an older one
    last_cohort = default.select_clients(2)
    outside = next(i for i in range(4) if i not in last_cohort)
    assert not torch.equal(paper.eval_params(outside), default.eval_params(outside))


def test_paper_reading_through_main_records_the_broadcast(tmp_path):
    path = run_main_two_rounds(tmp_path, "pFedMe", "-K", "2", "-jr", "0.5", "--pfedme_all_clients")
    with h5py.File(path, "r") as f:
        down, unsampled = f["rs_bytes_down"][:], f["rs_bytes_down_unsampled"][:]
        assert list(f["rs_clients_per_round"][:]) == [2, 2]
    assert len(unsampled) == 2 and (unsampled == down).all()  # 2 of 4 clients sampled, 2 not


@pytest.mark.parametrize("engine", ["threaded", "batched"])
def test_paper_reading_gives_the_sequential_engines_results(engine):
    data = random_dataset(num_clients=4, dim=3, num_classes=2, sizes=[6, 9, 7, 8], seed=6)
    settings = dict(global_rounds=2, batch_size=3, local_learning_rate=0.1, join_ratio=0.5, eval_auc=False)
    reference = trained_server(data, "pFedMe", "--pfedme_all_clients", "True", engine="sequential", **settings)
    other = trained_server(data, "pFedMe", "--pfedme_all_clients", "True", engine=engine, **settings)
    assert_same_training(reference, other, exact=True)
