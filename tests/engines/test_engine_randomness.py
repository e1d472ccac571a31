"""Per-client randomness depends on (seed, round, client), never on processing order or engine.

A client's update must be the same whether it is trained with the whole cohort, with the cohort
given in reverse, alone, or in another chunk; the batched engine draws nothing itself and leaves
the global torch RNG as the sequential engine does.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from flcore.capabilities import RNG_PROMISABLE, promise_covers
from flcore.clients.clientbase import Client
from flcore.engines import batched
from flcore.engines.batched import lean_job, leaves_rng_alone
from flcore.protocol import ClientUpdate
from flcore.registry import ALGORITHMS, MODELS, list_algorithms
from flcore.servers.serverbase import Server
from fltest import TinyLinear, assert_same_training, build_server, dataset_from_arrays, engine_run, make_args, random_dataset
from fltest import one_thread  # noqa: F401  (an autouse fixture: importing it switches it on here)

ATOL, RTOL = 2e-5, 1e-4


def _dataset():
    return random_dataset(num_clients=5, dim=6, num_classes=3, sizes=[7, 12, 25, 40, 17], seed=11)


def _server(engine: str, dataset, module=None, **flags):
    flags = {"batch_size": 5, "local_learning_rate": 0.1, **flags}
    args = make_args("FedAvg", engine=engine, **flags)
    if module is not None:
        torch.manual_seed(0)
        module = module(dataset)
    return build_server(args, dataset, module)


def _train(server, cohort, rnd=1):
    package = server.make_package(rnd, sorted(cohort))
    updates = server.engine.train([server.clients[i] for i in cohort], package)
    return {u.index: u for u in updates}, [u.index for u in updates]


@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_update_does_not_depend_on_order_or_company(engine):
    dataset = _dataset()
    full, order = _train(_server(engine, dataset), [0, 1, 2, 3, 4])
    reverse, rorder = _train(_server(engine, dataset), [4, 3, 2, 1, 0])
    alone, _ = _train(_server(engine, dataset), [2])
    pair, _ = _train(_server(engine, dataset, cohort_chunk=1), [3, 2]) if engine == "batched" else (None, None)
    assert order == [0, 1, 2, 3, 4] and rorder == [4, 3, 2, 1, 0]  # updates follow the given order
    for i in range(5):
        torch.testing.assert_close(reverse[i].params, full[i].params, atol=ATOL, rtol=RTOL)
        assert reverse[i].num_steps == full[i].num_steps
    torch.testing.assert_close(alone[2].params, full[2].params, atol=ATOL, rtol=RTOL)
    if pair is not None:
        torch.testing.assert_close(pair[2].params, full[2].params, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(pair[3].params, full[3].params, atol=ATOL, rtol=RTOL)


def test_engines_see_the_same_batches_and_leave_the_same_rng_state():
    dataset = _dataset()
    seen: dict[str, list] = {}
    states = {}
    for engine in ("sequential", "batched"):
        server = _server(engine, dataset)
        calls = []
        for client in server.clients:
            original = client.batch_plan

            def plan(rnd, epochs=None, _orig=original, _cid=client.cid):
                out = _orig(rnd, epochs)
                calls.append((_cid, rnd, [b.tolist() for b in out]))
                return out

            client.batch_plan = plan
        torch.manual_seed(123)
        _train(server, [0, 1, 2, 3, 4], rnd=3)
        seen[engine] = sorted(calls)
        states[engine] = torch.get_rng_state()
    assert seen["sequential"] == seen["batched"]
    assert torch.equal(states["sequential"], states["batched"])


def test_dropout_model_keeps_per_client_streams():
    # LeNet (dropout, BatchNorm): the batched engine trains it sequentially, and a client's
    # dropout masks come from its own (seed, round, client) stream: alone == in the cohort, bit for bit.
    g = torch.Generator().manual_seed(0)
    clients = [(torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 4, (n,), generator=g),
                torch.randn(3, 1, 28, 28, generator=g), torch.randint(0, 4, (3,), generator=g)) for n in (6, 9, 7)]
    dataset = dataset_from_arrays(clients, 4)
    lenet = lambda d: MODELS.get("LeNet")(d.input_shape, d.num_classes, None)  # noqa: E731
    full, _ = _train(_server("batched", dataset, lenet, batch_size=3), [0, 1, 2])
    reverse, _ = _train(_server("sequential", dataset, lenet, batch_size=3), [2, 1, 0])
    alone, _ = _train(_server("batched", dataset, lenet, batch_size=3), [1])
    for i in range(3):
        assert torch.equal(full[i].params, reverse[i].params)
    assert torch.equal(alone[1].params, full[1].params)
    # and the masks do differ between clients/rounds: a second round moves the model differently
    again, _ = _train(_server("batched", dataset, lenet, batch_size=3), [1], rnd=2)
    assert not torch.equal(again[1].params, alone[1].params)


class _NoisyClient(Client):
    """Hooks that draw from the global torch RNG (a random step scale, DP-style upload noise)."""

    def begin_round(self, package, steps):
        return {"scale": 1.0 + torch.rand(())}

    def adjust_grad(self, w, g, ctx):
        return g * ctx["scale"]

    def end_round(self, params, package, ctx, steps, loss):
        noisy = params + 0.1 * torch.randn(params.shape)
        return ClientUpdate(self.index, self.num_train, steps, noisy, loss)


class _NoisyServer(Server):
    client_cls = _NoisyClient


def test_hooks_drawing_from_the_global_rng_see_the_sequential_stream():
    dataset = _dataset()
    out = {}
    for engine in ("sequential", "batched"):
        args = make_args("FedAvg", engine=engine, batch_size=5, local_learning_rate=0.1)
        torch.manual_seed(0)
        server = _NoisyServer(args, dataset, TinyLinear(6, 3), torch.device("cpu"))
        updates, _ = _train(server, [3, 0, 4, 1])
        out[engine] = (updates, torch.get_rng_state())
        if engine == "batched":
            assert server.engine.stats["batched_clients"] == 4
    for i in (0, 1, 3, 4):
        torch.testing.assert_close(out["batched"][0][i].params, out["sequential"][0][i].params, atol=1e-6, rtol=1e-6)
    assert torch.equal(out["batched"][1], out["sequential"][1])


def test_per_client_seeding_is_torch_manual_seed_without_its_deferred_cuda_trace(monkeypatch):
    """``seed_global_rng`` gives the stream ``torch.manual_seed`` gives, and on a machine where CUDA
    is not in use it does not queue a CUDA seeding (whose stack trace cost 0.1-0.5 ms per client)."""
    from utils.seeding import derive_seed, seed_global_rng

    seed_global_rng(7, "local", 3, 11)
    ours = torch.rand(5)
    torch.manual_seed(derive_seed(7, "local", 3, 11))
    assert torch.equal(ours, torch.rand(5))
    if not torch.cuda.is_initialized():
        queued = []
        monkeypatch.setattr(torch.cuda.random, "_lazy_call", lambda *a, **k: queued.append(a))
        seed_global_rng(7, "local", 3, 11)
        assert queued == []
        torch.manual_seed(1)  # what the old per-client seeding did
        assert queued  # so the check above can fail: torch.manual_seed does queue one


def test_batched_engine_plans_plain_clients_lean_with_the_sequential_batches_and_rng(monkeypatch):
    """FedAvg's sequence reads the global RNG only in ``train_job``, so the batched engine plans its
    jobs lean (no per-client host cost): no per-client seeding or RNG state copies, batches
    drawn on the host, the last cohort client seeded once at the end. The batches and the RNG it
    leaves are the sequential engine's all the same."""
    dataset = _dataset()
    original_seed, original_plan = Client.seed_round, Client.shuffled_plan
    out = {}
    for engine in ("sequential", "batched"):
        server = _server(engine, dataset)
        seeded, planned = [], []

        def seed_round(self, rnd):
            seeded.append(self.cid)
            original_seed(self, rnd)

        def shuffled_plan(self, rnd, epochs, purpose="batches", device=None, stacked=False):
            plan = original_plan(self, rnd, epochs, purpose, device, stacked)
            planned.append((self.cid, [b.tolist() for b in plan], (device, stacked, type(plan).__name__)))
            return plan

        monkeypatch.setattr(Client, "seed_round", seed_round)
        monkeypatch.setattr(Client, "shuffled_plan", shuffled_plan)
        torch.manual_seed(123)
        updates, _ = _train(server, [3, 0, 4, 1, 2], rnd=3)
        out[engine] = (seeded, sorted(planned, key=lambda p: p[0]), torch.get_rng_state(), updates)
        monkeypatch.undo()
    (seq_seeded, seq_plans, seq_rng, seq_updates), (bat_seeded, bat_plans, bat_rng, bat_updates) = out.values()
    assert seq_seeded == [3, 0, 4, 1, 2] and bat_seeded == [2]  # the cohort's last, once
    assert [p[:2] for p in seq_plans] == [p[:2] for p in bat_plans]
    # (full batches only, --drop_last: the lean plans are [steps, B] tensors)
    assert {p[2] for p in seq_plans} == {(None, False, "list")} and {p[2] for p in bat_plans} == {("cpu", True, "Tensor")}
    assert torch.equal(seq_rng, bat_rng)
    for i in range(5):
        torch.testing.assert_close(bat_updates[i].params, seq_updates[i].params, atol=ATOL, rtol=RTOL)


