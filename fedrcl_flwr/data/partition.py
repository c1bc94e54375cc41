"""Splitting a training set over clients (NumPy, and torch for the authors' split; seeded).

Every scheme returns one ``int64`` index array per client; the arrays are disjoint. They are
sorted, except for the balanced Dirichlet split (the authors' shuffled order), the
``feduv`` generator's (FedUV's order), ``file`` (the file's order) and ``flwr_datasets``
(Flower's order). Only the labels
(domains), the number of classes, ``num_clients``, the scheme's parameters, ``generator``
and ``seed`` (``partition.seed``, default the experiment's ``seed``) decide a split: never
the images, never the training augmentation.

Generators (``partition.generator``): ``project`` draws from the project's own NumPy
generator (``numpy.random.default_rng``); ``fedrcl`` runs the FedRCL authors' released
function (skynbe/FedRCL @ 378beb4 ``datasets/cifar.py``, called by ``utils/data.py:
get_dataset``; geehokim/FedACG has the same three files) with their random calls, as their
trainer calls it: on the training set *with its transforms* (see
:func:`authors_trainer_draws`); ``fedrcl_labels`` runs the same function on bare labels.
The default (``null``) is ``fedrcl`` for the balanced Dirichlet split (it exists only as
the authors' algorithm) and ``project`` for the others.

Schemes:

* ``iid`` — ``project``: a random permutation cut into equal parts (sizes differ by at
  most one, every sample used). ``fedrcl``: their ``cifar_iid`` (``N // C`` samples per
  client drawn with ``np.random.choice`` from the samples left, NumPy's global generator
  seeded with ``seed`` as their ``initalize_random_seed``; the ``N mod C`` left over are not
  used). Index-identical: with ``seed: 0`` it gives, client for client, the sets of their
  released ``client_data/{CIFAR10,CIFAR100,TinyImageNet}/balanced/iid_clients100.txt``
  (checked: 100/100 clients each; only ``N`` enters, not the labels);
* ``dirichlet`` label skew, ``balanced=True``: the FedRCL authors' algorithm
  (:func:`dirichlet_balanced`): every client gets exactly ``N // num_clients`` samples,
  drawn with per-sample weights ``p_i[class]``, ``p_i ~ Dir_K(α)``; the ``N mod
  num_clients`` left-over samples are not used. Index-identical (``fedrcl``, the default):
  on the same training set (same sample order and labels, ``K`` = its number of classes)
  and ``seed`` (their ``temp_seed(0)``: ``seed: 0``) it gives, client for client and in
  the same order, the index lists their trainer computes with the same torch and NumPy
  versions (tests/datasets/test_authors_split.py checks it against their function run on
  torchvision's ``CIFAR10`` with their transform chain). Their trainer reads
  ``client_data/<DATASET>/balanced/dirichlet<α>_clients<C>.txt`` instead when that file
  exists (100 clients in skynbe/FedRCL, 100 and 500 in geehokim/FedACG): those were drawn
  with torch 1.11, whose ``multinomial`` a later torch need not repeat; ``scheme: file``
  reads them as released;
* ``dirichlet``, ``balanced=False`` (classic, Hsu et al. / Li et al.): each class is split
  over the clients with proportions ``q ~ Dir_C(α)`` (clients already holding ``N/C``
  samples get no more); redrawn until every client has ``min_size`` samples, at most 100
  times — then a :class:`PartitionError` says to lower ``min_size`` or raise ``α``.
  ``fedrcl``: their ``cifar_dirichlet_unbalanced`` with its calls (NumPy's global
  generator seeded with ``seed``; every client's list shuffled after each try);
* ``shards`` (quantity-based label skew, McMahan et al.): samples sorted by label, cut into
  ``γ · num_clients`` equal shards, ``γ`` random shards per client. ``project``: ties in
  random order, every sample used. ``fedrcl``: their ``cifar_noniid`` (``class_per_client``
  = γ): NumPy's default ``argsort`` of the labels (not stable: its tie order is NumPy's,
  and may depend on the NumPy version and the CPU's vector instructions), shards drawn with
  ``np.random.choice`` from the shards left; ``N`` must be a multiple of ``γ · C`` (their
  code stops otherwise);
* ``domain`` — inter-domain heterogeneity (FedCCL, Qiao et al. 2024, Sec. 3.1 / 5.1):
  client *i* owns ``domains_per_client`` domains, round robin (client *i*'s *j*-th domain is
  domain number ``(i * domains_per_client + j) mod D``), so one client per domain is
  ``num_clients = D`` and several clients may share a domain. A *slot* is one
  (client, owned domain) pair; ``m_d`` is the number of slots of domain *d*. See
  :func:`by_domain` for the two draws (``balanced`` true / false). ``project`` only;
* ``pathological`` — *k* classes per client (``classes_per_client``; PFLlib's ``pat``,
  FL-bench's ``-c``, Flower Datasets' ``PathologicalPartitioner``): see
  :func:`pathological`. ``project`` only;
* ``flwr_datasets`` — any Flower Datasets partitioner (``partitioner: {name: ...,
  <its arguments>}``, :func:`fedrcl_flwr.data.hf.flwr_datasets_split`; the optional
  extra ``flwr-datasets``): Flower's draws, in Flower's order (its own ``seed``
  argument, default the split's seed). The paper splits stay the schemes above: they are
  index-identical to the authors' and no flwr-datasets partitioner draws them;
* ``file`` — read from ``path`` (see :func:`load_split_file`; draws nothing, so
  ``generator`` is ignored): JSON ``{"<client>": [indices]}``
  as ``fedrcl-flwr partition --save`` writes it, or the FedRCL / FedACG authors' released
  text format, a Python dict literal ``{0: [10385, ...], ...}`` or ``{0: {16406, ...}}``
  (``client_data/<DATASET>/balanced/*.txt`` in skynbe/FedRCL), read by a bounded scanner
  (data only; a client id given twice is an error in both formats).

Not index-identical to any released code: the ``project`` generator; the authors'
Tiny-ImageNet order (their ``TinyImageNet`` lists ``train/`` with ``os.listdir``, an order
that depends on the file system, and numbers classes in ``wnids.txt`` order; ours sorts
both), so the same function gives the same index lists that name other images there.
``feduv``: FedUV's ``partition_data`` (sonhamin/FedUV @ dd2e3c5 ``utils/dataloader.py``,
see :func:`feduv_dirichlet` and :func:`feduv_iid`), index for index on the same labels
and seed. FPL's (RethinkFL's) domain-skew splits are: ``scheme: domain`` with ``generator:
rethinkfl_digits | rethinkfl_office`` and ``domain_fraction`` (their ``percent``), see
:mod:`fedrcl_flwr.data.rethinkfl`; not disjoint for Office-Caltech (their class swap may
give a client a sample another client holds).

Impossible requests fail at once with a :class:`PartitionError` naming the numbers.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from fedrcl_flwr.config.catalog import (
    RETHINKFL_GENERATORS,
    SCHEME_NAMES,
    domain_datasets_in_words,
)
from fedrcl_flwr.config.sections import resolve_generator
from fedrcl_flwr.errors import PartitionError


def _as_parts(chunks) -> list[np.ndarray]:
    return [np.sort(np.asarray(c, dtype=np.int64)) for c in chunks]


def iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return _as_parts(np.array_split(rng.permutation(n), num_clients))


@contextmanager
def _global_generators(seed: int):
    """NumPy's legacy global generator and torch's default CPU generator seeded with
    ``seed`` for the block, both restored afterwards (the FedRCL authors' ``temp_seed``,
    ``datasets/cifar.py``, restores only NumPy's; their ``initalize_random_seed`` seeds
    both for the whole run)."""
    np_state = np.random.get_state()
    torch_state = torch.random.get_rng_state()
    np.random.seed(int(seed))
    torch.manual_seed(int(seed))
    try:
        yield
    finally:
        np.random.set_state(np_state)
        torch.random.set_rng_state(torch_state)


# The FedRCL authors' training transform chain (skynbe/FedRCL datasets/build.py:
# get_transform, the same for every non-LEAF dataset): RandomRotation(10),
# RandomCrop(imsize, padding=4), RandomHorizontalFlip(), ToTensor(), Normalize(...).
AUTHORS_ROTATION = 10.0
AUTHORS_CROP_PAD = 4


def authors_trainer_draws(n: int) -> None:
    """Spend torch's global generator as the FedRCL authors' trainer does before its first
    ``torch.multinomial``: their ``cifar_dirichlet_balanced`` reads every label as
    ``dataset[a][1]`` on the training set, which runs the training transforms on sample
    ``a`` = 0 .. n-1 in turn. Per sample, in the chain's order (torchvision's
    ``get_params``, unchanged from their torchvision 0.12 to today's):
    ``RandomRotation(10)`` one ``torch.empty(1).uniform_(-10.0, 10.0)``;
    ``RandomCrop(imsize, padding=4)`` on an ``imsize`` image (padded to ``imsize + 8``) two
    ``torch.randint(0, 9, size=(1,))`` (row, then column offset); ``RandomHorizontalFlip()``
    one ``torch.rand(1)``. ``ToTensor`` / ``Normalize`` draw nothing, nor does decoding the
    image. Only the draws are made (the same calls, in the same order), not the images."""
    lo, hi = -float(AUTHORS_ROTATION), float(AUTHORS_ROTATION)
    span = 2 * AUTHORS_CROP_PAD + 1
    for _ in range(int(n)):
        torch.empty(1).uniform_(lo, hi)
        torch.randint(0, span, size=(1,))
        torch.randint(0, span, size=(1,))
        torch.rand(1)


def dirichlet_balanced(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    seed: int,
    num_classes: int | None = None,
    trainer_draws: bool = True,
) -> list[np.ndarray]:
    """The FedRCL authors' balanced Dirichlet split (``datasets/cifar.py:
    cifar_dirichlet_balanced`` in skynbe/FedRCL, also in geehokim/FedACG), with the same
    random calls.

    With both global generators seeded by ``seed`` (their ``temp_seed(0)``): first, when
    ``trainer_draws`` (``generator: fedrcl``), the torch draws of their training transforms
    on every sample (:func:`authors_trainer_draws`; ``fedrcl_labels`` skips them: their
    function on bare labels). Then for client ``i = 0 .. C-1``:
    ``p = np.random.dirichlet([α] * K)`` (K = ``num_classes``, their
    ``len(dataset.class_to_idx)``; default ``max(labels) + 1``); every not yet assigned
    sample of class k gets the weight ``p_k`` (a float32 tensor, as theirs); the client
    takes ``N // C`` samples with ``torch.multinomial(weights, N // C,
    replacement=False)``. Then every client's list is shuffled in turn with
    ``np.random.shuffle``. A class's chance is thus ∝ ``p_k`` × (its samples left): late
    clients get what is left and are less skewed than with per-class counts. The lists keep
    the authors' (shuffled) order.

    Difference: where their code stops with an error (fewer not yet assigned samples of
    positive weight than ``N // C``, or a NaN from a Dirichlet draw at tiny α), the not yet
    assigned samples of zero weight get float32's smallest normal weight, so the client is
    filled from what is left; draws where their code runs are unchanged.
    """
    labels = np.asarray(labels, dtype=np.int64)
    n = len(labels)
    size = n // num_clients
    k = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    if k <= int(labels.max()):
        raise PartitionError(
            f"balanced Dirichlet split: label {int(labels.max())} but only {k} classes"
        )
    lab = torch.from_numpy(labels)
    free = torch.ones(n, dtype=torch.bool)
    tiny = torch.finfo(torch.float32).tiny
    parts: list[list[int]] = []
    with _global_generators(seed):
        if trainer_draws:
            authors_trainer_draws(n)
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


@contextmanager
def _numpy_global(seed: int):
    """NumPy's legacy global generator seeded with ``seed`` for the block (the authors'
    ``initalize_random_seed`` seeds it once per run; their trainer draws nothing from it
    before the split), restored afterwards."""
    state = np.random.get_state()
    np.random.seed(int(seed))
    try:
        yield
    finally:
        np.random.set_state(state)


def authors_iid(n: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """The FedRCL authors' ``cifar_iid``: ``N // C`` samples per client, each client
    ``np.random.choice(left, N // C, replace=False)`` from the list of samples left, that
    list rebuilt as ``list(set(left) - chosen)`` (Python's set order, as theirs)."""
    per = int(n / num_clients)
    if per < 1:
        raise PartitionError(f"iid split (fedrcl): {n} samples for {num_clients} clients")
    left = list(range(n))
    parts = []
    with _numpy_global(seed):
        for _ in range(num_clients):
            chosen = set(np.random.choice(left, per, replace=False).tolist())
            parts.append(sorted(chosen))
            left = list(set(left) - chosen)
    return [np.asarray(p, dtype=np.int64) for p in parts]


def authors_shards(
    labels: np.ndarray, num_clients: int, per_client: int, seed: int
) -> list[np.ndarray]:
    """The FedRCL authors' ``cifar_noniid`` (``split.mode: skew``, ``class_per_client`` =
    ``per_client``): the sample indices ordered by NumPy's default ``argsort`` of the
    labels, cut into ``per_client * C`` shards of ``N // (per_client * C)``; client by
    client, ``np.random.choice`` of ``per_client`` shards from the list of shards left
    (rebuilt as ``list(set(left) - chosen)``), the client's samples taken shard by shard in
    the chosen set's order."""
    labels = np.asarray(labels, dtype=np.int64)
    n = len(labels)
    total = num_clients * per_client
    size = int(n / total) if total else 0
    if size < 1 or size * total != n:
        raise PartitionError(
            f"shards (fedrcl): {n} samples do not cut into {num_clients} clients x "
            f"{per_client} shards of equal size (the authors' cifar_noniid needs N to be a "
            "multiple of num_clients * shards_per_client); use partition.generator project"
        )
    by_label = np.arange(n)[labels.argsort()]
    left = list(range(total))
    parts = []
    with _numpy_global(seed):
        for _ in range(num_clients):
            chosen = set(np.random.choice(left, per_client, replace=False).tolist())
            left = list(set(left) - chosen)
            parts.append(np.concatenate([by_label[s * size : (s + 1) * size] for s in chosen]))
    return _as_parts(parts)


def authors_dirichlet_unbalanced(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    min_size: int,
    seed: int,
    num_classes: int | None = None,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """The FedRCL authors' ``cifar_dirichlet_unbalanced`` with its calls (NumPy's global
    generator seeded with ``seed``): per try, class ``k = 0 .. K-1`` in turn: shuffle its
    samples, ``q = np.random.dirichlet([α] * C)``, zero for clients already holding
    ``N / C`` samples, renormalised, cut points ``(cumsum(q) * n_k).astype(int)[:-1]``;
    then every client's list is shuffled; tries repeat while a client holds fewer than
    ``min_size`` samples (theirs: 10, no limit; here at most ``max_tries``)."""
    batch = _niid_bench_dirichlet(
        labels, num_clients, alpha, min_size, seed, num_classes, max_tries, "fedrcl"
    )
    return _as_parts(batch)


def _niid_bench_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    min_size: int,
    seed: int,
    num_classes: int | None,
    max_tries: int,
    code: str,
) -> list[list]:
    """The label-Dirichlet split that FedRCL's and FedUV's code both inherit (NIID-Bench's
    ``noniid-labeldir``), with its calls on NumPy's global generator seeded with ``seed``
    (see :func:`authors_dirichlet_unbalanced` and :func:`feduv_dirichlet`). The two codes
    differ only in when the clients' lists are shuffled: ``code="fedrcl"`` inside every
    try (before the size check), ``code="feduv"`` once, after the accepted try. Returns
    each client's list in the authors' order."""
    labels = np.asarray(labels, dtype=np.int64)
    n = len(labels)
    k = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    with _numpy_global(seed):
        for _ in range(max_tries):
            batch: list[list] = [[] for _ in range(num_clients)]
            for c in range(k):
                idx_c = np.flatnonzero(labels == c)
                np.random.shuffle(idx_c)
                q = np.random.dirichlet(np.repeat(alpha, num_clients))
                q = np.array([p * (len(b) < n / num_clients) for p, b in zip(q, batch)])
                q = q / q.sum()
                cuts = (np.cumsum(q) * len(idx_c)).astype(int)[:-1]
                batch = [b + part.tolist() for b, part in zip(batch, np.split(idx_c, cuts))]
            if code == "fedrcl":
                for b in batch:
                    np.random.shuffle(b)
            if min(len(b) for b in batch) >= min_size:
                if code == "feduv":
                    for b in batch:
                        np.random.shuffle(b)
                return batch
    raise PartitionError(
        f"unbalanced Dirichlet split ({code}): no draw in {max_tries} tries gave every one "
        f"of {num_clients} clients >= {min_size} samples (alpha={alpha}, {n} samples)"
    )


def feduv_iid(n: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """FedUV's ``partition_data`` with ``partition: homo`` / ``iid``: ``np.random.permutation(N)``
    cut by ``np.array_split`` (NumPy's global generator seeded with ``seed``: their
    ``main`` seeds it and draws nothing from it before the split; client sampling uses
    Python's ``random``). Every sample is used; order as theirs (not sorted)."""
    with _numpy_global(seed):
        idxs = np.random.permutation(n)
    return [np.asarray(c, dtype=np.int64) for c in np.array_split(idxs, num_clients)]


def feduv_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    min_size: int,
    seed: int,
    num_classes: int | None = None,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """FedUV's ``partition_data`` with ``partition: noniid`` / ``noniid-labeldir``, with its
    calls on NumPy's global generator seeded with ``seed``: per try, class ``k = 0 .. K-1``:
    ``np.random.shuffle`` its sample indices (``np.where(y == k)[0]``), ``q =
    np.random.dirichlet(np.repeat(α, C))``, zero for clients holding ``N / C`` samples or
    more, renormalised, cut at ``(cumsum(q) * n_k).astype(int)[:-1]``; tries repeat while a
    client holds fewer than ``min_size`` (theirs: ``min_require_size = 10``, no limit; here
    at most ``max_tries``); then, once, each client's list is shuffled in client order.
    Differs from :func:`authors_dirichlet_unbalanced` (FedRCL's) only there: FedRCL
    shuffles the lists inside every try. ``K``: theirs hard-codes 10 (it loads only
    CIFAR-10 and STL-10); here the dataset's number of classes, the same on those two."""
    batch = _niid_bench_dirichlet(
        labels, num_clients, alpha, min_size, seed, num_classes, max_tries, "feduv"
    )
    return [np.asarray(b, dtype=np.int64) for b in batch]


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
            return _as_parts(parts)
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
    return _as_parts(np.concatenate([pieces[j] for j in row]) for row in assign)


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
    return _as_parts(parts)


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
    return _as_parts(parts)


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


# A split file lists every training index at most once: a few bytes per index. Bound
# what is read (before parsing) so that a wrong or hostile file is refused at once.
SPLIT_BYTES_PER_INDEX = 32
SPLIT_BYTES_BASE = 1 << 20

_LITERAL_ITEM = None  # compiled on first use (see _parse_dict_literal)


def _no_duplicate_keys(where: str):
    def hook(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise PartitionError(
                    f"{where}: client {k!r} appears twice (a key given "
                    "twice in one mapping; the first list would be lost)"
                )
            seen.add(k)
        return dict(pairs)

    return hook


def _parse_dict_literal(text: str, where: str):
    """The FedRCL authors' text format ``{0: [10385, ...], 1: [...], ...}`` (a Python
    dict literal of integer keys and integer lists, tuples or sets), parsed as data by a
    bounded scanner — nothing is evaluated, nesting is fixed at two levels, and a key
    given twice is an error. ``None`` when ``text`` is not of that form."""
    import re

    global _LITERAL_ITEM
    if _LITERAL_ITEM is None:
        _LITERAL_ITEM = re.compile(
            r"\s*(-?\d+)\s*:\s*(?:\[([-\d,\s]*)\]|\(([-\d,\s]*)\)|\{([-\d,\s]*)\})"
            r"\s*(,|\})"
        )
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        return None
    out: dict[int, list] = {}
    pos, end = 1, len(body)
    if not body[1:-1].strip():
        return out
    while pos < end:
        m = _LITERAL_ITEM.match(body, pos)
        if m is None:
            return None
        key = int(m.group(1))
        items = next(g for g in m.group(2, 3, 4) if g is not None)
        vals = [t.strip() for t in items.split(",")]
        if vals and vals[-1] == "":
            vals.pop()  # a trailing comma
        if any(not re.fullmatch(r"-?\d+", v) for v in vals):
            return None
        if key in out:
            raise PartitionError(
                f"{where}: client {key} appears twice (a key given twice "
                "in one mapping; the first list would be lost)"
            )
        ints = [int(v) for v in vals]
        if m.group(4) is not None:  # a set (the authors' iid files): Python's set order,
            as_set = set(ints)  # as their trainer and ast.literal_eval build it
            if len(as_set) != len(ints):
                raise PartitionError(f"{where}: client {key}: an index is given twice")
            ints = list(as_set)
        out[key] = ints
        pos = m.end()
        if m.group(5) == "}":
            return out if pos == end else None
    return None


def load_split_file(path: str, n: int, num_clients: int) -> list[np.ndarray]:
    """Client index lists from a split file, checked: ``num_clients`` clients with ids
    ``0 .. num_clients-1`` (JSON string keys or integer keys), each given once, integer
    indices (a list, or a set as in the authors' iid files, taken in Python's set order as
    their trainer does) in ``[0, n)``, no index given twice. The file must be UTF-8 text
    of at most ``1 MiB + 32 bytes x n`` (read before parsing). JSON is tried first, then
    the authors' Python dict literal, read by a bounded scanner
    (:func:`_parse_dict_literal`: data only, nothing is executed). Any problem is one
    :class:`PartitionError` naming the file."""
    from pathlib import Path

    p = Path(path).expanduser()
    where = f"partition.path {str(p)!r}"
    data = _read_split_mapping(p, where, n)
    out = _client_index_lists(data, where, n, num_clients)
    allidx = np.concatenate(out)
    uniq, counts = np.unique(allidx, return_counts=True)
    if len(uniq) != len(allidx):
        dup = int(uniq[counts > 1][0])
        owners = [c for c, a in enumerate(out) if dup in a]
        raise PartitionError(
            f"{where}: index {dup} is given more than once "
            f"(clients {owners}); client splits must be disjoint"
        )
    return out


def _read_split_mapping(p, where: str, n: int) -> dict:
    """The split file's mapping (JSON, else the authors' dict literal), read within its
    size bound (:func:`load_split_file`)."""
    import json

    from fedrcl_flwr.config import read_text_file

    limit = SPLIT_BYTES_BASE + SPLIT_BYTES_PER_INDEX * int(n)
    if not p.exists():
        raise PartitionError(f"{where}: cannot read the split file (no such file)")
    text = read_text_file(
        p, limit, f"a split of {n} training samples", label=where, error=PartitionError
    )
    if "\0" in text:
        raise PartitionError(
            f"{where}: binary content (NUL bytes); a split file is JSON or "
            "the authors' dict-literal text"
        )
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys(where))
    except RecursionError:
        raise PartitionError(
            f"{where}: nested too deeply (a split file is one mapping of index lists)"
        ) from None
    except ValueError as exc:
        if isinstance(exc, PartitionError):
            raise
        data = _parse_dict_literal(text, where)
        if data is None:
            raise PartitionError(
                f"{where}: neither JSON nor a Python dict literal {{client: [indices], ...}}"
            ) from None
    if not isinstance(data, dict):
        raise PartitionError(
            f"{where}: must map client ids to index lists, got {type(data).__name__}"
        )
    return data


def _client_index_lists(data: dict, where: str, n: int, num_clients: int) -> list[np.ndarray]:
    """One ``int64`` index array per client ``0 .. num_clients-1`` from the file's mapping,
    each id given once, each list non-empty, every index in ``[0, n)``."""
    parts: dict[int, list] = {}
    for key, idx in data.items():
        try:
            cid = int(key)
        except (TypeError, ValueError):
            cid = None
        if cid is None or isinstance(key, bool) or str(cid) != str(key).strip():
            raise PartitionError(f"{where}: client id {str(key)[:40]!r} is not an integer")
        if cid in parts:
            raise PartitionError(f"{where}: client {cid} appears twice")
        if isinstance(idx, (set, frozenset)):  # the authors' iid files: {0: {16406, ...}}
            idx = list(idx)
        if not isinstance(idx, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in idx
        ):
            raise PartitionError(f"{where}: client {cid}: indices must be a list of integers")
        parts[cid] = list(idx)
    if sorted(parts) != list(range(num_clients)):
        raise PartitionError(
            f"{where}: holds {len(parts)} clients (ids {_span(parts)}) but "
            f"federation.num_clients is {num_clients} (ids 0..{num_clients - 1})"
        )
    out = []
    for c in range(num_clients):
        try:
            out.append(np.asarray(parts[c], dtype=np.int64))
        except OverflowError:
            raise PartitionError(
                f"{where}: client {c}: an index is out of range for {n} training samples"
            ) from None
    for c, a in enumerate(out):
        if len(a) == 0:
            raise PartitionError(f"{where}: client {c} has no samples")
        if a.min() < 0 or a.max() >= n:
            bad = int(a[(a < 0) | (a >= n)][0])
            raise PartitionError(
                f"{where}: client {c}: index {bad} out of range for {n} training samples"
            )
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


def partition(
    labels: np.ndarray,
    num_clients: int,
    scheme: str,
    *,
    alpha: float = 0.3,
    balanced: bool = True,
    shards_per_client: int = 2,
    min_size: int = 10,
    domains: np.ndarray | None = None,
    domains_per_client: int = 1,
    samples_per_class: int | None = None,
    seed: int = 0,
    path: str | None = None,
    generator: str | None = None,
    num_classes: int | None = None,
    domain_fraction=None,
    classes_per_client: int = 2,
    partitioner: dict | None = None,
) -> list[np.ndarray]:
    """Index arrays of ``num_clients`` clients (see the module docstring). ``generator``:
    ``project`` | ``fedrcl`` | ``fedrcl_labels`` | ``feduv`` | ``None`` (see
    :func:`resolve_generator`);
    ``num_classes``: the dataset's number of classes (the authors' ``K``; default
    ``max(labels) + 1``); ``domain_fraction``: ``rethinkfl_*`` only, their ``percent``
    (:mod:`fedrcl_flwr.data.rethinkfl`).

    Long on purpose: one flat dispatch over the schemes, each branch the checks its
    builder needs and one call (a table of builders would hide which checks go with which
    scheme)."""
    labels = np.asarray(labels)
    n = len(labels)
    gen = resolve_generator(scheme, balanced, generator)
    if num_clients < 1:
        raise PartitionError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > n:
        raise PartitionError(
            f"{num_clients} clients but only {n} training samples: every client needs at least one"
        )
    if alpha <= 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}")
    if scheme == "file":
        if not path:
            raise PartitionError("partition.scheme 'file' needs partition.path")
        return load_split_file(path, n, num_clients)
    rng = np.random.default_rng([int(seed), 271828])
    authors = gen in ("fedrcl", "fedrcl_labels")
    if gen == "feduv" and scheme == "iid":
        return feduv_iid(n, num_clients, seed)
    if scheme == "iid":
        return authors_iid(n, num_clients, seed) if authors else iid(n, num_clients, rng)
    if scheme == "dirichlet":
        if balanced:
            return dirichlet_balanced(
                labels,
                num_clients,
                alpha,
                seed,
                num_classes=num_classes,
                trainer_draws=gen == "fedrcl",
            )
        if num_clients * min_size > n:
            raise PartitionError(
                f"{num_clients} clients x min_size {min_size} exceeds the {n} training samples"
            )
        if gen == "feduv":
            return feduv_dirichlet(
                labels, num_clients, alpha, min_size, seed, num_classes=num_classes
            )
        if authors:
            return authors_dirichlet_unbalanced(
                labels, num_clients, alpha, min_size, seed, num_classes=num_classes
            )
        return dirichlet_unbalanced(labels, num_clients, alpha, min_size, rng)
    if scheme == "shards":
        if authors:
            return authors_shards(labels, num_clients, shards_per_client, seed)
        return shards(labels, num_clients, shards_per_client, rng)
    if scheme == "pathological":
        return pathological(labels, num_clients, classes_per_client, rng)
    if scheme == "flwr_datasets":
        from fedrcl_flwr.data.hf import flwr_datasets_split

        if not partitioner:
            raise PartitionError("partition.scheme 'flwr_datasets' needs partition.partitioner")
        return flwr_datasets_split(partitioner, labels, num_clients, seed, domains)
    if scheme == "domain":
        if domains is None:
            raise PartitionError(
                "partition.scheme 'domain' needs a dataset with domains "
                f"({domain_datasets_in_words()})"
            )
        domains = np.asarray(domains)
        if len(domains) != n:
            raise PartitionError(f"domain split: {len(domains)} domain ids for {n} samples")
        if gen in RETHINKFL_GENERATORS:
            from fedrcl_flwr.data.rethinkfl import rethinkfl_domain_split

            try:
                return rethinkfl_domain_split(
                    labels, domains, num_clients, int(seed), gen, domain_fraction
                )
            except ValueError as exc:
                raise PartitionError(f"{gen} split: {exc}") from None
        return by_domain(
            labels,
            domains,
            num_clients,
            domains_per_client,
            balanced,
            alpha,
            rng,
            samples_per_class=samples_per_class,
        )
    raise PartitionError(f"unknown partition scheme {scheme!r} ({' | '.join(SCHEME_NAMES)})")
