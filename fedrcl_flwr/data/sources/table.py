"""Every dataset of the catalog once, by name: :data:`SOURCES` (its reader, standard
training augmentation, torchvision layout, whether the seed draws its arrays, the settings
that key its cache entry) and :func:`read_source`, which hands a dataset's settings to its
reader. The catalog (:mod:`fedrcl_flwr.config.catalog`) holds the facts known before
loading; this table, how each dataset is loaded."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedrcl_flwr.augment import AugmentSpec
from fedrcl_flwr.config.catalog import DATASET_NAMES, dataset_info
from fedrcl_flwr.data.sources.digit5 import read_digit5
from fedrcl_flwr.data.sources.imagefolder import read_imagefolder, read_tinyimagenet
from fedrcl_flwr.data.sources.npz import read_npz
from fedrcl_flwr.data.sources.raw import DatasetError, RawSplit
from fedrcl_flwr.data.sources.synthetic import read_synthetic
from fedrcl_flwr.data.sources.torchvision_files import LAYOUTS, TorchvisionLayout, read_torchvision


@dataclass(frozen=True)
class SourceArgs:
    """What :func:`read_source` hands a reader: the dataset settings that shape its
    arrays (``root`` expanded)."""

    name: str
    root: Path
    path: str | None
    download: bool
    image_size: int | None
    synthetic: dict
    seed: int
    domains: list
    test_fraction: float
    verify_md5: bool
    test_split: str
    columns: tuple[str | None, str | None, str | None]  # image, label, domain column


# (train, test, domain names, number of classes its own class list names or None)
SourceRead = tuple[RawSplit, RawSplit, list, int | None]


def _never(d: Any) -> bool:
    return False


def _always(d: Any) -> bool:
    return True


def _no_key_fields(d: Any) -> dict:
    return {}


@dataclass(frozen=True)
class DataSource:
    """How a dataset is loaded (its facts before loading are the catalog's
    :class:`~fedrcl_flwr.config.catalog.DatasetInfo`).

    ``read``: its reader (:class:`SourceArgs` -> train, test, domain names, the classes
    its own class list names); ``augment``: its standard training augmentation, as the
    papers' code uses (``None``: natural images of any size, scaled to the image size:
    :func:`fedrcl_flwr.data.datasets.default_augment`); ``torchvision``: how
    torchvision's class reads it; ``seeded(d)``: the experiment's seed draws its arrays
    (beyond ``dataset.val_fraction``: :func:`fedrcl_flwr.data.cache.keys.seed_shapes_arrays`);
    ``key_fields(d)``: settings of the dataset config ``d`` only this dataset reads, added to its cache key."""

    read: Callable[[SourceArgs], SourceRead]
    augment: AugmentSpec | None
    torchvision: TorchvisionLayout | None = None
    seeded: Callable[[Any], bool] = _never
    key_fields: Callable[[Any], dict] = _no_key_fields


def _read_synthetic(a: SourceArgs) -> SourceRead:
    tr, te, dnames = read_synthetic(a.synthetic, a.seed)
    classes = a.synthetic.get("num_classes")
    return tr, te, dnames, None if classes is None else int(classes)


def _read_torchvision(a: SourceArgs) -> SourceRead:
    tr, te = read_torchvision(a.name, a.root, a.download, a.verify_md5)
    return tr, te, [], tr.classes


def _read_tinyimagenet(a: SourceArgs) -> SourceRead:
    return (*read_tinyimagenet(a.root, a.image_size), [], None)


def _read_imagefolder(a: SourceArgs) -> SourceRead:
    return (
        *read_imagefolder(a.root, a.domains, a.image_size, a.test_fraction, a.seed, a.test_split),
        None,
    )


def _read_digit5(a: SourceArgs) -> SourceRead:
    return (*read_digit5(a.root, a.download, a.domains, a.verify_md5), None)


def _read_npz(a: SourceArgs) -> SourceRead:
    assert a.path is not None  # dataset.path: required (catalog source "path")
    return (*read_npz(Path(os.path.expanduser(a.path))), None)


def _read_hf_disk(a: SourceArgs) -> SourceRead:
    from fedrcl_flwr.data.sources.hf import read_hf_disk

    assert a.path is not None  # dataset.path: required (catalog source "path")
    tr, te, names = read_hf_disk(
        a.path, *a.columns[:2], image_size=a.image_size, domain_column=a.columns[2]
    )
    return tr, te, names, tr.classes


def _synthetic_key(d: Any) -> dict:
    from dataclasses import asdict

    return {"synthetic": asdict(d.synthetic)}


def _imagefolder_seeded(d: Any) -> bool:
    """An image folder without ``train`` / ``test`` sub-folders: the seed draws its test
    split (:func:`read_imagefolder`)."""
    root = Path(os.path.expanduser(d.root or "."))
    folders = [root / x for x in d.domains] if d.domains else [root]
    return not all((f / "train").is_dir() and (f / "test").is_dir() for f in folders)


def _hf_columns_key(d: Any) -> dict:
    columns = [d.image_column, d.label_column]  # which columns are read
    domain = getattr(d, "domain_column", None)
    return {"columns": columns + [domain] if domain else columns}


# name -> how it is loaded: the catalog's DATASETS, same names, same order
# (tests/registry/test_registries.py)
SOURCES: dict[str, DataSource] = {
    "synthetic": DataSource(
        _read_synthetic, AugmentSpec(2, True), seeded=_always, key_fields=_synthetic_key
    ),
    "cifar10": DataSource(_read_torchvision, AugmentSpec(4, True), LAYOUTS["cifar10"]),
    "cifar100": DataSource(_read_torchvision, AugmentSpec(4, True), LAYOUTS["cifar100"]),
    "mnist": DataSource(_read_torchvision, AugmentSpec(0, False), LAYOUTS["mnist"]),
    "fmnist": DataSource(_read_torchvision, AugmentSpec(0, False), LAYOUTS["fmnist"]),
    "svhn": DataSource(_read_torchvision, AugmentSpec(4, False), LAYOUTS["svhn"]),
    "usps": DataSource(_read_torchvision, AugmentSpec(0, False), LAYOUTS["usps"]),
    "stl10": DataSource(_read_torchvision, AugmentSpec(12, True), LAYOUTS["stl10"]),
    "tinyimagenet": DataSource(_read_tinyimagenet, AugmentSpec(8, True)),
    "imagefolder": DataSource(_read_imagefolder, None, seeded=_imagefolder_seeded),
    "digit5": DataSource(_read_digit5, AugmentSpec(2, False)),
    # your own arrays: nothing is assumed about them (digits, text, medical images, ...:
    # a horizontal flip is wrong for most that are not natural photographs); opt in with
    # dataset.crop_pad / dataset.flip / dataset.rotation
    "npz": DataSource(_read_npz, AugmentSpec(0, False)),
    # your data, like npz: opt in to augmentation
    "hf_disk": DataSource(_read_hf_disk, AugmentSpec(0, False), key_fields=_hf_columns_key),
}


def read_source(
    name: str,
    root: str,
    *,
    path: str | None,
    download: bool,
    image_size: int | None,
    synthetic: dict | None,
    seed: int,
    domains: list | None,
    test_fraction: float,
    verify_md5: bool,
    test_split: str = "random",
    columns: tuple[str | None, str | None, str | None] = (None, None, None),
) -> tuple[RawSplit, RawSplit, list, int | None]:
    """The train and test images of source ``name`` (its reader in :data:`SOURCES`), its
    domain names, and the number of classes its own class list names (CIFAR's
    ``batches.meta``, a Hugging Face ``ClassLabel``, the synthetic generator's
    ``num_classes``; ``None`` for the others)."""
    source = SOURCES.get(name)
    if source is None:
        raise DatasetError(f"unknown dataset {name!r} (known: {', '.join(DATASET_NAMES)})")
    if dataset_info(name).source == "path" and not path:
        raise DatasetError(f"dataset.path is required when dataset.name is {name}")
    args = SourceArgs(
        name=name,
        root=Path(os.path.expanduser(root or ".")),
        path=path,
        download=download,
        image_size=image_size,
        synthetic=synthetic or {},
        seed=seed,
        domains=list(domains or []),
        test_fraction=test_fraction,
        verify_md5=verify_md5,
        test_split=test_split,
        columns=columns,
    )
    return source.read(args)