class _PlainLookingClient(Client):
    def begin_round(self, package, steps):  # draws nothing, but the engine cannot know that
        return {}


def test_a_client_whose_sequence_may_read_the_rng_is_not_planned_lean():
    assert Client.capabilities.rng_free_sequence and not _PlainLookingClient.capabilities.rng_free_sequence
    server = _server("batched", _dataset())
    client = server.clients[0]
    package = server.make_package(1, [0])
    assert leaves_rng_alone(client)
    assert lean_job(client, package).rng is None
    client.batch_plan = lambda rnd, epochs=None, purpose="batches": []  # replaced on the object
    assert not leaves_rng_alone(client)
    with pytest.raises(RuntimeError, match="may read the global RNG"):
        lean_job(client, package)


class _AnchoredClient(Client):
    """Hooks of its own that draw nothing: a FedProx-like anchor and a scaled upload."""

    def begin_round(self, package, steps):
        return {"anchor": package.global_params}

    def adjust_grad(self, w, g, ctx):
        return g + 0.1 * (w - ctx["anchor"])

    def end_round(self, params, package, ctx, steps, loss):
        return ClientUpdate(self.index, self.num_train, steps, 0.5 * (params + package.global_params), loss)


class _PromisingClient(_AnchoredClient):
    hooks_draw_no_rng = True


