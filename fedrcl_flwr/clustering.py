"""FINCH: First Integer Neighbour Clustering Hierarchy (Sarfraz et al., CVPR 2019).

FedCCL clusters each class's embeddings with FINCH on the client (Eqs. 8-9: first-neighbour
adjacency, recursive merging on cluster means, local signals = cluster means, Eq. 10) and
again on the server over every client's signals of a class (Eqs. 13-14). Pure NumPy/SciPy,
no Flower, no torch.

Algorithm (each level works on the rows of one matrix: the samples at level 0, the means
of the current clusters, computed from the original samples, i.e. size-weighted, at the
later levels):

1. first neighbour κ(i) = argmin_{j≠i} d(i, j) (lowest index on ties);
2. adjacency i ~ j iff j = κ(i) or i = κ(j) or κ(i) = κ(j); the clusters of the level are
   the connected components;
3. repeat on the cluster means until a level yields a single cluster or no reduction
   (that level is discarded, so the coarsest returned level has ≥ 2 clusters unless level 0
   already has one) or a level reduces the count by exactly one (that level is kept and is
   the last: the reference loops ``while previous - current > 1``).

Behaviour pinned to the reference implementation (ssarfraz/FINCH-Clustering, finch-clust
0.2.1, ``FINCH(data, initial_rank=None, req_clust=..., distance=..., ensure_early_exit=...)``
with exact sklearn distances) by the vectors in ``tests/data/fedccl``:

* The input is cast to float32; level-0 distances are computed in float32 exactly as
  ``sklearn.metrics.pairwise_distances`` does (cosine: rows divided by their L2 norm, norms
  below 10·eps left at 1 so a zero vector stays zero, d = clip(1 - z_i·z_j, 0, 2);
  euclidean: float64 ``-2 x·y + |x|² + |y|²`` rounded to float32, clipped at 0, sqrt).
  Cluster means are float32 sums divided by the (integer) sizes, hence float64, and the
  later levels are computed in float64.
* Ties: the first neighbour is the lowest index among the rows at the minimal *rounded*
  distance, so clipping (d < 0 -> 0) and float32 rounding create ties that are broken
  towards the lower index. A zero vector under cosine is at distance exactly 1 from every
  row (its first neighbour is row 0, or row 1 for row 0), and every other row is at
  distance 1 from it. Identical rows are at distance 0 (or clipped to 0) from each other.
* Cluster ids of a level are connected-component ids numbered by first occurrence (SciPy's
  order); later levels' tie-breaks depend on that order, so it is kept.
* ``ensure_early_exit`` (N > 2 only): ``min_sim`` = max over the linked pairs of level 0 of
  d(i, j)·a_ij, where a_ij ∈ {1, 2} is the entry of the reference's adjacency
  ``(A+I)(A+I)ᵀ`` (2 for mutual first neighbours); at every later level a link whose
  distance times its count exceeds ``min_sim`` is dropped before the components are taken.
* ``req_clust`` (the reference's ``req_c``): if it is one of the level sizes, that level's
  labels; if it exceeds the finest level's size, the finest level's labels; otherwise start
  from the coarsest level that still has ≥ ``req_clust`` clusters and merge one step at a
  time (each step links only the two smallest-distance entries of the cluster-mean
  adjacency, i.e. the closest linked pair) down to ``req_clust``. The partitions themselves
  are unchanged; the labels are returned as a third element, as the reference does.

Speed: the first-neighbour search is one matrix product on the normalised rows plus an
arg-max: a single ``Z @ Zᵀ`` (NumPy's SYRK kernel, bit-identical to sklearn's) while the
N x N result fits :data:`MAX_BLOCK_BYTES` (128 MiB: N ≤ 5792 in float32), otherwise
upper-triangular blocks of that many rows (memory bounded by one block, every pair computed
once, row and column arg-minima). Beyond the single product the blocks use GEMM, whose
last-bit rounding differs from SYRK's, so exact ties between duplicate rows (whose
distances are pure rounding noise around 0) may then be broken differently from the
reference; distinct rows are unaffected. The N x N adjacency is never materialised: the
links are (i, κ(i)) plus, only where early-exit pruning removes a mutual link, the sibling
links that can reconnect it; components come from ``scipy.sparse.csgraph``. The whole cost
is essentially that one product (≈ 85 % of the run time at 5,000 x 512), which the
reference computes too.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

__all__ = ["DISTANCES", "MAX_BLOCK_BYTES", "finch", "first_neighbours"]

DISTANCES = ("cosine", "euclidean")

#: Memory budget of one distance block. With the default ``block_size=None`` the search
#: uses a single N x N product while N² x itemsize fits (N ≤ 5792 in float32, 4096 in
#: float64) and square blocks of that many rows beyond.
MAX_BLOCK_BYTES = 128 * 2**20


def _auto_block(itemsize: int) -> int:
    return int(np.sqrt(MAX_BLOCK_BYTES // itemsize))


#: Diagonal value of the reference's distance matrix (so a point is never its own neighbour).
_DIAG = 1e12

#: Pairs evaluated at a time when distances are needed for a list of pairs.
_PAIR_CHUNK = 8192

#: Rows per slab when float64 products are turned into float32 distances.
_SLAB = 256

#: Groups of siblings up to this size have their pairs enumerated; larger ones are
#: reduced with a small matrix product.
_SMALL_GROUP = 64


class _Geometry:
    """Pairwise distances between the rows of one matrix, rounded as the reference does."""

    def __init__(self, m: np.ndarray, distance: str):
        self.n = int(m.shape[0])
        self.dtype = m.dtype  # float32 at level 0, float64 for cluster means
        self.cosine = distance == "cosine"
        if self.cosine:
            norms = np.sqrt(np.einsum("ij,ij->i", m, m))
            norms[norms < 10 * np.finfo(m.dtype).eps] = 1.0
            self.z = m / norms[:, None]
        else:
            self.z = m.astype(np.float64)
            self.sq = np.einsum("ij,ij->i", self.z, self.z)

    def _finish(self, g: np.ndarray, sq_a, sq_b) -> np.ndarray:
        """Turn dot products ``g`` into distances in place (where possible)."""
        if self.cosine:
            np.negative(g, out=g)
            g += 1
            np.clip(g, 0.0, 2.0, out=g)
            return g
        if g.ndim == 2 and self.dtype != np.float64 and g.shape[0] > _SLAB:
            # float64 products -> float32 distances, slab by slab (stays in cache)
            out = np.empty(g.shape, dtype=self.dtype)
            for s in range(0, g.shape[0], _SLAB):
                out[s : s + _SLAB] = self._finish(g[s : s + _SLAB], sq_a[s : s + _SLAB], sq_b)
            return out
        g *= -2
        g += sq_a
        g += sq_b
        if self.dtype != np.float64:
            g = g.astype(self.dtype)
        np.maximum(g, 0, out=g)
        np.sqrt(g, out=g)
        return g

    def block(self, a: int, b: int, c: int, d: int) -> np.ndarray:
        """Distances between rows a:b and rows c:d."""
        # Same buffer for a diagonal block -> NumPy uses SYRK, as sklearn does for cosine
        # and for float64 euclidean. (For float32 euclidean sklearn multiplies separate
        # float64 copies of its chunks with GEMM; the float64 products are rounded to
        # float32 afterwards, which absorbs the difference between the two kernels.)
        g = self.z[a:b] @ self.z[c:d].T
        if self.cosine:
            return self._finish(g, None, None)
        return self._finish(g, self.sq[a:b, None], self.sq[None, c:d])

    def pairs(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        """Distances d(i[t], j[t])."""
        out = np.empty(len(i), dtype=self.dtype)
        for s in range(0, len(i), _PAIR_CHUNK):
            ii, jj = i[s : s + _PAIR_CHUNK], j[s : s + _PAIR_CHUNK]
            g = np.einsum("ij,ij->i", self.z[ii], self.z[jj])
            if self.cosine:
                out[s : s + len(ii)] = self._finish(g, None, None)
            else:
                out[s : s + len(ii)] = self._finish(g, self.sq[ii], self.sq[jj])
        return out

    def subset_max(self, idx: np.ndarray) -> float:
        """Largest distance between two distinct rows of ``idx`` (len ≥ 2)."""
        sub = _Geometry.__new__(_Geometry)
        sub.n, sub.dtype, sub.cosine, sub.z = len(idx), self.dtype, self.cosine, self.z[idx]
        if not self.cosine:
            sub.sq = self.sq[idx]
        best = -np.inf
        step = _auto_block(np.dtype(self.dtype).itemsize)
        for a in range(0, sub.n, step):
            for c in range(a, sub.n, step):
                blk = sub.block(a, min(sub.n, a + step), c, min(sub.n, c + step))
                if a == c:
                    np.fill_diagonal(blk, -np.inf)
                best = max(best, float(blk.max()))
        return best


class _Neighbours:
    """First neighbours of the rows of a :class:`_Geometry` and the distances needed later."""

    def __init__(self, geo: _Geometry, block_size: int | None):
        self.geo = geo
        n = geo.n
        if block_size is None:
            block_size = _auto_block(np.dtype(geo.dtype).itemsize)
        self.full: np.ndarray | None = None  # all distances (single-product case)
        self.sim: np.ndarray | None = None  # or, for cosine, all similarities
        if n <= block_size and geo.cosine:
            self._cosine_full()
        elif n <= block_size:
            dist = geo.block(0, n, 0, n)
            np.fill_diagonal(dist, _DIAG)
            self.kappa = dist.argmin(axis=1)
            self.dmin = dist[np.arange(n), self.kappa]
            self.full = dist
        else:
            self._blocked(block_size)

    def _cosine_full(self) -> None:
        """argmin_j clip(1 - s_ij, 0, 2) from one arg-max over the similarities.

        1 - s is exact for s in [0.5, 2] (Sterbenz), so on (0.5, 1) the distance is a
        one-to-one function of the similarity and the arg-max (lowest index on ties) is the
        reference's arg-min. Rows whose best similarity is outside (0.5, 1) can have several
        similarities rounding or clipping to the same distance: those rows are redone on the
        distances themselves.
        """
        geo, n = self.geo, self.geo.n
        sim = geo.z @ geo.z.T  # one SYRK, bit-identical to sklearn's
        np.fill_diagonal(sim, -np.inf)
        kappa = sim.argmax(axis=1)
        best = sim[np.arange(n), kappa]
        redo = np.flatnonzero(~((best > 0.5) & (best < 1)))
        for s in range(0, len(redo), 1024):
            rows = redo[s : s + 1024]
            d = geo._finish(sim[rows], None, None)
            d[np.arange(len(rows)), rows] = _DIAG
            kappa[rows] = d.argmin(axis=1)
        self.kappa, self.sim = kappa, sim
        self.dmin = geo._finish(sim[np.arange(n), kappa], None, None)

    def _blocked(self, block_size: int) -> None:
        geo, n = self.geo, self.geo.n
        best = np.full(n, np.inf, dtype=geo.dtype)
        arg = np.zeros(n, dtype=np.int64)
        starts = list(range(0, n, block_size))
        # Candidates reach every row in increasing column order, so a strict "<" keeps the
        # lowest index among equal distances, like argmin over the full row.
        for a in starts:
            b = min(n, a + block_size)
            for c in starts:
                if c < a:
                    continue
                d = min(n, c + block_size)
                blk = geo.block(a, b, c, d)
                if a == c:
                    np.fill_diagonal(blk, _DIAG)
                _update(best[a:b], arg[a:b], blk, c)
                if c != a:
                    _update_columns(best[c:d], arg[c:d], blk, a)
        self.kappa, self.dmin = arg, best

    def dist(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        if self.sim is not None:
            return self.geo._finish(self.sim[i, j], None, None)
        if self.full is not None:
            return self.full[i, j]
        return self.geo.pairs(i, j)

    def group_max(self, idx: np.ndarray) -> float:
        if self.sim is not None:
            sub = self.geo._finish(self.sim[np.ix_(idx, idx)], None, None)
        elif self.full is not None:
            sub = self.full[np.ix_(idx, idx)].copy()
        else:
            return self.geo.subset_max(idx)
        np.fill_diagonal(sub, -np.inf)
        return float(sub.max())


def _update(best: np.ndarray, arg: np.ndarray, blk: np.ndarray, offset: int) -> None:
    am = blk.argmin(axis=1)
    v = blk[np.arange(blk.shape[0]), am]
    upd = v < best
    best[upd] = v[upd]
    arg[upd] = am[upd] + offset


def _update_columns(
    best: np.ndarray, arg: np.ndarray, blk: np.ndarray, offset: int, slab: int = 256
) -> None:
    """Column-wise version of :func:`_update` (arg-min along axis 0 is slow in NumPy, so
    reduce slabs of rows with a min first and arg-min only the columns that improve)."""
    for s in range(0, blk.shape[0], slab):
        part = blk[s : s + slab]
        m = part.min(axis=0)
        upd = m < best
        if upd.any():
            cols = np.flatnonzero(upd)
            best[cols] = m[cols]
            arg[cols] = part[:, cols].argmin(axis=0) + (offset + s)


def _sibling_groups(kappa: np.ndarray):
    """Yield (size, members) with members an (G, size) array of rows sharing a first
    neighbour, for every group size ≥ 2 (rows in increasing order within a group)."""
    n = len(kappa)
    order = np.argsort(kappa, kind="stable")
    sizes = np.bincount(kappa, minlength=n)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    for g in np.unique(sizes[sizes >= 2]):
        targets = np.flatnonzero(sizes == g)
        members = order[starts[targets][:, None] + np.arange(g)[None, :]]
        yield int(g), members


def _early_exit_threshold(nb: _Neighbours) -> float:
    """The reference's ``min_sim = max(orig_dist * adj)`` at level 0."""
    kappa, n = nb.kappa, len(nb.kappa)
    cnt = np.where(kappa[kappa] == np.arange(n), 2, 1).astype(nb.dmin.dtype)
    best = float((nb.dmin * cnt).max())
    for g, members in _sibling_groups(kappa):
        if g <= _SMALL_GROUP:
            iu, ju = np.triu_indices(g, 1)
            d = nb.dist(members[:, iu].ravel(), members[:, ju].ravel())
            best = max(best, float(d.max()))
        else:
            for row in members:
                best = max(best, nb.group_max(row))
    return best


