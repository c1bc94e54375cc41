"""Splitting a training set over clients (NumPy, and torch for the authors' split; seeded).

Every scheme returns one ``int64`` index array per client; the arrays are disjoint. They are
sorted, except for the balanced Dirichlet split (the authors' shuffled order) and ``file``
(the file's order). Only the labels (domains), ``num_clients``, the scheme's parameters and
``seed`` (``partition.seed``, default the experiment's ``seed``) decide a split.
Schemes:

* ``iid`` — a random permutation cut into equal parts (sizes differ by at most one);
* ``dirichlet`` label skew, ``balanced=True``: the FedRCL authors' algorithm with their
  random calls (see :func:`dirichlet_balanced`): every client gets exactly
  ``N // num_clients`` samples, drawn with per-sample weights ``p_i[class]``,
  ``p_i ~ Dir_K(α)``; the ``N mod num_clients`` left-over samples are not used. With
  ``seed=0`` and the real CIFAR labels this is the authors' split index for index;
* ``dirichlet``, ``balanced=False`` (classic, Hsu et al. / Li et al.): each class is split
  over the clients with proportions ``q ~ Dir_C(α)`` (clients already holding ``N/C``
  samples get no more); redrawn until every client has ``min_size`` samples, at most 100
  times — then a :class:`PartitionError` says to lower ``min_size`` or raise ``α``;
* ``shards`` (quantity-based label skew, McMahan et al.): samples sorted by label, cut into
  ``γ · num_clients`` equal shards, ``γ`` random shards per client;
* ``domain`` — clients own whole domains: client *i* gets ``domains_per_client``
  domains (round robin), and the samples of each domain are split over the clients that
  own it — equally (``balanced``) or with Dirichlet(α) proportions;
* ``file`` — read from ``path`` (see :func:`load_split_file`): JSON ``{"<client>": [indices]}``
  as ``fedrcl-flwr partition --save`` writes it, or the FedRCL authors' released text
  format, a Python dict literal ``{0: [10385, ...], ...}`` (``client_data/<DATASET>/
  balanced/dirichlet<α>_clients100.txt`` in skynbe/FedRCL), read with ``ast.literal_eval``.

Impossible requests fail at once with a :class:`PartitionError` naming the numbers.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import numpy as np
import torch

from fedrcl_flwr.config import ConfigError


class PartitionError(ConfigError):
    """A partition request that cannot be met (too many clients, min size too large...)."""


def _as_parts(chunks) -> list[np.ndarray]:
    return [np.sort(np.asarray(c, dtype=np.int64)) for c in chunks]


def iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return _as_parts(np.array_split(rng.permutation(n), num_clients))


@contextmanager
def _global_generators(seed: int):
    """NumPy's legacy global generator and torch's default CPU generator seeded with
    ``seed`` for the block, both restored afterwards (the FedRCL authors' ``temp_seed``,
    ``datasets/cifar.py``, restores only NumPy's)."""
    np_state = np.random.get_state()
    torch_state = torch.random.get_rng_state()
    np.random.seed(int(seed))
    torch.manual_seed(int(seed))
    try:
        yield
    finally:
        np.random.set_state(np_state)
        torch.random.set_rng_state(torch_state)


def dirichlet_balanced(labels: np.ndarray, num_clients: int, alpha: float,
                       seed: int) -> list[np.ndarray]:
    """The FedRCL authors' balanced Dirichlet split (``datasets/cifar.py:
    cifar_dirichlet_balanced`` in skynbe/FedRCL), with the same random calls.

    With both global generators seeded by ``seed``: for client ``i = 0 .. C-1``,
    ``p = np.random.dirichlet([α] * K)`` (K = ``max(labels) + 1``); every not yet assigned
    sample of class k gets the weight ``p_k`` (a float32 tensor, as theirs); the client takes
    ``N // C`` samples with ``torch.multinomial(weights, N // C, replacement=False)``. Then
    every client's list is shuffled in turn with ``np.random.shuffle``. A class's chance is
    thus ∝ ``p_k`` × (its samples left): late clients get what is left and are less skewed
    than with per-class counts. The lists keep the authors' (shuffled) order.

    Difference: where their code stops with an error (fewer not yet assigned samples of
    positive weight than ``N // C``, or a NaN from a Dirichlet draw at tiny α), the not yet
    assigned samples of zero weight get float32's smallest normal weight, so the client is
    filled from what is left; draws where their code runs are unchanged.
    """
    labels = np.asarray(labels, dtype=np.int64)
    n = len(labels)
    size = n // num_clients
    k = int(labels.max()) + 1
    lab = torch.from_numpy(labels)
    free = torch.ones(n, dtype=torch.bool)
    tiny = torch.finfo(torch.float32).tiny
    parts: list[list[int]] = []
    with _global_generators(seed):
        for _ in range(num_clients):
            p = np.random.dirichlet(np.repeat(alpha, k))
            p = np.where(np.isfinite(p), p, 0.0)
            weights = torch.from_numpy(p.astype(np.float32))[lab]
            weights[~free] = 0.0
            if int((weights > 0).sum()) < size:
                weights[free & (weights <= 0)] = tiny
            idx = torch.multinomial(weights, size, replacement=False)
            free[idx] = False
            parts.append(idx.tolist())
        for part in parts:
            np.random.shuffle(part)
    return [np.asarray(part, dtype=np.int64) for part in parts]


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


def load_split_file(path: str, n: int, num_clients: int) -> list[np.ndarray]:
    """Client index lists from a split file, checked: ``num_clients`` clients with ids
    ``0 .. num_clients-1`` (JSON string keys or integer keys), integer indices in
    ``[0, n)``, no index given twice. JSON is tried first, then a Python literal
    (``ast.literal_eval``: data only, nothing is executed). Any problem is one
    :class:`PartitionError` naming the file."""
    import ast
    import json
    from pathlib import Path

    p = Path(path).expanduser()
    where = f"partition.path {str(p)!r}"
    try:
        text = p.read_text()
    except OSError as exc:
        raise PartitionError(f"{where}: cannot read the split file ({exc.strerror or exc})") \
            from None
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise PartitionError(f"{where}: neither JSON nor a Python dict literal "
                                 "{client: [indices], ...}") from None
    if not isinstance(data, dict):
        raise PartitionError(f"{where}: must map client ids to index lists, got "
                             f"{type(data).__name__}")
    parts: dict[int, list] = {}
    for key, idx in data.items():
        try:
            cid = int(key)
        except (TypeError, ValueError):
            cid = None
        if cid is None or isinstance(key, bool) or str(cid) != str(key).strip():
            raise PartitionError(f"{where}: client id {key!r} is not an integer")
        if cid in parts:
            raise PartitionError(f"{where}: client {cid} appears twice")
        if not isinstance(idx, (list, tuple)) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in idx):
            raise PartitionError(f"{where}: client {cid}: indices must be a list of integers")
        parts[cid] = list(idx)
    if sorted(parts) != list(range(num_clients)):
        raise PartitionError(f"{where}: holds {len(parts)} clients (ids {_span(parts)}) but "
                             f"federation.num_clients is {num_clients} (ids 0..{num_clients - 1})")
    out = [np.asarray(parts[c], dtype=np.int64) for c in range(num_clients)]
    for c, a in enumerate(out):
        if len(a) == 0:
            raise PartitionError(f"{where}: client {c} has no samples")
        if a.min() < 0 or a.max() >= n:
            bad = int(a[(a < 0) | (a >= n)][0])
            raise PartitionError(f"{where}: client {c}: index {bad} out of range for "
                                 f"{n} training samples")
    allidx = np.concatenate(out)
    uniq, counts = np.unique(allidx, return_counts=True)
    if len(uniq) != len(allidx):
        dup = int(uniq[counts > 1][0])
        owners = [c for c, a in enumerate(out) if dup in a]
        raise PartitionError(f"{where}: index {dup} is given more than once "
                             f"(clients {owners}); client splits must be disjoint")
    return out


