"""Client partitions: disjoint, complete / sized as promised, seeded, α-sensitive, and
impossible requests fail fast with a PartitionError."""

import numpy as np
import pytest

from fedrcl_flwr.config import ConfigError
from fedrcl_flwr.data.partition import partition
from fedrcl_flwr.data.report import class_counts, format_counts_table
from fedrcl_flwr.errors import PartitionError

K = 10  # classes
N = 2000  # samples, 200 per class


def _labels(n=N, k=K, seed=0):
    """Balanced labels in a random order (like a real training set)."""
    return np.random.default_rng(seed).permutation(np.arange(n) % k)


def _domains(n=N, nd=4, seed=1):
    return np.random.default_rng(seed).permutation(np.arange(n) % nd)


def _assert_disjoint(parts, ordered=True):
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "a sample is given to two clients"
    for p in parts:
        assert p.dtype == np.int64
        if ordered:  # the authors' balanced Dirichlet split keeps their shuffled order
            assert np.all(np.diff(p) > 0), "client indices must be sorted and unique"


def _assert_complete(parts, n):
    _assert_disjoint(parts)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def _classes_per_client(parts, labels):
    return float(np.mean([len(np.unique(labels[p])) for p in parts]))


def _entropy_per_client(parts, labels):
    counts = class_counts(parts, labels, K).astype(float)
    p = counts / counts.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log(p), 0.0).sum(1)
    return float(h.mean())


SCHEMES = [
    ("iid", {}),
    ("dirichlet", {"balanced": True, "alpha": 0.3}),
    ("dirichlet", {"balanced": False, "alpha": 0.3, "min_size": 10}),
    ("shards", {"shards_per_client": 2}),
    ("domain", {"balanced": True, "domains_per_client": 1}),
    ("domain", {"balanced": False, "alpha": 0.5, "domains_per_client": 2}),
]
IDS = ["iid", "dir-balanced", "dir-unbalanced", "shards", "domain-balanced", "domain-dir"]


def _run(scheme, kw, seed=0, num_clients=20, labels=None, domains=None):
    labels = _labels() if labels is None else labels
    if scheme == "domain" and domains is None:
        domains = _domains(len(labels))
    return partition(labels, num_clients, scheme, domains=domains, seed=seed, **kw)


# --------------------------------------------------------------------------------------
# Properties shared by every scheme
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme,kw", SCHEMES, ids=IDS)
def test_disjoint_and_nonempty(scheme, kw):
    parts = _run(scheme, kw)
    assert len(parts) == 20
    _assert_disjoint(parts, ordered=not (scheme == "dirichlet" and kw["balanced"]))
    assert min(len(p) for p in parts) >= 1


# balanced Dirichlet and both domain splits (equal per-class counts / Dirichlet label skew
# inside a domain, see tests/datasets/test_interdomain_split.py) leave samples unused by design
COMPLETE = [
    (s, kw) for s, kw in SCHEMES if not (s == "dirichlet" and kw["balanced"]) and s != "domain"
]
COMPLETE_IDS = [i for i in IDS if i not in ("dir-balanced", "domain-balanced", "domain-dir")]


@pytest.mark.parametrize("scheme,kw", COMPLETE, ids=COMPLETE_IDS)
def test_complete_schemes_cover_every_index(scheme, kw):
    # iid, unbalanced Dirichlet, shards and domain splits use every sample exactly once
    _assert_complete(_run(scheme, kw), N)
    # ... also when the sizes do not divide evenly
    labels = _labels(n=1003)
    _assert_complete(_run(scheme, kw, labels=labels, num_clients=7), 1003)


@pytest.mark.parametrize("scheme,kw", SCHEMES, ids=IDS)
def test_seeded_determinism(scheme, kw):
    a = _run(scheme, kw, seed=5)
    b = _run(scheme, kw, seed=5)
    c = _run(scheme, kw, seed=6)
    assert _same(a, b)
    assert not _same(a, c)


