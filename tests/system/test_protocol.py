"""The local-training protocol: the one per-client sequence, the loss hook, partial sharing,
per-client payloads and ``Server.run_round``, each checked by hand and on every engine."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flcore.clients.clientbase import Client
from flcore.protocol import RoundPackage
from flcore.servers.serverbase import Server
from flcore.protocol import RoundResult
from fltest import TinyLinear, assert_same_training, make_args, random_dataset, run_round
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)

ENGINES = ["sequential", "threaded", "batched"]


def build(server_cls: type[Server], dataset, engine: str = "sequential", **flags) -> Server:
    settings = dict(engine=engine, batch_size=4, local_learning_rate=0.1, eval_auc=False, save_model=False,
                    global_rounds=3, join_ratio=0.6)
    if engine == "threaded":
        settings["workers"] = 2
    settings.update(flags)
    args = make_args("FedAvg", **settings)
    torch.manual_seed(0)
    module = TinyLinear(dataset.input_shape[0], dataset.num_classes)
    return server_cls(args, dataset, module, torch.device("cpu"))


def data(num_clients: int = 5):
    return random_dataset(num_clients=num_clients, dim=4, num_classes=3, sizes=[9, 12, 16, 8, 20][:num_clients], seed=3)


# ------------------------------------------------------------------ loss hook
class SplitCEClient(Client):
    """Cross-entropy written through the body/head split: the same arithmetic as the base loss."""

    vmappable_loss = True

    def local_loss(self, net, x, y, ctx):
        return F.cross_entropy(net.head(net.features(x)), y)


class SplitCEServer(Server):
    client_cls = SplitCEClient


class AnchoredClient(Client):
    """CE + μ/2 · mean squared distance between the logits and those of the round's global model."""

    vmappable_loss = True
    mu = 0.7

    def begin_round(self, package, steps):
        return {"anchor": package.global_params}

    def local_loss(self, net, x, y, ctx):
        logits = net(x)
        return F.cross_entropy(logits, y) + 0.5 * self.mu * (logits - net.at(ctx["anchor"])(x)).pow(2).mean()


class AnchoredServer(Server):
    client_cls = AnchoredClient


def test_a_loss_hook_through_features_and_head_is_fedavg_bit_for_bit():
    ref = build(Server, data())
    hooked = build(SplitCEServer, data())
    ref.train(progress=False)
    hooked.train(progress=False)
    assert_same_training(ref, hooked, exact=True)


def test_a_loss_hook_with_another_model_against_a_hand_computation():
    dataset = data(2)
    server = build(AnchoredServer, dataset, batch_size=100, join_ratio=1.0, drop_last=False, local_epochs=2)
    w0 = server.global_params.clone()
    result = run_round(server, 0, cohort=[0, 1])

    def logits(w, x):
        weight, bias = w[:12].view(3, 4), w[12:]
        return x @ weight.T + bias

    for update in result.updates:
        client = dataset.clients[update.index]
        x, y = client.train_x, client.train_y
        w = w0.clone()
        for _ in range(2):  # two full-batch steps
            w.requires_grad_(True)
            out = logits(w, x)
            loss = F.cross_entropy(out, y) + 0.5 * AnchoredClient.mu * (out - logits(w0, x)).pow(2).mean()
            (grad,) = torch.autograd.grad(loss, w)
            w = (w - 0.1 * grad).detach()
        assert torch.allclose(update.params, w, atol=1e-6)
    assert torch.equal(server.global_params[:0], w0[:0])  # the anchor itself was not written to
    assert torch.equal(result.package.global_params, w0)


@pytest.mark.parametrize("engine", ["threaded", "batched"])
def test_a_loss_hook_gives_the_sequential_numbers_on_every_engine(engine):
    ref = build(AnchoredServer, data())
    other = build(AnchoredServer, data(), engine=engine)
    ref.train(progress=False)
    other.train(progress=False)
    stats = other.engine.stats
    assert stats.get("sequential_clients", 0) <= 3  # only cohorts of one run on the main thread
    assert_same_training(ref, other, exact=engine == "threaded", atol=2e-6, rtol=1e-5)


def test_a_loss_hook_not_declared_vmappable_is_trained_sequentially_by_the_batched_engine():
    class Unsure(AnchoredClient):
        vmappable_loss = False

    class UnsureServer(Server):
        client_cls = Unsure

    ref = build(UnsureServer, data())
    other = build(UnsureServer, data(), engine="batched")
    ref.train(progress=False)
    other.train(progress=False)
    assert other.engine.stats["batched_clients"] == 0
    assert_same_training(ref, other, exact=True)


# ------------------------------------------------------------------ partial sharing
class HeadWeightOnlyServer(Server):
    """Shares the head's weight; the bias is each client's own."""

    shared = ("head.weight",)


def test_private_parts_never_leave_the_client_and_are_not_counted_as_uploaded():
    dataset = data(3)
    server = build(HeadWeightOnlyServer, dataset, join_ratio=1.0)
    mask = server.shared_mask
    assert int(mask.sum()) == 12 and not bool(mask[12:].any())
    w0 = server.global_params.clone()
    first = run_round(server, 0)
    # the global bias is still the initial one; each client keeps its trained bias
    assert torch.equal(server.global_params[12:], w0[12:])
    for i in range(3):
        private = server.state.get("private", i)
        assert private.shape == (3,) and not torch.equal(private, w0[12:])
        assert torch.equal(server.eval_params(i)[12:], private)
        assert torch.equal(server.eval_params(i)[:12], server.global_params[:12])
    for update in first.updates:  # the upload carries the server's values in the private part
        assert torch.equal(update.params[12:], w0[12:])
        assert update.nbytes() == 12 * 4
    # a client's private part has no influence on the aggregate
    twin = build(HeadWeightOnlyServer, dataset, join_ratio=1.0)
    run_round(twin, 0)
    twin.state.set("private", 1, twin.state.get("private", 1) + 5.0)
    run_round(server, 1)
    second = run_round(twin, 1)
    assert torch.equal(server.global_params[12:], twin.global_params[12:])
    assert not torch.equal(server.eval_params(1), twin.eval_params(1))
    assert second.package.nbytes(0) == 12 * 4  # only the shared part is sent