def _span(ids) -> str:
    ids = sorted(ids)
    return f"{ids[0]}..{ids[-1]}" if ids else "none"


def save_split_file(parts, path) -> None:
    """Write ``{"<client id>": [indices], ...}`` as JSON (read back by ``scheme: file``)."""
    import json
    from pathlib import Path

    data = {str(c): [int(i) for i in p] for c, p in enumerate(parts)}
    Path(path).expanduser().write_text(json.dumps(data) + "\n")


def partition(labels: np.ndarray, num_clients: int, scheme: str, *, alpha: float = 0.3,
              balanced: bool = True, shards_per_client: int = 2, min_size: int = 10,
              domains: Optional[np.ndarray] = None, domains_per_client: int = 1,
              seed: int = 0, path: Optional[str] = None) -> list[np.ndarray]:
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
    if scheme == "file":
        if not path:
            raise PartitionError("partition.scheme 'file' needs partition.path")
        return load_split_file(path, n, num_clients)
    rng = np.random.default_rng([int(seed), 271828])
    if scheme == "iid":
        return iid(n, num_clients, rng)
    if scheme == "dirichlet":
        if balanced:
            return dirichlet_balanced(labels, num_clients, alpha, seed)
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
                         "(iid | dirichlet | shards | domain | file)")
