"""The project's own split schemes: one function per scheme, each drawing from the NumPy
generator it is given (``partition.generator: project``) and returning one sorted
``int64`` index array per client: ``iid``, the classic unbalanced Dirichlet label skew
(Hsu et al. / Li et al.), ``shards`` (McMahan et al.), ``pathological`` (*k* classes per
client) and ``domain`` (FedCCL's inter-domain split, Qiao et al. 2024, Sec. 3.1 / 5.1).
The schemes are described in :mod:`fedrcl_flwr.data.partition`, which dispatches to them;
the authors' generators are in :mod:`fedrcl_flwr.data.partition_authors`.
"""

from __future__ import annotations

import numpy as np

from fedrcl_flwr.errors import PartitionError


def as_parts(chunks) -> list[np.ndarray]:
    return [np.sort(np.asarray(c, dtype=np.int64)) for c in chunks]


def iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return as_parts(np.array_split(rng.permutation(n), num_clients))


def dirichlet_unbalanced(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    min_size: int,
    rng: np.random.Generator,
    max_tries: int = 100,
) -> list[np.ndarray]:
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
            return as_parts(parts)
    raise PartitionError(
        f"unbalanced Dirichlet split: no draw in {max_tries} tries gave every one of "
        f"{num_clients} clients >= {min_size} samples (alpha={alpha}, {n} samples); lower "
        "partition.min_size, raise partition.alpha or use fewer clients"
    )


