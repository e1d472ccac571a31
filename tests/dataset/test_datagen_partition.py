"""Partition strategies of dataset/datagen/partition.py: coverage, label structure, skew, determinism, errors."""

import numpy as np
import pytest

from datagen import partition as P

NUM_CLASSES = 10


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    """6,000 labels with unequal class sizes (400..800), shuffled."""
    rng = np.random.default_rng(123)
    y = np.concatenate([np.full(400 + 40 * k + (k % 3), k) for k in range(NUM_CLASSES)])
    return rng.permutation(y)


STRATEGIES = {
    "iid-balance": dict(non_iid=False, balance=True, partition=None),
    "iid": dict(non_iid=False, balance=False, partition=None),
    "pat": dict(non_iid=True, balance=False, partition="pat"),
    "pat-balance": dict(non_iid=True, balance=True, partition="pat"),
    "dir": dict(non_iid=True, balance=False, partition="dir"),
    "exdir": dict(non_iid=True, balance=False, partition="exdir", alpha=1.0),
    "shard": dict(non_iid=True, balance=False, partition="shard"),
}


def run(labels: np.ndarray, seed: int = 1, num_clients: int = 20, **kw) -> list[np.ndarray]:
    return P.make_partition(labels, num_clients=num_clients, num_classes=NUM_CLASSES,
                            rng=np.random.default_rng(seed), **kw)


def entropy(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


@pytest.mark.parametrize("name", STRATEGIES)
def test_every_sample_assigned_exactly_once(labels, name):
    parts = run(labels, **STRATEGIES[name])
    assert len(parts) == 20
    assert all(len(p) > 0 for p in parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))


@pytest.mark.parametrize("name", STRATEGIES)
def test_same_seed_same_split_other_seed_other_split(labels, name):
    a, b, c = (run(labels, seed=s, **STRATEGIES[name]) for s in (7, 7, 8))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, z) for x, z in zip(a, c))


def test_pat_gives_class_per_client_labels_in_pfllib_groups(labels):
    parts = run(labels, non_iid=True, balance=False, partition="pat", class_per_client=2)
    label_sets = [sorted(set(labels[p].tolist())) for p in parts]
    assert all(len(s) == 2 for s in label_sets)
    # PFLlib: 20 clients, 10 classes, 2 per client => clients 0-3 hold {0,1}, 4-7 {2,3}, ...
    assert label_sets == [[2 * (c // 4), 2 * (c // 4) + 1] for c in range(20)]


@pytest.mark.parametrize("num_clients,cpc", [(12, 2), (7, 3), (30, 4), (5, 2)])
def test_pat_covers_every_class_with_exact_label_count(labels, num_clients, cpc):
    parts = run(labels, num_clients=num_clients, non_iid=True, balance=True, partition="pat",
                class_per_client=cpc)
    assert all(len(np.unique(labels[p])) == cpc for p in parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))


def test_iid_balanced_sizes_differ_by_at_most_one_and_hold_all_labels(labels):
    parts = run(labels, non_iid=False, balance=True, partition=None)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(len(np.unique(labels[p])) == NUM_CLASSES for p in parts)


def test_iid_unbalanced_sizes_vary(labels):
    sizes = [len(p) for p in run(labels, non_iid=False, balance=False, partition=None)]
    assert max(sizes) - min(sizes) > 20


def test_shard_gives_each_client_its_shards_and_at_most_that_many_labels():
    # 10 classes x 120 samples, 20 clients x 3 shards => 60 shards of 20, 6 per class.
    y = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 120))
    parts = P.shard(y, 20, np.random.default_rng(3), shards_per_client=3)
    assert [len(p) for p in parts] == [60] * 20
    for p in parts:
        # A shard is one label here, so a client's labels are its shards' labels, all distinct.
        assert len(np.unique(y[p])) == 3
        assert all(c % 20 == 0 for c in np.bincount(y[p]))
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(y)))


def test_shard_mcmahan_mnist_shape():
    # 100 clients x 2 shards of 300 over 60,000 label-sorted samples (McMahan et al.).
    y = np.random.default_rng(1).permutation(np.repeat(np.arange(10), 6000))
    parts = P.shard(y, 100, np.random.default_rng(2))
    assert {len(p) for p in parts} == {600}
    assert all(len(np.unique(y[p])) == 2 for p in parts)


