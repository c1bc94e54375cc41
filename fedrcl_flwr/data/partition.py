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
:func:`~fedrcl_flwr.data.partition_authors.authors_trainer_draws`); ``fedrcl_labels``
runs the same function on bare labels.
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
  (:func:`~fedrcl_flwr.data.partition_authors.dirichlet_balanced`): every client gets
  exactly ``N // num_clients`` samples, drawn with per-sample weights ``p_i[class]``, ``p_i ~ Dir_K(α)``; the ``N mod
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
  :func:`~fedrcl_flwr.data.partition_schemes.by_domain` for the two draws (``balanced``
  true / false). ``project`` only;
* ``pathological`` — *k* classes per client (``classes_per_client``; PFLlib's ``pat``,
  FL-bench's ``-c``, Flower Datasets' ``PathologicalPartitioner``): see
  :func:`~fedrcl_flwr.data.partition_schemes.pathological`. ``project`` only;
* ``flwr_datasets`` — any Flower Datasets partitioner (``partitioner: {name: ...,
  <its arguments>}``, :func:`fedrcl_flwr.data.sources.hf.flwr_datasets_split`; the
  optional extra ``flwr-datasets``): Flower's draws, in Flower's order (its own ``seed``
  argument, default the split's seed). The paper splits stay the schemes above: they are
  index-identical to the authors' and no flwr-datasets partitioner draws them;
* ``file`` — read from ``path`` (:mod:`fedrcl_flwr.data.split_file`; draws nothing, so
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
see :mod:`fedrcl_flwr.data.partition_authors`), index for index on the same labels
and seed. FPL's (RethinkFL's) domain-skew splits are: ``scheme: domain`` with ``generator:
rethinkfl_digits | rethinkfl_office`` and ``domain_fraction`` (their ``percent``), see
:mod:`fedrcl_flwr.data.sources.rethinkfl`; not disjoint for Office-Caltech (their class
swap may give a client a sample another client holds).

Impossible requests fail at once with a :class:`PartitionError` naming the numbers.

This module holds :func:`partition` and its table :data:`SCHEMES` (scheme name -> the
function that checks a request of that scheme and draws it); the project's schemes are in
:mod:`fedrcl_flwr.data.partition_schemes`, the authors' generators in
:mod:`fedrcl_flwr.data.partition_authors`, the split-file format in
:mod:`fedrcl_flwr.data.split_file`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedrcl_flwr.config.catalog import (
    RETHINKFL_GENERATORS,
    SCHEME_NAMES,
    domain_datasets_in_words,
)
from fedrcl_flwr.config.sections import resolve_generator
from fedrcl_flwr.data.partition_authors import (
    authors_dirichlet_unbalanced,
    authors_iid,
    authors_shards,
    dirichlet_balanced,
    feduv_dirichlet,
    feduv_iid,
)
from fedrcl_flwr.data.partition_schemes import (
    by_domain,
    dirichlet_unbalanced,
    iid,
    pathological,
    shards,
)
from fedrcl_flwr.data.split_file import load_split_file
from fedrcl_flwr.errors import PartitionError


@dataclass(frozen=True)
class SplitRequest:
    """The arguments of one :func:`partition` call, as every scheme's function reads
    them: ``n`` samples, ``gen`` the resolved generator
    (:func:`~fedrcl_flwr.config.sections.resolve_generator`)."""

    labels: np.ndarray
    n: int
    num_clients: int
    gen: str
    alpha: float
    balanced: bool
    shards_per_client: int
    min_size: int
    domains: np.ndarray | None
    domains_per_client: int
    samples_per_class: int | None
    seed: int
    path: str | None
    num_classes: int | None
    domain_fraction: object
    classes_per_client: int
    partitioner: dict | None
    project_rng: np.random.Generator | None  # seeded with ``seed``; None for ``file``

    @property
    def authors(self) -> bool:
        """The FedRCL authors' function draws (``fedrcl`` / ``fedrcl_labels``)."""
        return self.gen in ("fedrcl", "fedrcl_labels")

    def rng(self) -> np.random.Generator:
        """The ``project`` generator of this split (seeded with ``seed``)."""
        assert self.project_rng is not None  # made for every scheme but ``file``
        return self.project_rng


def _split_iid(r: SplitRequest) -> list[np.ndarray]:
    if r.gen == "feduv":
        return feduv_iid(r.n, r.num_clients, r.seed)
    if r.authors:
        return authors_iid(r.n, r.num_clients, r.seed)
    return iid(r.n, r.num_clients, r.rng())


