"""FINCH (fedrcl_flwr.clustering) against the reference vectors in tests/data/fedccl.

The vectors (copied from the project's shared reference folder; see README.json there)
were produced by the reference implementation (ssarfraz/FINCH-Clustering, finch-clust
0.2.1, ``FINCH(X, initial_rank=None, req_clust=..., distance=..., ensure_early_exit=...,
verbose=False)``): every partition level, cosine and euclidean, early exit on and off,
edge cases (N = 1, 2, 3 identical rows, duplicates, a zero vector), and one ``req_clust``
run. Partitions are compared per level up to relabelling.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedrcl_flwr.clustering import canonical_labels, finch, first_neighbours

DATA = Path(__file__).resolve().parents[1] / "data" / "fedccl"
SETS = sorted(p.name for p in DATA.glob("finch_*.npz") if "reqclust" not in p.name)
RUNS = [(m, ee) for m in ("cosine", "euclidean") for ee in (1, 0)]


canonical = canonical_labels


def assert_same_partitions(ours, ref):
    ours, ref = np.asarray(ours), np.asarray(ref)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    for level in range(ref.shape[1] if ref.ndim == 2 else 1):
        a = canonical(ours)[:, level]
        b = canonical(ref)[:, level]
        assert np.array_equal(a, b), f"level {level}: {np.flatnonzero(a != b)[:10]} differ"


def test_canonical_helper():
    a = np.array([[5, 1], [5, 1], [2, 1], [7, 0]])
    b = np.array([[0, 9], [0, 9], [1, 9], [2, 3]])
    assert np.array_equal(canonical(a), canonical(b))
    assert not np.array_equal(canonical(a), canonical(np.array([[0, 9], [1, 9], [1, 9], [2, 3]])))


def test_reference_data_present():
    assert len(SETS) == 12
    assert (DATA / "finch_reqclust3_blobs5.npz").exists()


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("distance,ee", RUNS)
def test_partitions_match_reference(name, distance, ee):
    ref = np.load(DATA / name)
    parts, num = finch(ref["X"], distance=distance, ensure_early_exit=bool(ee))
    assert parts.dtype == np.int64
    assert list(num) == ref[f"num_clust_{distance}_ee{ee}"].tolist()
    assert_same_partitions(parts, ref[f"c_{distance}_ee{ee}"])
    for level, k in enumerate(num):  # counts agree with the labels
        assert len(np.unique(parts[:, level])) == k


def _blocked_cases():
    # 1-row blocks only on the small sets (a 200-row set would take 20k block products)
    for name in SETS:
        n = len(np.load(DATA / name)["X"])
        for block_size in ([1] if n <= 20 else []) + [7, 64]:
            yield name, block_size


@pytest.mark.parametrize("name,block_size", list(_blocked_cases()))
def test_blocked_search_matches_reference(name, block_size):
    """The upper-triangular blocked first-neighbour search (used above the single-product
    memory budget) gives the reference's partitions too."""
    ref = np.load(DATA / name)
    for distance, ee in RUNS:
        parts, num = finch(
            ref["X"], distance=distance, ensure_early_exit=bool(ee), block_size=block_size
        )
        assert list(num) == ref[f"num_clust_{distance}_ee{ee}"].tolist()
        assert_same_partitions(parts, ref[f"c_{distance}_ee{ee}"])


@pytest.mark.parametrize("name", [s for s in SETS if s != "finch_edge_n1.npz"])
@pytest.mark.parametrize("block_size", [None, 3])
def test_first_neighbours_match_reference(name, block_size):
    ref = np.load(DATA / name)
    kappa, dmin = first_neighbours(ref["X"], distance="cosine", block_size=block_size)
    # the neighbour indices are exact; the float32 distances depend on the BLAS kernel
    # (SYRK for one product, GEMM for blocks; another build of the same BLAS may round
    # the last bit of 1 - s differently), so they are compared to a few ulps of s ≈ 1
    assert np.array_equal(kappa, ref["first_neighbour_cosine_level0"])
    expected = ref["cosine_dist_matrix_diag1e12"][np.arange(len(kappa)), kappa]
    np.testing.assert_allclose(dmin, expected, rtol=1e-6, atol=2.5e-7)


def test_req_clust_matches_reference():
    ref = np.load(DATA / "finch_reqclust3_blobs5.npz")
    parts, num, req = finch(ref["X"], distance="cosine", ensure_early_exit=True, req_clust=3)
    # the partitions are unchanged, the requested labels come back separately
    assert list(num) == ref["num_clust"].tolist() == [22, 5]
    assert_same_partitions(parts, ref["c"])
    assert len(np.unique(req)) == 3
    assert_same_partitions(req[:, None], ref["req_c"][:, None])


def test_req_clust_existing_level_and_too_many():
    ref = np.load(DATA / "finch_reqclust3_blobs5.npz")
    parts, num, req = finch(ref["X"], req_clust=5)
    assert np.array_equal(req, parts[:, 1])
    parts, num, req = finch(ref["X"], req_clust=1000)  # more than the finest level
    assert np.array_equal(req, parts[:, 0])
    parts, num, req = finch(ref["X"], req_clust=1)
    assert len(np.unique(req)) == 1
    with pytest.raises(ValueError):
        finch(ref["X"], req_clust=0)