def _components(nb: _Neighbours, min_sim: float | None) -> tuple[np.ndarray, int]:
    """Connected components of the first-neighbour graph (links whose distance times
    their adjacency count exceeds ``min_sim`` removed)."""
    kappa = nb.kappa
    n = len(kappa)
    if n == 1:
        return np.zeros(1, np.int64), 1
    idx = np.arange(n)
    src, dst = idx, kappa
    if min_sim is not None:
        mutual = kappa[kappa] == idx
        cnt = np.where(mutual, 2, 1).astype(nb.dmin.dtype)
        keep = nb.dmin * cnt <= min_sim
        src, dst = idx[keep], kappa[keep]
        # A sibling link (i, j), κ(i) = κ(j) = k, has count 1 and, for a non-mutual i,
        # d(i, j) >= d(i, k): it survives only if (i, k) does. Only the mutual partner m of
        # k (κ(k) = m, κ(m) = k) can lose its link (count 2) and still be tied to k's group
        # through a sibling, so those are the only siblings ever evaluated.
        lost = np.flatnonzero(mutual & ~keep & (idx < kappa))
        extra_s, extra_d = [], []
        if len(lost):
            order = np.argsort(kappa, kind="stable")
            sizes = np.bincount(kappa, minlength=n)
            starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
            for m_, k_ in ((lost, kappa[lost]), (kappa[lost], lost)):
                # m_ is the mutual partner of k_; siblings of m_ are the rows j ≠ m_ with κ(j) = k_
                reps = sizes[k_]
                rows = np.repeat(m_, reps)
                pos = np.repeat(starts[k_], reps) + (
                    np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
                )
                sib = order[pos]
                ok = sib != rows
                rows, sib = rows[ok], sib[ok]
                if len(rows):
                    near = nb.dist(rows, sib) <= min_sim
                    extra_s.append(rows[near])
                    extra_d.append(sib[near])
        if extra_s:
            src = np.concatenate([src, *extra_s])
            dst = np.concatenate([dst, *extra_d])
    graph = csr_matrix((np.ones(len(src), np.int8), (src, dst)), shape=(n, n))
    k, labels = connected_components(graph, directed=True, connection="weak")
    return labels.astype(np.int64), int(k)


