"""Splitting a training set over clients (pure NumPy, seeded).

Every scheme returns one sorted ``int64`` index array per client; the arrays are disjoint.
Schemes:

* ``iid`` — a random permutation cut into equal parts (sizes differ by at most one);
* ``dirichlet`` label skew, ``balanced=True`` (the FedRCL authors' scheme): every client
  gets exactly ``N // num_clients`` samples; client *i* draws ``p_i ~ Dir_K(α)`` and samples
  without replacement with weight ``p_i[class]`` (renormalised over the classes that still
  have samples). The ``N mod num_clients`` left-over samples are not used;
* ``dirichlet``, ``balanced=False`` (classic, Hsu et al. / Li et al.): each class is split
  over the clients with proportions ``q ~ Dir_C(α)`` (clients already holding ``N/C``
  samples get no more); redrawn until every client has ``min_size`` samples, at most 100
  times — then a :class:`PartitionError` says to lower ``min_size`` or raise ``α``;
* ``shards`` (quantity-based label skew, McMahan et al.): samples sorted by label, cut into
  ``γ · num_clients`` equal shards, ``γ`` random shards per client;
* ``domain`` — clients own whole domains: client *i* gets ``domains_per_client``
  domains (round robin), and the samples of each domain are split over the clients that
  own it — equally (``balanced``) or with Dirichlet(α) proportions.

Impossible requests fail at once with a :class:`PartitionError` naming the numbers.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from fedrcl_flwr.config import ConfigError


class PartitionError(ConfigError):
    """A partition request that cannot be met (too many clients, min size too large...)."""


def _as_parts(chunks) -> list[np.ndarray]:
    return [np.sort(np.asarray(c, dtype=np.int64)) for c in chunks]


def iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return _as_parts(np.array_split(rng.permutation(n), num_clients))


def dirichlet_balanced(labels: np.ndarray, num_clients: int, alpha: float,
                       rng: np.random.Generator) -> list[np.ndarray]:
    n = len(labels)
    size = n // num_clients
    classes = np.unique(labels)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    left = np.array([len(p) for p in pools])
    taken = np.zeros(len(classes), dtype=np.int64)
    parts = []
    for _ in range(num_clients):
        p = rng.dirichlet(np.full(len(classes), alpha))
        counts = np.zeros(len(classes), dtype=np.int64)
        need = size
        while need > 0:
            avail = left - counts
            w = np.where(avail > 0, p, 0.0)
            if w.sum() <= 0:  # the client's classes are exhausted: any class with samples
                w = (avail > 0).astype(np.float64)
            draw = rng.multinomial(need, w / w.sum())
            draw = np.minimum(draw, avail)
            counts += draw
            need = size - counts.sum()
        idx = [pools[k][taken[k]:taken[k] + counts[k]] for k in range(len(classes))]
        taken += counts
        left -= counts
        parts.append(np.concatenate(idx))
    return _as_parts(parts)


def dirichlet_unbalanced(labels: np.ndarray, num_clients: int, alpha: float, min_size: int,
                         rng: np.random.Generator, max_tries: int = 100) -> list[np.ndarray]:
    n = len(labels)
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            q = rng.dirichlet(np.full(num_clients, alpha))
            sizes = np.array([len(p) for p in parts])
            q = np.where(sizes < n / num_clients, q, 0.0)
            q = q / q.sum() if q.sum() > 0 else np.full(num_clients, 1.0 / num_clients)
            cuts = (np.cumsum(q) * len(idx)).astype(int)[:-1]
            for i, chunk in enumerate(np.split(idx, cuts)):
                parts[i].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return _as_parts(parts)
    raise PartitionError(
        f"unbalanced Dirichlet split: no draw in {max_tries} tries gave every one of "
        f"{num_clients} clients >= {min_size} samples (alpha={alpha}, {n} samples); lower "
        "partition.min_size, raise partition.alpha or use fewer clients")


def shards(labels: np.ndarray, num_clients: int, per_client: int,
           rng: np.random.Generator) -> list[np.ndarray]:
    n = len(labels)
    total = num_clients * per_client
    if total > n:
        raise PartitionError(f"shards: {num_clients} clients x {per_client} shards = {total} "
                             f"shards but only {n} samples")
    # sort by label, ties in random order
    order = np.lexsort((rng.random(n), labels))
    pieces = np.array_split(order, total)
    assign = rng.permutation(total).reshape(num_clients, per_client)
    return _as_parts(np.concatenate([pieces[j] for j in row]) for row in assign)


def by_domain(domains: np.ndarray, num_clients: int, per_client: int, balanced: bool,
              alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    dom_ids = np.unique(domains)
    nd = len(dom_ids)
    if per_client > nd:
        raise PartitionError(f"domain split: domains_per_client={per_client} but the data has "
                             f"only {nd} domains")
    owners: dict[int, list[int]] = {int(d): [] for d in dom_ids}
    for i in range(num_clients):
        for j in range(per_client):
            owners[int(dom_ids[(i * per_client + j) % nd])].append(i)
    orphan = [int(d) for d, o in owners.items() if not o]
    if orphan:
        raise PartitionError(f"domain split: {num_clients} clients x {per_client} domain(s) "
                             f"leave domain(s) {orphan} without a client (of {nd} domains); "
                             "use more clients or partition.domains_per_client")
    parts: list[list] = [[] for _ in range(num_clients)]
    for d, own in owners.items():
        idx = rng.permutation(np.flatnonzero(domains == d))
        if len(idx) < len(own):
            raise PartitionError(f"domain {d} has {len(idx)} samples for {len(own)} clients")
        if balanced:
            chunks = np.array_split(idx, len(own))
        else:
            q = rng.dirichlet(np.full(len(own), alpha))
            sizes = 1 + np.floor(q * (len(idx) - len(own))).astype(int)
            sizes[np.argmax(q)] += len(idx) - sizes.sum()
            chunks = np.split(idx, np.cumsum(sizes)[:-1])
        for i, chunk in zip(own, chunks):
            parts[i].extend(chunk.tolist())
    return _as_parts(parts)


def partition(labels: np.ndarray, num_clients: int, scheme: str, *, alpha: float = 0.3,
              balanced: bool = True, shards_per_client: int = 2, min_size: int = 10,
              domains: Optional[np.ndarray] = None, domains_per_client: int = 1,
              seed: int = 0) -> list[np.ndarray]:
    """Index arrays of ``num_clients`` clients (see the module docstring)."""
    labels = np.asarray(labels)
    n = len(labels)
    if num_clients < 1:
        raise PartitionError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > n:
        raise PartitionError(f"{num_clients} clients but only {n} training samples: every "
                             "client needs at least one")
    if alpha <= 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}")
    rng = np.random.default_rng([int(seed), 271828])
    if scheme == "iid":
        return iid(n, num_clients, rng)
    if scheme == "dirichlet":
        if balanced:
            return dirichlet_balanced(labels, num_clients, alpha, rng)
        if num_clients * min_size > n:
            raise PartitionError(f"{num_clients} clients x min_size {min_size} exceeds the "
                                 f"{n} training samples")
        return dirichlet_unbalanced(labels, num_clients, alpha, min_size, rng)
    if scheme == "shards":
        return shards(labels, num_clients, shards_per_client, rng)
    if scheme == "domain":
        if domains is None:
            raise PartitionError("partition.scheme 'domain' needs a dataset with domains "
                                 "(synthetic with num_domains >= 2, digit5, or imagefolder "
                                 "with dataset.domains)")
        domains = np.asarray(domains)
        if len(domains) != n:
            raise PartitionError(f"domain split: {len(domains)} domain ids for {n} samples")
        return by_domain(domains, num_clients, domains_per_client, balanced, alpha, rng)
    raise PartitionError(f"unknown partition scheme {scheme!r} "
                         "(iid | dirichlet | shards | domain)")