def test_shard_on_uneven_classes_stays_within_two_labels_per_shard(labels):
    parts = run(labels, non_iid=True, balance=False, partition="shard", shards_per_client=2)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 2
    assert all(len(np.unique(labels[p])) <= 4 for p in parts)


def test_smaller_alpha_gives_more_label_skew(labels):
    def mean_entropy(alpha: float) -> float:
        parts = run(labels, non_iid=True, balance=False, partition="dir", alpha=alpha)
        return np.mean([entropy(np.bincount(labels[p], minlength=NUM_CLASSES)) for p in parts])
    assert mean_entropy(0.1) < mean_entropy(1.0) < mean_entropy(100.0)
    assert mean_entropy(100.0) > 0.95 * np.log(NUM_CLASSES)


def test_dir_respects_pfllib_least_samples(labels):
    least = P.least_samples(len(labels), 20, batch_size=10, train_ratio=0.75)
    assert least == 40
    parts = run(labels, non_iid=True, balance=False, partition="dir", alpha=0.1)
    assert min(len(p) for p in parts) >= least


def test_exdir_limits_labels_per_client(labels):
    parts = run(labels, non_iid=True, balance=False, partition="exdir", alpha=100.0,
                class_per_client=3)
    assert all(1 <= len(np.unique(labels[p])) <= 3 for p in parts)
    assert min(len(p) for p in parts) >= 10


def test_cap_samples_keeps_a_random_subset_in_order():
    idx = np.arange(100, 300)
    rng = np.random.default_rng(0)
    kept = P.cap_samples(idx, 50, rng)
    assert len(kept) == 50 and np.all(np.diff(kept) > 0) and set(kept) <= set(idx)
    assert not np.array_equal(kept, idx[:50])
    np.testing.assert_array_equal(P.cap_samples(idx[:30], 50, rng), idx[:30])
    np.testing.assert_array_equal(P.cap_samples(idx, None, rng), idx)


@pytest.mark.parametrize("n", [1, 4, 10, 37, 1000])
def test_train_test_split_sizes_match_sklearn(n):
    from sklearn.model_selection import train_test_split as sk_split
    train, test = P.train_test_split(np.arange(n) + 5, 0.75, np.random.default_rng(0))
    if n > 1:
        sk_train, sk_test = sk_split(np.arange(n), train_size=0.75)
        assert (len(train), len(test)) == (len(sk_train), len(sk_test))
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(n) + 5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(partition="pat", class_per_client=11), "class_per_client"),
    (dict(partition="exdir", class_per_client=0), "class_per_client"),
    (dict(partition="pat", class_per_client=2, num_clients=3), "without a client"),
    (dict(partition="dir", alpha=0.0), "alpha"),
    (dict(partition="nonsense"), "unknown partition"),
    (dict(partition="shard", shards_per_client=400, num_clients=20), "shards"),
    (dict(partition="dir", num_clients=7000), "more clients"),
])
def test_impossible_settings_raise_value_error(labels, kwargs, match):
    kwargs = dict(num_clients=20) | kwargs
    with pytest.raises(ValueError, match=match):
        run(labels, non_iid=True, balance=False, **kwargs)


def test_dir_gives_up_with_a_clear_error():
    y = np.repeat(np.arange(10), 10)
    with pytest.raises(ValueError, match="raise --alpha"):
        P.dirichlet(y, 10, 10, 0.01, np.random.default_rng(0), least=10, max_tries=5,
                    fallback="error")


def test_labels_outside_range_rejected():
    with pytest.raises(ValueError, match="labels must lie"):
        P.iid(np.array([0, 1, 12]), 2, 10, np.random.default_rng(0))


def test_dir_repair_fallback_reaches_the_minimum_where_redraws_fail():
    y = np.repeat(np.arange(10), 10)
    parts = P.dirichlet(y, 10, 10, 0.01, np.random.default_rng(0), least=10, max_tries=5)
    assert [len(p) for p in parts] == [10] * 10
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(100))