def _cluster_means(data: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """Cluster means from the original float32 rows: float32 sums accumulated in row
    order, divided by the integer sizes (float64), as the reference does."""
    n = len(labels)
    order = np.argsort(labels, kind="stable")
    sizes = np.bincount(labels, minlength=k)
    indptr = np.concatenate(([0], np.cumsum(sizes)))
    agg = csr_matrix((np.ones(n, np.float32), order, indptr), shape=(k, n))
    return (agg @ data) / sizes[:, None]


def _linked_entries(kappa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All (row, col) entries of the reference's adjacency, row-major, columns sorted."""
    n = len(kappa)
    idx = np.arange(n)
    rows = [idx, kappa]
    cols = [kappa, idx]
    for g, members in _sibling_groups(kappa):
        a, b = np.nonzero(~np.eye(g, dtype=bool))
        rows.append(members[:, a].ravel())
        cols.append(members[:, b].ravel())
    key = np.unique(np.concatenate(rows) * n + np.concatenate(cols))
    return key // n, key % n


def _refine(
    data: np.ndarray, labels: np.ndarray, req_clust: int, distance: str, block_size: int | None
) -> np.ndarray:
    """Merge the clusters of ``labels`` one closest linked pair at a time (the reference's
    ``req_numclust``), ``#clusters - req_clust`` times."""
    cur = labels
    steps = int(cur.max()) + 1 - req_clust
    for _ in range(steps):
        k = int(cur.max()) + 1
        if k <= 1:
            break
        nb = _Neighbours(_Geometry(_cluster_means(data, cur, k), distance), block_size)
        r, c = _linked_entries(nb.kappa)
        pick = np.argsort(nb.dist(r, c))[:2]
        graph = csr_matrix((np.ones(len(pick), np.int8), (r[pick], c[pick])), shape=(k, k))
        _, u = connected_components(graph, directed=True, connection="weak")
        cur = u.astype(np.int64)[cur]
    return cur


def first_neighbours(
    x: np.ndarray, *, distance: str = "cosine", block_size: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """First neighbour κ(i) of every row of ``x`` (cast to float32) and d(i, κ(i))."""
    data = _check(x, distance)
    nb = _Neighbours(_Geometry(data, distance), _block_arg(block_size))
    return nb.kappa.astype(np.int64), nb.dmin


def _block_arg(block_size: int | None) -> int | None:
    if block_size is None:
        return None
    if int(block_size) < 1:
        raise ValueError("block_size must be positive")
    return int(block_size)


def _check(x, distance: str) -> np.ndarray:
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {DISTANCES}, got {distance!r}")
    data = np.asarray(x)
    if data.ndim != 2:
        raise ValueError(f"FINCH expects a 2-D (N, D) array, got shape {data.shape}")
    if data.shape[0] == 0:
        raise ValueError("FINCH needs at least one row")
    data = data.astype(np.float32)
    if not np.all(np.isfinite(data)):
        raise ValueError("FINCH input contains NaN or Inf")
    return data


def finch(
    x: np.ndarray,
    *,
    distance: str = "cosine",
    ensure_early_exit: bool = True,
    req_clust: int | None = None,
    block_size: int | None = None,
):
    """FINCH partitions of the rows of ``x``.

    Returns ``(partitions, num_clusters)``: an (N, P) int64 array, column 0 the finest
    (first-neighbour) partition and column P-1 the coarsest kept, and the list of the P
    cluster counts. With ``req_clust`` set, returns ``(partitions, num_clusters, labels)``
    where ``labels`` (N,) has (normally) exactly ``req_clust`` clusters (see module doc).
    """
    data = _check(x, distance)
    block_size = _block_arg(block_size)
    n = data.shape[0]

    nb = _Neighbours(_Geometry(data, distance), block_size)
    labels, k = _components(nb, None)
    min_sim = _early_exit_threshold(nb) if ensure_early_exit and n > 2 else None
    del nb
    parts, counts = [labels], [k]
    cur = labels
    while True:
        means = _cluster_means(data, cur, counts[-1])
        u, k = _components(_Neighbours(_Geometry(means, distance), block_size), min_sim)
        if k == 1 or counts[-1] - k < 1:
            break
        cur = u[cur]
        parts.append(cur)
        counts.append(k)
        if counts[-2] - k == 1:  # the reference loops only while a level removes ≥ 2
            break
    partitions = np.stack(parts, axis=1)
    if req_clust is None:
        return partitions, counts
    req_clust = int(req_clust)
    if req_clust < 1:
        raise ValueError("req_clust must be ≥ 1")
    if req_clust in counts:
        req = partitions[:, counts.index(req_clust)].copy()
    elif req_clust > counts[0]:
        req = partitions[:, 0].copy()
    else:
        level = max(i for i, v in enumerate(counts) if v >= req_clust)
        req = _refine(data, partitions[:, level], req_clust, distance, block_size)
    return partitions, counts, req


def canonical_labels(parts) -> np.ndarray:
    """Relabel every column of an (N,) or (N, P) label array by order of first occurrence,
    so two partitions are equal up to relabelling iff their canonical forms are equal."""
    parts = np.asarray(parts)
    if parts.ndim == 1:
        parts = parts[:, None]
    out = np.empty(parts.shape, np.int64)
    for c in range(parts.shape[1]):
        _, first, inv = np.unique(parts[:, c], return_index=True, return_inverse=True)
        rank = np.empty(len(first), np.int64)
        rank[np.argsort(first)] = np.arange(len(first))
        out[:, c] = rank[inv.ravel()]
    return out