class _PromisingPlanClient(_PromisingClient):
    def batch_plan(self, rnd, epochs=None, purpose="batches"):  # not a hook the promise covers
        return super().batch_plan(rnd, epochs, purpose)


def test_a_client_promising_its_hooks_draw_nothing_is_planned_lean_with_the_same_results():
    """``hooks_draw_no_rng`` lets a class with its own begin_round/end_round be planned lean; its
    updates and the RNG it leaves are those of the same class planned the usual way, to the bit."""
    assert not _AnchoredClient.capabilities.rng_free_sequence and _PromisingClient.capabilities.rng_free_sequence
    assert not _PromisingPlanClient.capabilities.rng_free_sequence
    dataset = _dataset()
    out = {}
    for client_cls in (_AnchoredClient, _PromisingClient):
        server_cls = type("S", (Server,), {"client_cls": client_cls})
        args = make_args("FedAvg", engine="batched", batch_size=5, local_learning_rate=0.1)
        torch.manual_seed(0)
        server = server_cls(args, dataset, TinyLinear(6, 3), torch.device("cpu"))
        assert leaves_rng_alone(server.clients[0]) == (client_cls is _PromisingClient)
        torch.manual_seed(5)
        updates, _ = _train(server, [3, 0, 4, 1])
        out[client_cls] = (updates, torch.get_rng_state())
        assert server.engine.stats["batched_clients"] == 4
    (usual, usual_rng), (lean, lean_rng) = out.values()
    for i in (0, 1, 3, 4):
        assert torch.equal(lean[i].params, usual[i].params) and lean[i].loss == usual[i].loss
    assert torch.equal(lean_rng, usual_rng)


class _RepromisedClient(_PromisingClient):
    def begin_round(self, package, steps):  # replaces a hook the inherited promise was made for
        return {"anchor": package.global_params}


def test_a_promise_covers_the_hooks_it_was_made_for_only():
    """A subclass that replaces a promised hook is not planned lean until it promises again: the
    inherited promise was made by someone who read the parent's hooks, not this one (FedRep's
    begin_round over FedBABU's)."""
    assert _PromisingClient.capabilities.rng_free_sequence and not _RepromisedClient.capabilities.rng_free_sequence
    again = type("Again", (_RepromisedClient,), {"hooks_draw_no_rng": True})
    withdrawn = type("Withdrawn", (_PromisingClient,), {"hooks_draw_no_rng": False})
    assert again.capabilities.rng_free_sequence and not withdrawn.capabilities.rng_free_sequence
    fedrep, fedbabu = ALGORITHMS.get("FedRep").client_cls, ALGORITHMS.get("FedBABU").client_cls
    assert (fedbabu.capabilities.rng_free_sequence and issubclass(fedrep, fedbabu)
            and not fedrep.capabilities.rng_free_sequence)


def _promises(client_cls) -> bool:
    """Whether ``client_cls`` promises ``hooks_draw_no_rng`` itself or for the hooks it has (not
    FedRep, which inherits FedBABU's promise and replaces its begin_round)."""
    return client_cls.hooks_draw_no_rng and ("hooks_draw_no_rng" in vars(client_cls) or promise_covers(client_cls))