def test_bytes_up_in_the_history_count_only_shared_parts():
    server = build(HeadWeightOnlyServer, data(3), join_ratio=1.0, global_rounds=2)
    server.train(progress=False)
    assert server.history.bytes_up == [3 * 12 * 4] * 2
    assert server.history.bytes_down == [3 * 12 * 4] * 2


@pytest.mark.parametrize("engine", ["threaded", "batched"])
def test_partial_sharing_gives_the_sequential_numbers_on_every_engine(engine):
    ref = build(HeadWeightOnlyServer, data())
    other = build(HeadWeightOnlyServer, data(), engine=engine)
    ref.train(progress=False)
    other.train(progress=False)
    assert_same_training(ref, other, exact=engine == "threaded", atol=2e-6, rtol=1e-5)


def test_sharing_everything_is_fedavg():
    class AllServer(Server):
        shared = ("head.",)  # the whole TinyLinear

    ref, other = build(Server, data()), build(AllServer, data())
    assert other.shared_mask is None
    ref.train(progress=False)
    other.train(progress=False)
    assert_same_training(ref, other, exact=True)


def test_an_unknown_shared_part_is_refused():
    class Odd(Server):
        shared = "tail"

    with pytest.raises(ValueError, match="unknown shared part"):
        build(Odd, data())


# ------------------------------------------------------------------ per-client payloads
class PayloadClient(Client):
    def start_point(self, package):
        return package.payload(self.index)["start"]


class PayloadServer(Server):
    client_cls = PayloadClient

    def make_package(self, rnd, cohort):
        return self.package(rnd, cohort, payloads={i: {"start": self.global_params + i} for i in cohort})


def test_each_client_gets_its_own_payload_and_downloads_are_counted_per_client():
    dataset = data(3)
    server = build(PayloadServer, dataset, join_ratio=1.0, local_learning_rate=1e-9)
    w0 = server.global_params.clone()
    result = run_round(server, 0)
    for update in result.updates:
        assert torch.allclose(update.params, w0 + update.index, atol=1e-5)
    size = w0.numel() * 4
    assert result.package.nbytes(1) == 2 * size
    assert result.package.total_nbytes() == 3 * 2 * size
    assert server.state.names() == []  # nothing passes through the state store as a message


# ------------------------------------------------------------------ run_round and callbacks
def test_run_round_reports_what_the_round_did_and_callbacks_can_stop_the_run():
    server = build(Server, data(), global_rounds=5)
    seen: list[RoundResult] = []

    def stop_after_round_one(srv, result):
        seen.append(result)
        return result.round == 1

    history = server.train(progress=False, callbacks=[stop_after_round_one])
    assert [r.round for r in seen] == [0, 1]
    assert all(r.trained and r.evaluation is not None and r.seconds >= r.eval_seconds for r in seen)
    # two training rounds, and the model the run stops with is evaluated (round 2) as a 2-round run ends
    assert len(history.round_time) == 2 and len(history.test_acc) == 3 and history.eval_rounds == [0, 1, 2]
    assert history.stop_reason == "stopped after round 1: a callback stopped it"
    assert seen[0].cohort == seen[0].package.cohort and len(seen[0].updates) == len(seen[0].cohort)


def test_the_sequence_counts_each_participation_once_on_every_engine():
    for engine in ENGINES:
        server = build(Server, data(), engine=engine, join_ratio=1.0, global_rounds=2)
        server.train(progress=False)
        assert [c.participations for c in server.clients] == [2] * 5, engine


def test_a_job_can_be_opened_later_with_the_rng_its_plan_left():
    """Engines plan every job first and open them later: the hooks still see the sequential stream."""

    class Drawing(Client):
        def begin_round(self, package: RoundPackage, steps: int):
            return {"noise": torch.rand(())}

    class DrawingServer(Server):
        client_cls = Drawing

    server = build(DrawingServer, data(2), join_ratio=1.0)
    package = server.make_package(0, [0, 1])
    a, b = (server.clients[i].plan_job(package) for i in (0, 1))
    server.clients[1].open_job(b)
    server.clients[0].open_job(a)
    c = server.clients[0].plan_job(package)
    server.clients[0].open_job(c)
    assert torch.equal(a.ctx["noise"], c.ctx["noise"])



def test_local_training_sends_and_uploads_nothing():
    """Local never communicates: no bytes either way (the common initial model is the run's seed,
    as for FD and FedProto), and a client's first round is the same local SGD as a FedAvg client's."""
    from flcore.servers.serverlocal import LocalServer
    server = build(LocalServer, data(3), join_ratio=1.0, global_rounds=2)
    server.train(progress=False)
    assert server.history.bytes_up == [0, 0] and server.history.bytes_down == [0, 0]
    local, fedavg = build(LocalServer, data(3), join_ratio=1.0), build(Server, data(3), join_ratio=1.0)
    run_round(local, 0)
    for update in run_round(fedavg, 0).updates:
        assert torch.equal(local.state.get("personal", update.index), update.params)
