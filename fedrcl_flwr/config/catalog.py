"""What the project knows by name, declared once: the datasets, the partition schemes and
their generators, and the report metrics. The schema (:mod:`fedrcl_flwr.config`), the
loaders (:mod:`fedrcl_flwr.data`), the CLI and the report (:mod:`fedrcl_flwr.report`) all
import these tables; nothing else lists the names but the data layer's table of loaders,
checked against :data:`DATASETS` (standard library only, so every layer can import it).

Adding a dataset: its entry in :data:`DATASETS` (what the configuration can tell before
loading: channels, domains, where its images come from) and its entry in
``fedrcl_flwr/data/sources/table.py``'s ``SOURCES`` (its reader, default augmentation,
torchvision layout, what the seed draws), under the same name and in the same order; no
other code branches on a dataset's name (``tests/registry/test_registries.py`` checks
both tables). A partition scheme: an entry in :data:`PARTITION_SCHEMES` and its entry in
``fedrcl_flwr/data/partition.py``'s ``SCHEMES``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# ----------------------------------------------------------------------------- datasets


@dataclass(frozen=True)
class Requirement:
    """An optional package a dataset's reader imports: its ``module``, the package in
    words (``what``) and the ``extra`` that installs it (checked before a run)."""

    module: str
    what: str
    extra: str


@dataclass(frozen=True)
class DatasetInfo:
    """What the configuration can tell about a dataset before it is loaded.

    ``channels``: its images' channels (``None``: known only once loaded, or from the
    config: ``dataset.synthetic.channels``); ``domains``: it can carry domains (``partition.
    scheme: domain``); ``torchvision``: the ``torchvision.datasets`` class that reads it
    (its file layout, checks and decoding), if any; ``source``: where its images come
    from: ``root`` (files under ``dataset.root``), ``path`` (the file or directory
    ``dataset.path`` names, which is then required) or ``generated`` (drawn from the
    ``dataset.synthetic`` section and the seed: no files; that section gives its channels,
    classes, domains and size); ``domain_folders``: its domains are the sub-folders
    ``dataset.domains`` names (none without them); ``titled``: a report's title names it
    with the last component of where it is read from (``npz cifar_tail``);
    ``requires``: an optional package its reader needs; ``domains_from``: what gives it
    domains, when it can carry them (the messages that ask for a dataset with domains
    say it: :func:`domain_datasets_in_words`)."""

    channels: int | None = 3
    domains: bool = False
    torchvision: str | None = None
    source: str = "root"  # root | path | generated
    domain_folders: bool = False
    titled: bool = False
    requires: Requirement | None = None
    domains_from: str = ""

    @property
    def generated(self) -> bool:
        return self.source == "generated"

    @property
    def location_key(self) -> str | None:
        """The config key naming where it is read from (``None``: generated)."""
        return None if self.generated else f"dataset.{self.source}"


# name -> what it is; the order is the order the error messages list them in
DATASETS: dict[str, DatasetInfo] = {
    "synthetic": DatasetInfo(
        channels=None, domains=True, source="generated", domains_from="num_domains >= 2"
    ),
    "cifar10": DatasetInfo(3, torchvision="CIFAR10"),
    "cifar100": DatasetInfo(3, torchvision="CIFAR100"),
    "mnist": DatasetInfo(1, torchvision="MNIST"),
    "fmnist": DatasetInfo(1, torchvision="FashionMNIST"),
    "svhn": DatasetInfo(3, torchvision="SVHN"),
    "usps": DatasetInfo(1, torchvision="USPS"),
    "stl10": DatasetInfo(3, torchvision="STL10"),
    "tinyimagenet": DatasetInfo(3),
    "imagefolder": DatasetInfo(
        3, domains=True, domain_folders=True, titled=True, domains_from="dataset.domains"
    ),
    "digit5": DatasetInfo(3, domains=True),
    # your arrays: d_train gives domains
    "npz": DatasetInfo(
        channels=None, domains=True, source="path", titled=True, domains_from="d_train"
    ),
    # a Hugging Face DatasetDict (save_to_disk)
    "hf_disk": DatasetInfo(
        channels=None,
        domains=True,
        source="path",
        domains_from="dataset.domain_column",
        requires=Requirement("datasets", "Hugging Face datasets", "flwr-datasets"),
    ),
}
DATASET_NAMES = tuple(DATASETS)
TORCHVISION_CLASSES = {n: d.torchvision for n, d in DATASETS.items() if d.torchvision}


def domain_datasets_in_words() -> str:
    """The datasets that can carry domains, each with what gives it them:
    ``synthetic with num_domains >= 2, imagefolder with dataset.domains, digit5, npz
    with d_train or hf_disk with dataset.domain_column``."""
    return in_words(
        f"{n} with {d.domains_from}" if d.domains_from else n
        for n, d in DATASETS.items()
        if d.domains
    )


def dataset_info(name: str) -> DatasetInfo:
    """``DATASETS[name]``; a name the configuration's checks refuse reads as a plain
    dataset under ``dataset.root`` (``DatasetInfo()``)."""
    return DATASETS.get(name, _PLAIN)


_PLAIN = DatasetInfo()

# ---------------------------------------------------------------------- partition schemes

# scheme -> how a title names it (``partition`` heatmaps, ``report`` / ``plot`` titles)
PARTITION_SCHEMES: dict[str, str] = {
    "iid": "IID",
    "dirichlet": "Dirichlet",
    "shards": "shards",
    "domain": "by domain",
    "pathological": "pathological",
    "flwr_datasets": "Flower Datasets",
    "file": "split file",
}
SCHEME_NAMES = tuple(PARTITION_SCHEMES)
# ``partition.generator``: whose random draws make a split (fedrcl_flwr/data/partition.py)
# rethinkfl_*: RethinkFL's (FPL's) domain-skew splits, scheme domain only
# (fedrcl_flwr/data/sources/rethinkfl.py)
RETHINKFL_GENERATORS = ("rethinkfl_digits", "rethinkfl_office")
GENERATORS = ("project", "fedrcl", "fedrcl_labels", "feduv", *RETHINKFL_GENERATORS)
# ``dataset.test_split``: ``random`` (a seeded test_fraction per class) or RethinkFL's
# Office-Caltech rule (image i of a domain, ImageFolder order, is a test image iff i % 10 > 7)
TEST_SPLITS = ("random", "rethinkfl")

# ----------------------------------------------------------------------------- metrics

# the metrics a paper reports, each a key of summary.json (ema@ROUND: accuracy_at[ROUND])
SUMMARY_METRICS = {"final": "final_accuracy", "best": "best_accuracy", "last5": "last5"}
EMA_METRIC = "ema@ROUND"  # the EMA accuracy at a target round, e.g. ema@500 (FedRCL)
# per-client evaluation (fedrcl_flwr/client_eval.py): ``client_<stat>`` is summary.json's
# and the round records' ``client_acc_<stat>``
CLIENT_STATS = ("mean", "std", "worst10", "best10")
CLIENT_STAT_KEYS = tuple(f"client_acc_{s}" for s in CLIENT_STATS)
CLIENT_METRICS = tuple(f"client_{s}" for s in CLIENT_STATS)
# ``evaluation.per_client``: which clients are evaluated, on which local test data
# the papers' "Avg" of an inter-domain table (FedCCL Tables 1-2, RethinkFL's FPL): the
# unweighted mean over the test set's domains of each domain's accuracy; ``<m>_domain_mean``
# is metric ``<m>`` taken per domain, then averaged (summary.json's ``<m>_domain_mean``,
# ``ema_domain_mean_at`` for ``ema@ROUND_domain_mean``; fedrcl_flwr/run/summaries.py)
DOMAIN_MEAN = "_domain_mean"
DOMAIN_METRICS = tuple(m + DOMAIN_MEAN for m in (*SUMMARY_METRICS, EMA_METRIC))
# every name ``report --metric`` takes, in the order the help lists them
METRIC_NAMES = tuple(SUMMARY_METRICS) + (EMA_METRIC,) + DOMAIN_METRICS + CLIENT_METRICS
# sampled: the round's clients (just averaged into the model: an optimistic measure);
# unsampled: as many clients drawn from those not in the round (unbiased); all: every one
PER_CLIENT_CLIENTS = ("sampled", "unsampled", "all")
PER_CLIENT_LOCAL_TESTS = ("auto", "holdout", "domain")

_EMA_RE = re.compile(r"ema@([1-9][0-9]*)")


def in_words(names: Iterable[str]) -> str:
    """``a, b or c``."""
    names = list(names)
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


def metric_choices(per_client: bool = False) -> str:
    """The metrics in words: ``final, best, last5 or ema@ROUND`` (``per_client``: and the
    ``client_*`` metrics)."""
    return in_words(METRIC_NAMES if per_client else METRIC_NAMES[: -len(CLIENT_METRICS)])


def is_domain_mean(metric: Any) -> bool:
    """``metric`` is a domain-mean metric (``last5_domain_mean``, ``ema@500_domain_mean``)."""
    return isinstance(metric, str) and metric.endswith(DOMAIN_MEAN)


def pooled_metric(metric: str) -> str:
    """The pooled metric a domain-mean metric averages per domain (``last5_domain_mean``
    -> ``last5``); any other metric unchanged."""
    return metric[: -len(DOMAIN_MEAN)] if is_domain_mean(metric) else metric


def domain_metric(metric: str) -> str:
    """The domain-mean counterpart of a pooled test-accuracy metric (``last5`` ->
    ``last5_domain_mean``); a domain-mean or per-client metric unchanged."""
    if is_domain_mean(metric) or metric in CLIENT_METRICS:
        return metric
    return metric + DOMAIN_MEAN


def is_inter_domain(scheme: Any) -> bool:
    """An inter-domain experiment (``partition.scheme: domain``): its test set carries the
    domains, and its reported metric is the domain mean (the papers' "Avg")."""
    return scheme == "domain"


def reported_metric(report_metric: str, scheme: Any) -> str:
    """The metric a run reports: ``evaluation.report_metric``, taken as its domain mean
    in an inter-domain experiment (:func:`is_inter_domain`), as FedCCL and RethinkFL
    report theirs."""
    return domain_metric(report_metric) if is_inter_domain(scheme) else report_metric


def is_report_metric(text: Any, per_client: bool = False) -> bool:
    """``text`` is ``final | best | last5 | ema@ROUND`` (ROUND >= 1), each also with
    ``_domain_mean``, or, with ``per_client``, one of the ``client_*`` metrics."""
    if not isinstance(text, str):
        return False
    base = pooled_metric(text)
    if base in SUMMARY_METRICS or _EMA_RE.fullmatch(base):
        return True
    return per_client and text in CLIENT_METRICS


def ema_round(metric: str) -> int | None:
    """ROUND of ``ema@ROUND`` or ``ema@ROUND_domain_mean`` (``None`` for any other)."""
    m = _EMA_RE.fullmatch(pooled_metric(str(metric)))
    return int(m.group(1)) if m else None
