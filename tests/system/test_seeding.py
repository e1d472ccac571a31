"""utils/seeding.py: the streams keyed by (seed, purpose, round, client) are those NumPy's
SeedSequence gives, bit for bit, whichever way ``derive_seed`` computes them (the per-(round,
client) words are mixed without NumPy: SeedSequence cost ~10 us per client stream)."""
from __future__ import annotations

import random
import zlib

import numpy as np
import pytest
import torch

import utils.seeding as seeding
from fltest import engine_run
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from utils.seeding import derive_seed


def seed_sequence_seed(seed: int, purpose: str, *keys: int) -> int:
    """The derivation as it was written before: NumPy's SeedSequence over the 32-bit words."""
    words = [int(seed) & 0xFFFFFFFF, zlib.crc32(purpose.encode()), *(int(k) & 0xFFFFFFFF for k in keys)]
    state = np.random.SeedSequence(words).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def test_equals_numpy_seed_sequence_on_random_words():
    draw = random.Random(28)
    edge = [0, 1, 2**31, 2**32 - 1, -1, 2**40 + 3]
    for _ in range(3000):
        seed = draw.choice(edge + [draw.getrandbits(32)])
        keys = [draw.choice(edge + [draw.getrandbits(32), draw.randrange(1000)]) for _ in range(draw.randrange(4))]
        purpose = draw.choice(["local", "batches", "select", "dp", ""])
        assert derive_seed(seed, purpose, *keys) == seed_sequence_seed(seed, purpose, *keys), (seed, purpose, keys)


@pytest.mark.parametrize("args, value", [
    # values printed by the NumPy-only derive_seed at commit c8e69b3: runs before and after agree
    ((0, "local", 0, 0), 3747655756320913814), ((0, "batches", 5, 17), 4944483784899471441),
    ((4294967295, "local", 999, 999), 1982901460518482906), ((7, "select", 3), 149233462810665856),
    ((1, "init"), 3822240993198261327), ((2, "dp", 4, 9, 11), 4304000679320311498),
])
def test_pinned_values_of_earlier_releases(args, value):
    assert derive_seed(*args) == value


def test_a_clients_batches_and_dropout_stream_are_the_seed_sequence_ones():
    """plan_job's minibatches and global RNG, for client c in round t, against values computed the
    old way (SeedSequence, then a fresh generator)."""
    from flcore.engines.batched import lean_job
    from fltest import build_server, make_args, random_dataset

    server = build_server(make_args("FedAvg", batch_size=4, seed=5),
                          random_dataset(num_clients=3, dim=4, num_classes=2, sizes=[9, 13, 6], seed=2))
    package = server.make_package(7, [0, 1, 2])
    for client in server.clients:
        job = client.plan_job(package)
        order = torch.randperm(client.num_train, generator=torch.Generator().manual_seed(
            seed_sequence_seed(5, "batches", 7, client.cid)))
        expected = [order[i * 4:(i + 1) * 4] for i in range(client.num_train // 4)]
        assert len(job.plan) == len(expected) and all(torch.equal(a, b) for a, b in zip(job.plan, expected))
        assert torch.equal(job.rng[0], torch.Generator().manual_seed(seed_sequence_seed(5, "local", 7, client.cid)).get_state())
        lean = lean_job(client, package)  # the batched engine's: on the host, the RNG left alone
        assert lean.rng is None and len(lean.plan) == len(expected)
        assert all(torch.equal(a, b) and a.device.type == "cpu" for a, b in zip(lean.plan, expected))


def test_every_epochs_batches_with_a_short_last_one():
    """``--drop_last False``: each epoch's permutation (one generator per round and client) in
    batches of the batch size and a shorter last one."""
    from fltest import build_server, make_args, random_dataset

    server = build_server(make_args("FedAvg", batch_size=4, seed=5, drop_last=False),
                          random_dataset(num_clients=3, dim=4, num_classes=2, sizes=[9, 12, 3], seed=2))
    for client in server.clients:
        n = client.num_train
        generator = torch.Generator().manual_seed(seed_sequence_seed(5, "batches", 7, client.cid))
        expected = []
        for _ in range(2):
            order = torch.randperm(n, generator=generator)
            expected += [order[i:i + 4] for i in range(0, n, 4)]
        plan = client.shuffled_plan(7, 2)
        assert [b.tolist() for b in plan] == [b.tolist() for b in expected]
        stacked = client.shuffled_plan(7, 2, stacked=True)  # the rows of one tensor where no batch is short
        assert [b.tolist() for b in stacked] == [b.tolist() for b in expected]
        assert isinstance(stacked, torch.Tensor) == (n % 4 == 0)


@pytest.mark.parametrize("algorithm", ["FedAvg", "Ditto"])
def test_a_run_is_bit_for_bit_that_of_the_numpy_derivation(algorithm, monkeypatch):
    """Three rounds (selection, batches, dropout streams, Ditto's own loop) with derive_seed as it is,
    then with the NumPy-only derivation: the same models, state and curves to the last bit."""
    from fltest import assert_same_training

    now = engine_run(algorithm, "sequential")
    monkeypatch.setattr(seeding, "derive_seed", seed_sequence_seed)
    before = engine_run(algorithm, "sequential")
    assert_same_training(before, now, exact=True)


def test_a_threads_scratch_generator_gives_the_torch_generator_stream():
    """The generator shuffled_plan reuses (one per thread) draws what a fresh one seeded alike draws."""
    import threading

    scratch = seeding.scratch_generator(3, "batches", 4, 5)
    assert torch.equal(torch.randperm(20, generator=scratch),
                       torch.randperm(20, generator=seeding.torch_generator(3, "batches", 4, 5)))
    torch.rand(3, generator=scratch)  # a state that re-seeding must reset
    assert seeding.scratch_generator(3, "batches", 4, 5) is scratch
    assert torch.equal(torch.randperm(20, generator=scratch),
                       torch.randperm(20, generator=seeding.torch_generator(3, "batches", 4, 5)))
    other = []
    thread = threading.Thread(target=lambda: other.append(seeding.scratch_generator(3, "batches", 4, 5)))
    thread.start()
    thread.join()
    assert other[0] is not scratch