def test_result_does_not_depend_on_global_rng():
    np.random.seed(1)
    a = _run("dirichlet", {"alpha": 0.3})
    np.random.seed(2)
    np.random.rand(10)
    b = _run("dirichlet", {"alpha": 0.3})
    assert _same(a, b)


# --------------------------------------------------------------------------------------
# Scheme-specific promises
# --------------------------------------------------------------------------------------


def test_iid_sizes_differ_by_at_most_one_and_classes_are_mixed():
    labels = _labels(n=1003)
    parts = partition(labels, 7, "iid", seed=0)
    sizes = sorted(len(p) for p in parts)
    assert sizes[-1] - sizes[0] <= 1 and sum(sizes) == 1003
    # 143 random samples of a balanced 10-class set hold every class
    assert _classes_per_client(parts, labels) == K


@pytest.mark.parametrize("n,num_clients", [(2000, 20), (2003, 7), (1000, 100), (25, 25)])
@pytest.mark.parametrize("alpha", [0.001, 0.3, 100.0])
def test_balanced_dirichlet_exact_sizes(n, num_clients, alpha):
    labels = _labels(n=n)
    parts = partition(labels, num_clients, "dirichlet", alpha=alpha, balanced=True, seed=3)
    _assert_disjoint(parts, ordered=False)
    size = n // num_clients
    assert [len(p) for p in parts] == [size] * num_clients
    assert len(np.concatenate(parts)) == num_clients * size


def test_balanced_dirichlet_on_imbalanced_labels_still_exact():
    # one dominant class: clients whose classes run out fall back to what is left
    labels = np.concatenate([np.zeros(900, int), np.arange(100) % 9 + 1])
    parts = partition(labels, 10, "dirichlet", alpha=0.05, balanced=True, seed=0)
    _assert_disjoint(parts, ordered=False)
    assert [len(p) for p in parts] == [100] * 10


@pytest.mark.parametrize("balanced", [True, False], ids=["balanced", "unbalanced"])
def test_dirichlet_alpha_controls_label_skew(balanced):
    labels = _labels()
    kw = {"balanced": balanced, "min_size": 5}
    skew, flat = [], []
    for seed in range(3):
        lo = partition(labels, 20, "dirichlet", alpha=0.05, seed=seed, **kw)
        hi = partition(labels, 20, "dirichlet", alpha=100.0, seed=seed, **kw)
        skew.append((_classes_per_client(lo, labels), _entropy_per_client(lo, labels)))
        flat.append((_classes_per_client(hi, labels), _entropy_per_client(hi, labels)))
    skew, flat = np.mean(skew, 0), np.mean(flat, 0)
    # α = 100: (almost) every client sees every class with near-uniform proportions
    assert flat[0] >= 9.5 and flat[1] > 0.9 * np.log(K)
    # α = 0.05: a handful of classes, low entropy
    assert skew[0] < 5.0 and skew[0] < flat[0] - 4
    assert skew[1] < 0.5 * flat[1]


def test_dirichlet_alpha_is_monotone_in_skew():
    labels = _labels()
    ents = [
        np.mean(
            [
                _entropy_per_client(partition(labels, 20, "dirichlet", alpha=a, seed=s), labels)
                for s in range(3)
            ]
        )
        for a in (0.05, 0.5, 5.0)
    ]
    assert ents[0] < ents[1] < ents[2]


def test_unbalanced_dirichlet_sizes_vary_and_respect_min_size():
    labels = _labels()
    parts = partition(labels, 20, "dirichlet", alpha=0.3, balanced=False, min_size=40, seed=0)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 40
    assert sizes.max() > sizes.min() + 20  # not an equal split
    _assert_complete(parts, N)


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_shards_limit_classes_per_client(gamma):
    labels = _labels()  # 2000 samples, 20 clients: shard size 100 / gamma, 200 per class
    parts = partition(labels, 20, "shards", shards_per_client=gamma, seed=0)
    _assert_complete(parts, N)
    shard = N / (20 * gamma)
    classes_per_shard = int(np.ceil(shard / 200)) + 1  # a shard may straddle a class boundary
    for p in parts:
        assert len(np.unique(labels[p])) <= gamma * classes_per_shard
        assert abs(len(p) - N / 20) <= gamma  # γ shards of (almost) equal size