def _split_dirichlet(r: SplitRequest) -> list[np.ndarray]:
    if r.balanced:
        return dirichlet_balanced(
            r.labels,
            r.num_clients,
            r.alpha,
            r.seed,
            num_classes=r.num_classes,
            trainer_draws=r.gen == "fedrcl",
        )
    if r.num_clients * r.min_size > r.n:
        raise PartitionError(
            f"{r.num_clients} clients x min_size {r.min_size} exceeds the {r.n} training samples"
        )
    if r.gen == "feduv":
        return feduv_dirichlet(
            r.labels, r.num_clients, r.alpha, r.min_size, r.seed, num_classes=r.num_classes
        )
    if r.authors:
        return authors_dirichlet_unbalanced(
            r.labels, r.num_clients, r.alpha, r.min_size, r.seed, num_classes=r.num_classes
        )
    return dirichlet_unbalanced(r.labels, r.num_clients, r.alpha, r.min_size, r.rng())


def _split_shards(r: SplitRequest) -> list[np.ndarray]:
    if r.authors:
        return authors_shards(r.labels, r.num_clients, r.shards_per_client, r.seed)
    return shards(r.labels, r.num_clients, r.shards_per_client, r.rng())


def _split_pathological(r: SplitRequest) -> list[np.ndarray]:
    return pathological(r.labels, r.num_clients, r.classes_per_client, r.rng())


def _split_flwr_datasets(r: SplitRequest) -> list[np.ndarray]:
    from fedrcl_flwr.data.sources.hf import flwr_datasets_split

    if not r.partitioner:
        raise PartitionError("partition.scheme 'flwr_datasets' needs partition.partitioner")
    return flwr_datasets_split(r.partitioner, r.labels, r.num_clients, r.seed, r.domains)


def _split_domain(r: SplitRequest) -> list[np.ndarray]:
    if r.domains is None:
        raise PartitionError(
            f"partition.scheme 'domain' needs a dataset with domains ({domain_datasets_in_words()})"
        )
    domains = np.asarray(r.domains)
    if len(domains) != r.n:
        raise PartitionError(f"domain split: {len(domains)} domain ids for {r.n} samples")
    if r.gen in RETHINKFL_GENERATORS:
        from fedrcl_flwr.data.sources.rethinkfl import rethinkfl_domain_split

        try:
            return rethinkfl_domain_split(
                r.labels, domains, r.num_clients, int(r.seed), r.gen, r.domain_fraction
            )
        except ValueError as exc:
            raise PartitionError(f"{r.gen} split: {exc}") from None
    return by_domain(
        r.labels,
        domains,
        r.num_clients,
        r.domains_per_client,
        r.balanced,
        r.alpha,
        r.rng(),
        samples_per_class=r.samples_per_class,
    )


def _split_file(r: SplitRequest) -> list[np.ndarray]:
    if not r.path:
        raise PartitionError("partition.scheme 'file' needs partition.path")
    return load_split_file(r.path, r.n, r.num_clients)


# scheme name -> the function that checks a request of that scheme and draws it: the
# catalog's PARTITION_SCHEMES, same names, same order (tests/registry/test_registries.py)
SCHEMES: dict[str, Callable[[SplitRequest], list[np.ndarray]]] = {
    "iid": _split_iid,
    "dirichlet": _split_dirichlet,
    "shards": _split_shards,
    "domain": _split_domain,
    "pathological": _split_pathological,
    "flwr_datasets": _split_flwr_datasets,
    "file": _split_file,
}


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
    (:mod:`fedrcl_flwr.data.sources.rethinkfl`). The checks every scheme shares come
    first; then the scheme's function in :data:`SCHEMES` checks what it needs and draws."""
    labels = np.asarray(labels)
    n = len(labels)
    gen = resolve_generator(scheme, balanced, generator)
    _check_shared(n, num_clients, alpha)
    split = SCHEMES.get(scheme)
    if split is None:
        raise PartitionError(f"unknown partition scheme {scheme!r} ({' | '.join(SCHEME_NAMES)})")
    request = SplitRequest(
        labels=labels,
        n=n,
        num_clients=num_clients,
        gen=gen,
        alpha=alpha,
        balanced=balanced,
        shards_per_client=shards_per_client,
        min_size=min_size,
        domains=domains,
        domains_per_client=domains_per_client,
        samples_per_class=samples_per_class,
        seed=seed,
        path=path,
        num_classes=num_classes,
        domain_fraction=domain_fraction,
        classes_per_client=classes_per_client,
        partitioner=partitioner,
        project_rng=None if scheme == "file" else np.random.default_rng([int(seed), 271828]),
    )
    return split(request)


def _check_shared(n: int, num_clients: int, alpha: float) -> None:
    """The checks of every scheme: at least one client, no more clients than samples,
    ``alpha`` > 0."""
    if num_clients < 1:
        raise PartitionError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > n:
        raise PartitionError(
            f"{num_clients} clients but only {n} training samples: every client needs at least one"
        )
    if alpha <= 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}")