def test_edge_cases_explicit():
    # N = 1: one cluster, one level
    parts, num = finch(np.array([[1.0, 2.0, 3.0]]))
    assert parts.shape == (1, 1) and num == [1]
    # identical rows and zero vectors (cosine: a zero vector is at distance 1 from all)
    parts, num = finch(np.zeros((4, 3)))
    assert num == [1]
    x = np.array([[0, 0], [1, 0], [0, 1], [1, 0.1]], np.float32)
    kappa, dmin = first_neighbours(x, distance="cosine")
    assert kappa.tolist() == [1, 3, 3, 1]
    assert dmin[0] == 1.0
    # three well separated pairs
    x = np.array([[1, 0, 0], [1, 0.01, 0], [0, 1, 0], [0, 1, 0.01], [0, 0, 1], [0.01, 0, 1]])
    parts, num = finch(x)
    assert num == [3]
    assert canonical(parts)[:, 0].tolist() == [0, 0, 1, 1, 2, 2]


def test_input_validation():
    with pytest.raises(ValueError):
        finch(np.zeros(5))
    with pytest.raises(ValueError):
        finch(np.zeros((0, 3)))
    with pytest.raises(ValueError):
        finch(np.array([[np.nan, 1.0], [1.0, 2.0]]))
    with pytest.raises(ValueError):
        finch(np.ones((3, 2)), distance="cityblock")
    with pytest.raises(ValueError):
        finch(np.ones((3, 2)), block_size=0)


def test_properties_random():
    """Hierarchy: every level is a coarsening of the previous one, counts strictly
    decrease, and without early exit the coarsest kept level has ≥ 2 clusters."""
    rng = np.random.default_rng(0)
    x = np.maximum(rng.normal(size=(300, 16)), 0).astype(np.float32)
    for ee in (True, False):
        parts, num = finch(x, ensure_early_exit=ee)
        assert all(a > b for a, b in zip(num, num[1:]))
        assert num[-1] >= 2
        for lvl in range(1, parts.shape[1]):
            # each finer cluster maps into exactly one coarser cluster
            pairs = np.unique(parts[:, lvl - 1 : lvl + 1], axis=0)
            assert len(pairs) == num[lvl - 1]
        # blocked search gives the same result
        p2, n2 = finch(x, ensure_early_exit=ee, block_size=37)
        assert n2 == num and np.array_equal(canonical(p2), canonical(parts))


def test_float64_input_is_cast_like_reference():
    ref = np.load(DATA / "finch_random_n50_d8.npz")
    parts, num = finch(ref["X"].astype(np.float64))
    assert list(num) == ref["num_clust_cosine_ee1"].tolist()
    assert_same_partitions(parts, ref["c_cosine_ee1"])


def test_fedccl_and_fpl_pipeline_assignments():
    """The FINCH calls of the FedCCL-style / FPL reference pipeline (fpl_fedccl_losses.npz):
    per client and class on local embeddings (first or last partition, early exit on/off),
    on the server over all clients' signals of a class (last partition, no early exit), and
    FPL's prototype aggregation (class means of the clients, last partition)."""
    ref = np.load(DATA / "fpl_fedccl_losses.npz")
    checked = 0
    for tag in ("first_ee0", "first_ee1", "last_ee0", "last_ee1"):
        which, ee = tag.split("_")
        for k in range(6):
            feats, labels = ref[f"client{k}_features"], ref[f"client{k}_labels"]
            for c in np.unique(labels):
                parts, _ = finch(
                    feats[labels == c], distance="cosine", ensure_early_exit=ee == "ee1"
                )
                got = parts[:, 0] if which == "first" else parts[:, -1]
                assert_same_partitions(
                    got[:, None], ref[f"fedccl_{tag}_client{k}_class{c}_assign"][:, None]
                )
                checked += 1
        for c in range(5):
            signals = ref[f"fedccl_{tag}_local_signals_class{c}"]
            parts, _ = finch(signals, distance="cosine", ensure_early_exit=False)
            assign = parts[:, -1]
            assert_same_partitions(
                assign[:, None], ref[f"fedccl_{tag}_server_assign_class{c}"][:, None]
            )
            means = np.stack([signals[assign == u].mean(0) for u in np.unique(assign)])
            np.testing.assert_allclose(
                means, ref[f"fedccl_{tag}_server_cluster_means_class{c}"], rtol=0, atol=1e-6
            )
            checked += 1
    assert checked == 124
    for c in range(5):  # FPL.proto_aggregation
        protos = np.stack(
            [
                ref[f"client{k}_local_protos"][ref[f"client{k}_local_proto_classes"] == c][0]
                for k in range(6)
                if c in ref[f"client{k}_local_proto_classes"]
            ]
        )
        expected = ref[f"fpl_global_cluster_protos_class{c}"]
        if len(protos) == 1:
            assert expected.shape[0] == 1
            continue
        parts, _ = finch(protos, distance="cosine", ensure_early_exit=False)
        assign = parts[:, -1]
        means = np.stack([protos[assign == u].mean(0) for u in np.unique(assign)])
        np.testing.assert_allclose(means, expected, rtol=0, atol=1e-6)
