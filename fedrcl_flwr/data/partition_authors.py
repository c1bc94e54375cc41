"""The authors' split generators, index for index with their released code on the same
labels and seed: the FedRCL authors' (skynbe/FedRCL @ 378beb4 ``datasets/cifar.py``, called
by ``utils/data.py: get_dataset``; geehokim/FedACG has the same three files) ``cifar_iid``,
``cifar_noniid``, ``cifar_dirichlet_balanced`` (with the draws of their trainer's training
transforms, :func:`authors_trainer_draws`) and ``cifar_dirichlet_unbalanced``
(``partition.generator: fedrcl`` / ``fedrcl_labels``), and FedUV's ``partition_data``
(sonhamin/FedUV @ dd2e3c5 ``utils/dataloader.py``; ``partition.generator: feduv``). Each
draws from the global generators their code uses (NumPy's legacy one, torch's default CPU
one), seeded for the call and restored afterwards. The schemes they belong to are
described in :mod:`fedrcl_flwr.data.partition`.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from fedrcl_flwr.data.partition_schemes import as_parts
from fedrcl_flwr.errors import PartitionError


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
    return as_parts(parts)


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
    return as_parts(batch)


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