def shards(
    labels: np.ndarray, num_clients: int, per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    n = len(labels)
    total = num_clients * per_client
    if total > n:
        raise PartitionError(
            f"shards: {num_clients} clients x {per_client} shards = {total} "
            f"shards but only {n} samples"
        )
    # sort by label, ties in random order
    order = np.lexsort((rng.random(n), labels))
    pieces = np.array_split(order, total)
    assign = rng.permutation(total).reshape(num_clients, per_client)
    return as_parts(np.concatenate([pieces[j] for j in row]) for row in assign)


def pathological(
    labels: np.ndarray, num_clients: int, classes_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """``classes_per_client`` (*k*) classes per client (the pathological non-IID split of
    Li et al. 2022, "Federated Learning on Non-IID Data Silos", as Flower Datasets'
    ``PathologicalPartitioner(class_assignment_mode="random")`` draws it): client by
    client, *k* distinct classes drawn uniformly without replacement from the classes
    present (sorted), ``rng.choice(classes, k, replace=False)``; then each class's samples
    (in index order) are cut with ``np.array_split`` into as many parts as clients drew
    it, handed out in client order. A class no client drew is not used (its samples belong
    to nobody, as in Flower's). Index-identical to Flower's partitioner whose generator is
    ``rng`` (``tests/datasets/test_partition_flower.py``: its ``_rng`` replaced by ours; with its own
    ``seed`` argument it draws from ``default_rng(seed)``, another stream: use ``scheme:
    flwr_datasets`` for that split). Ours is sorted, Flower's shuffled after the draws.

    Refused (:class:`PartitionError`): *k* outside 1..number of classes, or a class drawn
    by more clients than it has samples (a client would get nothing of it)."""
    labels = np.asarray(labels)
    classes = np.unique(labels)
    k = int(classes_per_client)
    if not 1 <= k <= len(classes):
        raise PartitionError(
            f"partition.classes_per_client must be in 1..{len(classes)} (the classes of the "
            f"training set), got {classes_per_client}"
        )
    owned = [rng.choice(classes, size=k, replace=False).tolist() for _ in range(num_clients)]
    parts: list[list] = [[] for _ in range(num_clients)]
    for c in classes.tolist():
        holders = [i for i in range(num_clients) if c in owned[i]]
        if not holders:
            continue
        idx = np.flatnonzero(labels == c)
        if len(holders) > len(idx):
            raise PartitionError(
                f"pathological split: class {c} was drawn by {len(holders)} clients but has "
                f"{len(idx)} samples; use fewer clients or more classes_per_client"
            )
        for i, chunk in zip(holders, np.array_split(idx, len(holders))):
            parts[i].extend(chunk.tolist())
    return as_parts(parts)


def _domain_owners(dom_ids: np.ndarray, num_clients: int, per_client: int) -> dict:
    nd = len(dom_ids)
    if per_client > nd:
        raise PartitionError(
            f"domain split: domains_per_client={per_client} but the data has only {nd} domains"
        )
    owners: dict[int, list[int]] = {int(d): [] for d in dom_ids}
    for i in range(num_clients):
        for j in range(per_client):
            owners[int(dom_ids[(i * per_client + j) % nd])].append(i)
    orphan = [int(d) for d, o in owners.items() if not o]
    if orphan:
        raise PartitionError(
            f"domain split: {num_clients} clients x {per_client} domain(s) "
            f"leave domain(s) {orphan} without a client (of {nd} domains); "
            "use more clients or partition.domains_per_client"
        )
    return owners


def by_domain(
    labels: np.ndarray,
    domains: np.ndarray,
    num_clients: int,
    per_client: int,
    balanced: bool,
    alpha: float,
    rng: np.random.Generator,
    samples_per_class: int | None = None,
) -> list[np.ndarray]:
    """Inter-domain split (FedCCL Sec. 3.1: ``P_i(x) != P_j(x)`` for every pair of clients).

    Owners: see the module docstring (round robin, ``m_d`` slots of domain *d*; a slot is
    one (client, owned domain) pair). ``n[d, k]`` is the number of training samples of
    class *k* in domain *d*. Every draw is without replacement from a seeded random
    permutation of each (domain, class) pool, so clients are disjoint.

    **Balanced** (``balanced=True``; the paper's ``|D_i| = |D_j|`` and ``P_i(y) = P_j(y)``):
    every slot receives exactly ``c`` samples of every used class, drawn from its domain.
    The used classes are those with ``n[d, k] >= m_d`` in *every* domain (each slot can get
    one); a class below that in some domain is **dropped for every client** (a warning
    names it) rather than giving some clients a different label mix — so all clients keep
    identical label distributions. ``c = samples_per_class`` if set, else the largest
    common size ``c = min_{d, used k} floor(n[d, k] / m_d)``; a ``samples_per_class``
    above that is a :class:`PartitionError` naming the limiting (domain, class). Every
    client thus holds ``domains_per_client * (#used classes) * c`` samples with the same
    per-class counts; the rest of the data is not used (as in the paper's equal-size
    setting, sizes are capped by the smallest domain/class).

    **Imbalanced** (``balanced=False``; ``|D_i| != |D_j|``, ``P_i(y) != P_j(y)``, the paper's
    Dirichlet with α = 0.5 by default): each client *i* draws label proportions
    ``p_i ~ Dir_K(α)`` (one draw per client, applied inside each domain it owns). Each
    (domain, class) pool is first cut into ``m_d`` equal shares (sizes differ by at most
    one, ``numpy.array_split`` of the permuted pool), one per slot; slot (i, d) then keeps
    ``floor(w_ik * share)`` samples of class *k* with ``w_ik = p_ik / max_k p_ik``
    (its favourite class keeps its whole share). Hence the client's label mix is
    ``∝ n[d, k] * p_ik`` (its domain's mix tilted by ``p_i``) and its size
    ``sum_k floor(w_ik * n[d, k] / m_d)`` follows from the draw: a concentrated ``p_i``
    (small α) gives a small, nearly single-class client, α → ∞ gives the whole domain
    with its own label mix. Samples not kept are not used. A client left with no sample
    is a :class:`PartitionError` (no redraw, so the result stays a pure function of the
    seed). ``min_size`` does not apply to this scheme.
    """
    labels = np.asarray(labels)
    dom_ids = np.unique(domains)
    owners = _domain_owners(dom_ids, num_clients, per_client)
    pools = _domain_class_pools(labels, domains, dom_ids, owners, rng)
    if balanced:
        parts = _balanced_domain_draw(
            pools, dom_ids, np.unique(labels), owners, num_clients, samples_per_class
        )
    else:
        parts = _imbalanced_domain_draw(
            pools, dom_ids, np.unique(labels), owners, num_clients, alpha, rng
        )
    return as_parts(parts)


def domain_split_note(
    parts: list, labels: np.ndarray, domains: np.ndarray | None, names: list | None = None
) -> str | None:
    """What a run says when its domain split leaves training images unused (the balanced
    split keeps the same per-class count from every domain, the imbalanced split a
    Dirichlet share: :func:`by_domain`): ``"the domain split uses U of N training images
    (per domain: name u/n, ...)"`` (a domain by its name in ``names``, else its id);
    ``None`` when every image is used."""
    used = np.concatenate([np.asarray(p, np.int64) for p in parts]) if parts else np.zeros(0)
    n = len(labels)
    if len(used) >= n:
        return None
    text = f"the domain split uses {len(used):,} of {n:,} training images"
    if domains is not None:
        doms = np.asarray(domains)
        names = list(names or [])
        per = [
            f"{names[int(d)] if int(d) < len(names) else int(d)} "
            f"{int(np.sum(doms[used] == d)):,}/{int(np.sum(doms == d)):,}"
            for d in np.unique(doms)
        ]
        text += f" (per domain: {', '.join(per)})"
    return text


def _domain_class_pools(
    labels: np.ndarray,
    domains: np.ndarray,
    dom_ids: np.ndarray,
    owners: dict,
    rng: np.random.Generator,
) -> dict:
    """``(domain, class) ->`` its training indices in a seeded random order (every draw of
    :func:`by_domain` takes from the front of these, so clients are disjoint)."""
    pools = {}
    for d in dom_ids:
        in_d = domains == d
        n_d = int(in_d.sum())
        if n_d < len(owners[int(d)]):
            raise PartitionError(
                f"domain {int(d)} has {n_d} samples for {len(owners[int(d)])} clients"
            )
        for c in np.unique(labels):
            pools[int(d), int(c)] = rng.permutation(np.flatnonzero(in_d & (labels == c)))
    return pools


def _balanced_domain_draw(
    pools: dict,
    dom_ids: np.ndarray,
    classes: np.ndarray,
    owners: dict,
    num_clients: int,
    samples_per_class: int | None,
) -> list[list]:
    """:func:`by_domain`, ``balanced``: ``c`` samples of every used class per slot."""
    used = [
        int(c)
        for c in classes
        if all(len(pools[int(d), int(c)]) >= len(owners[int(d)]) for d in dom_ids)
    ]
    dropped = sorted(set(int(c) for c in classes) - set(used))
    if not used:
        raise PartitionError(
            "balanced domain split: no class has at least one sample per client in every domain"
        )
    if dropped:
        import warnings

        warnings.warn(
            f"balanced domain split: class(es) {dropped} are missing from (or "
            "too rare in) some domain and are left out for every client so "
            "that all clients keep the same label distribution",
            stacklevel=4,
        )
    limit, where = min(
        (len(pools[int(d), c]) // len(owners[int(d)]), (int(d), c)) for d in dom_ids for c in used
    )
    per_class = limit if samples_per_class is None else int(samples_per_class)
    if per_class > limit:
        d, c = where
        raise PartitionError(
            f"balanced domain split: partition.samples_per_class={per_class} but domain "
            f"{d} has only {len(pools[d, c])} samples of class {c} for "
            f"{len(owners[d])} client(s) (at most {limit} per client)"
        )
    parts: list[list] = [[] for _ in range(num_clients)]
    for d in dom_ids:
        own = owners[int(d)]
        for c in used:
            pool = pools[int(d), c]
            for j, i in enumerate(own):
                parts[i].extend(pool[j * per_class : (j + 1) * per_class].tolist())
    return parts


def _imbalanced_domain_draw(
    pools: dict,
    dom_ids: np.ndarray,
    classes: np.ndarray,
    owners: dict,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
) -> list[list]:
    """:func:`by_domain`, not ``balanced``: per client ``p_i ~ Dir_K(alpha)``, a share of
    each (domain, class) pool kept in proportion to ``p_ik / max_k p_ik``."""
    props = rng.dirichlet(np.full(len(classes), alpha), size=num_clients)  # (clients, K)
    w = props / props.max(axis=1, keepdims=True)
    parts: list[list] = [[] for _ in range(num_clients)]
    for d in dom_ids:
        own = owners[int(d)]
        for ci, c in enumerate(classes):
            shares = np.array_split(pools[int(d), int(c)], len(own))
            for i, share in zip(own, shares):
                keep = len(share) if w[i, ci] >= 1.0 else int(np.floor(w[i, ci] * len(share)))
                parts[i].extend(share[:keep].tolist())
    empty = [i for i, p in enumerate(parts) if not p]
    if empty:
        raise PartitionError(
            f"imbalanced domain split: client(s) {empty[:5]} got no sample "
            f"(alpha={alpha}); use fewer clients per domain or a larger "
            "partition.alpha"
        )
    return parts