def test_shards_aligned_with_classes_give_exactly_gamma_classes():
    labels = _labels()  # 10 classes x 200; 5 clients x 2 shards = 10 shards of 200
    parts = partition(labels, 5, "shards", shards_per_client=2, seed=4)
    _assert_complete(parts, N)
    for p in parts:
        counts = np.bincount(labels[p], minlength=K)
        assert sorted(counts[counts > 0].tolist()) == [200, 200]
    # every class goes to exactly one client
    counts = class_counts(parts, labels, K)
    assert np.array_equal((counts > 0).sum(0), np.ones(K))


def test_shards_label_sorted_input():
    labels = np.sort(_labels())  # already sorted by label (the McMahan setting)
    parts = partition(labels, 10, "shards", shards_per_client=1, seed=0)
    _assert_complete(parts, N)
    assert [len(np.unique(labels[p])) for p in parts] == [1] * 10


def _owned(client, per_client, dom_ids):
    nd = len(dom_ids)
    return {int(dom_ids[(client * per_client + j) % nd]) for j in range(per_client)}


@pytest.mark.parametrize("balanced", [True, False])
@pytest.mark.parametrize("num_clients,per_client", [(8, 1), (4, 1), (6, 2), (3, 4)])
def test_domain_clients_hold_only_their_domains(balanced, num_clients, per_client):
    labels, domains = _labels(), _domains(nd=4)
    parts = partition(
        labels,
        num_clients,
        "domain",
        domains=domains,
        balanced=balanced,
        alpha=0.5,
        domains_per_client=per_client,
        seed=2,
    )
    _assert_disjoint(parts)
    for i, p in enumerate(parts):
        assert set(np.unique(domains[p]).tolist()) == _owned(i, per_client, np.arange(4))