#: the algorithms whose client class promises ``hooks_draw_no_rng`` (lean planning in the batched engine)
PROMISING = [a for a in list_algorithms() if _promises(ALGORITHMS.get(a).client_cls)]


def _guard_promised_hooks(monkeypatch, client_cls) -> list[str]:
    """Wrap ``client_cls``'s begin_round, start_point and end_round so that each raises when it
    leaves the global torch RNG otherwise than it found it (it drew from it); returns the calls."""
    calls: list[str] = []
    for name in RNG_PROMISABLE:
        def guarded(self, *args, _original=getattr(client_cls, name), _name=name, **kwargs):
            before = torch.get_rng_state()
            out = _original(self, *args, **kwargs)
            if not torch.equal(before, torch.get_rng_state()):
                raise AssertionError(f"{type(self).__name__}.{_name} drew from the global RNG")
            calls.append(_name)
            return out
        monkeypatch.setattr(client_cls, name, guarded)
    return calls


def _lean_and_usual(monkeypatch, client_cls, train):
    """``train()`` (a whole batched run, returning the server) with ``client_cls`` planned lean, then
    planned the usual way (seeded per client, RNG states kept); each with the RNG it leaves and
    whether any job was planned lean."""
    planned = []

    def recording(client, package):
        planned.append(True)
        return lean_job(client, package)

    monkeypatch.setattr(batched, "lean_job", recording)
    out = []
    for leaning in (True, False):
        monkeypatch.setattr(client_cls, "capabilities", dataclasses.replace(client_cls.capabilities,
                                                                            rng_free_sequence=leaning))
        planned.clear()
        server = train()
        out.append((server, torch.get_rng_state(), any(planned)))
    return out


@pytest.mark.parametrize("algo", PROMISING)
def test_a_promising_class_draws_nothing_in_its_hooks_and_lean_plans_change_no_bit(algo, monkeypatch):
    """For every class that promises ``hooks_draw_no_rng``: its hooks leave the global RNG alone in
    a whole run (evaluation included), and the batched engine's lean plans give the numbers and the
    RNG state of the same class planned the usual way, to the bit."""
    client_cls = ALGORITHMS.get(algo).client_cls
    assert client_cls.capabilities.rng_free_sequence, f"{client_cls.__name__}'s promise does not cover its hooks"
    calls = _guard_promised_hooks(monkeypatch, client_cls)
    (lean, lean_rng, any_lean), (usual, usual_rng, any_usual) = _lean_and_usual(
        monkeypatch, client_cls, lambda: engine_run(algo, "batched"))
    assert {"begin_round", "start_point", "end_round"} <= set(calls)
    assert not any_usual and any_lean == (lean.engine.stats["batched_clients"] > 0)
    assert_same_training(usual, lean, exact=True)
    assert usual.history.train_loss == lean.history.train_loss
    assert torch.equal(lean_rng, usual_rng)


class _FalselyPromisingClient(_AnchoredClient):
    """Promises, but its begin_round draws a random step scale from the global RNG."""

    hooks_draw_no_rng = True

    def begin_round(self, package, steps):
        return {"anchor": package.global_params, "scale": 1.0 + torch.rand(())}

    def adjust_grad(self, w, g, ctx):
        return ctx["scale"] * g + 0.1 * (w - ctx["anchor"])


def test_a_false_promise_is_caught_by_the_guard_and_by_the_lean_comparison(monkeypatch):
    """The checks of the test above fail for a class whose promised hook draws."""
    dataset = _dataset()
    server_cls = type("S", (Server,), {"client_cls": _FalselyPromisingClient})

    def train():
        args = make_args("FedAvg", engine="batched", batch_size=5, local_learning_rate=0.1, global_rounds=2,
                         eval_auc=False, save_model=False)
        torch.manual_seed(0)
        server = server_cls(args, dataset, TinyLinear(6, 3), torch.device("cpu"))
        server.train(progress=False)
        return server

    assert _FalselyPromisingClient.capabilities.rng_free_sequence
    (lean, lean_rng, any_lean), (usual, usual_rng, _) = _lean_and_usual(monkeypatch, _FalselyPromisingClient, train)
    assert any_lean and lean.engine.stats["batched_clients"] > 0
    assert not torch.equal(lean.global_params, usual.global_params) and not torch.equal(lean_rng, usual_rng)
    monkeypatch.undo()
    _guard_promised_hooks(monkeypatch, _FalselyPromisingClient)
    with pytest.raises(AssertionError, match="_FalselyPromisingClient.begin_round drew from the global RNG"):
        train()