def test_domain_balanced_sizes_equal_and_dirichlet_sizes_differ():
    labels, domains = _labels(), _domains(nd=4)  # ~50 per (domain, class)
    bal = partition(labels, 8, "domain", domains=domains, balanced=True, seed=0)
    counts = class_counts(bal, labels, K)
    n = np.array([[np.sum((domains == d) & (labels == k)) for k in range(K)] for d in range(4)])
    # two clients per domain, the same count of every class: the largest common one
    assert np.array_equal(counts, np.full((8, K), int((n // 2).min())))
    unb = partition(labels, 8, "domain", domains=domains, balanced=False, alpha=0.5, seed=0)
    sizes = np.array([len(p) for p in unb])
    assert sizes.min() >= 1 and sizes.max() - sizes.min() > 20
    for d in range(4):  # a domain's owners never take more than the domain has
        owners = [i for i in range(8) if i % 4 == d]
        assert sum(sizes[i] for i in owners) <= 500


def test_domain_skew_follows_alpha():
    labels, domains = _labels(), _domains(nd=2)
    ents = [
        np.mean(
            [
                _entropy_per_client(
                    partition(
                        labels, 10, "domain", domains=domains, balanced=False, alpha=a, seed=s
                    ),
                    labels,
                )
                for s in range(3)
            ]
        )
        for a in (0.05, 100.0)
    ]
    assert ents[0] < ents[1] - 0.5


def test_domain_ids_need_not_be_contiguous():
    labels = _labels()
    domains = np.where(_domains(nd=2) == 0, 7, 42)
    parts = partition(labels, 4, "domain", domains=domains, seed=0)
    _assert_disjoint(parts)
    assert [set(np.unique(domains[p]).tolist()) for p in parts] == [{7}, {42}, {7}, {42}]


# --------------------------------------------------------------------------------------
# Impossible requests: PartitionError (a ConfigError: CLI exit 2), at once
# --------------------------------------------------------------------------------------


def _fails_fast(match, *args, **kw):
    with pytest.raises(PartitionError, match=match):
        partition(*args, **kw)


@pytest.mark.parametrize("scheme,kw", SCHEMES, ids=IDS)
def test_more_clients_than_samples(scheme, kw):
    labels = _labels(n=30)
    dom = _domains(n=30, nd=2) if scheme == "domain" else None
    _fails_fast(r"31 clients but only 30", labels, 31, scheme, domains=dom, **kw)


def test_partition_error_is_a_config_error():
    assert issubclass(PartitionError, ConfigError)


def test_zero_clients_and_bad_alpha():
    _fails_fast("num_clients", _labels(), 0, "iid")
    _fails_fast("alpha", _labels(), 5, "dirichlet", alpha=0.0)
    _fails_fast("alpha", _labels(), 5, "dirichlet", alpha=-1.0)


def test_shards_more_than_samples():
    _fails_fast(
        r"10 clients x 201 shards = 2010 shards but only 2000",
        _labels(),
        10,
        "shards",
        shards_per_client=201,
    )


def test_min_size_beyond_samples_fails_at_once():
    _fails_fast(r"min_size 201 exceeds", _labels(), 10, "dirichlet", balanced=False, min_size=201)


def test_min_size_unreachable_gives_up_quickly():
    # 10 clients x 200 = all 2000 samples: every client would need exactly 200, which a
    # skewed draw (almost) never gives. Must stop after a bounded number of draws.
    _fails_fast(
        r"no draw in 100 tries.*lower partition.min_size",
        _labels(),
        10,
        "dirichlet",
        balanced=False,
        alpha=0.05,
        min_size=200,
    )


def test_min_size_unreachable_gives_up_quickly_at_scale():
    labels = _labels(n=20000)
    _fails_fast(r"no draw in", labels, 100, "dirichlet", balanced=False, alpha=0.01, min_size=190)


def test_domain_scheme_needs_domains():
    _fails_fast(r"needs a dataset with domains", _labels(), 4, "domain", domains=None)


def test_more_domains_per_client_than_domains():
    _fails_fast(
        r"domains_per_client=3 but the data has only 2",
        _labels(),
        4,
        "domain",
        domains=_domains(nd=2),
        domains_per_client=3,
    )


def test_orphan_domains():
    # 2 clients x 1 domain cannot cover 4 domains: domains 2 and 3 would be dropped
    _fails_fast(
        r"leave domain\(s\) \[2, 3\] without a client",
        _labels(),
        2,
        "domain",
        domains=_domains(nd=4),
    )


def test_domain_with_fewer_samples_than_owners():
    domains = np.zeros(N, int)
    domains[:2] = 1  # domain 1 has 2 samples but 5 of the 10 clients own it
    _fails_fast(r"domain 1 has 2 samples for 5 clients", _labels(), 10, "domain", domains=domains)


def test_domain_ids_must_match_the_samples():
    _fails_fast(
        r"domain split: 1990 domain ids for 2000 samples",
        _labels(),
        4,
        "domain",
        domains=_domains(n=1990, nd=2),
    )


def test_unknown_scheme():
    _fails_fast(r"unknown partition scheme 'bogus'", _labels(), 4, "bogus")


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def test_class_counts_and_table():
    labels = _labels()
    parts = partition(labels, 5, "shards", shards_per_client=2, seed=4)
    counts = class_counts(parts, labels, K)
    assert counts.shape == (5, K) and counts.sum() == N
    table = format_counts_table(counts, max_rows=3)
    lines = table.splitlines()
    assert lines[0].startswith("| client | size | classes | 0 | 1 |")
    assert lines[2].startswith("| 0 | 400 | 2 |")
    assert "| ... 2 more clients |" in table
    assert (
        "5 clients, 2000 samples; size min/mean/max 400/400.0/400; classes per client "
        "mean 2.00" in table
    )
