"""Datasets read by torchvision's own classes (``torchvision.datasets``): CIFAR-10/100,
STL-10, SVHN, USPS, MNIST and Fashion-MNIST (idx files). Each dataset's
:class:`TorchvisionLayout` says which files its class reads and how the class is called
for a split; the class decodes and checks them, and every refusal becomes one
:class:`~fedrcl_flwr.data.sources.raw.DatasetError` (files missing, an MD5 that differs from the
official release, files it cannot decode). Nothing is downloaded unless asked.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedrcl_flwr.config.catalog import TORCHVISION_CLASSES
from fedrcl_flwr.data.sources.raw import DatasetError, RawSplit
from fedrcl_flwr.data.sources.raw import hwc as _hwc
from fedrcl_flwr.data.sources.raw import int_labels as _int_labels


@dataclass(frozen=True)
class TorchvisionLayout:
    """How the ``torchvision.datasets`` class of a dataset (the catalog's
    ``torchvision``) is read. ``files(cls, root)``: the folder and the ``(file name, MD5
    or None)`` list the class reads (``None``: not checked when loading);
    ``split(cls, root, train, download)``: one split's images, labels and the number of
    classes the class's own list names (or ``None``); ``md5_checked``: the class checks
    its files' MD5s on every load (``dataset.verify_md5: false`` then swaps in
    :func:`_existence_checked`); ``idx_gz``: MNIST's ``.gz`` idx files are unpacked
    first (:func:`_unpack_idx_gz`)."""

    files: Callable[[Any, Path], tuple[Path, list[tuple[str, str | None]]]]
    split: Callable[[Any, Path, bool, bool], tuple[Any, Any, int | None]]
    md5_checked: bool
    idx_gz: bool = False


def _missing(name: str, root: Path, extra: str = "") -> DatasetError:
    how = (
        (
            f"set dataset.download: true on a machine with a network (uses "
            f"torchvision.datasets.{TORCHVISION_CLASSES[name]}), or copy the files there"
        )
        if name in TORCHVISION_CLASSES
        else "put the data there"
    )
    return DatasetError(
        f"dataset '{name}' not found under {root}{extra}: {how}, or point "
        f"dataset.root at the directory that holds it"
    )


def torchvision_files(name: str, root: Path) -> tuple[Path, list[tuple[str, str | None]]]:
    """The folder and the ``(file name, MD5 or None)`` list that torchvision's class for
    ``name`` reads (its :class:`TorchvisionLayout`'s ``files``, taken from the class's own
    attributes, so they follow torchvision). ``None``: torchvision does not check that
    file's checksum when loading."""
    import torchvision.datasets as tvd

    return _layout(name).files(getattr(tvd, TORCHVISION_CLASSES[name]), root)


def _layout(name: str) -> TorchvisionLayout:
    layout = LAYOUTS.get(name)
    if layout is None:
        raise DatasetError(f"dataset {name!r} is not read by torchvision")
    return layout


def _cifar_files(cls, root: Path) -> tuple[Path, list]:
    files = [(f, m) for f, m in cls.train_list + cls.test_list]
    return root / cls.base_folder, files + [(cls.meta["filename"], cls.meta["md5"])]


def _cifar_split(cls, root: Path, train: bool, download: bool) -> tuple:
    ds = cls(str(root), train=train, download=download)
    return ds.data, ds.targets, len(ds.classes)  # the classes batches.meta names (their K)


def _stl10_files(cls, root: Path) -> tuple[Path, list]:
    return root / cls.base_folder, [(f, m) for f, m in cls.train_list + cls.test_list]


def _stl10_split(cls, root: Path, train: bool, download: bool) -> tuple:
    ds = cls(str(root), split="train" if train else "test", download=download)
    return ds.data, ds.labels, None


def _svhn_files(cls, root: Path) -> tuple[Path, list]:
    return root / "svhn", [(cls.split_list[s][1], cls.split_list[s][2]) for s in ("train", "test")]


def _svhn_split(cls, root: Path, train: bool, download: bool) -> tuple:
    ds = cls(str(root / "svhn"), split="train" if train else "test", download=download)
    return ds.data, ds.labels, None


def _usps_files(cls, root: Path) -> tuple[Path, list]:
    # torchvision's USPS reads the bz2 files without checking them
    return root / "usps", [(cls.split_list[s][1], None) for s in ("train", "test")]


def _usps_split(cls, root: Path, train: bool, download: bool) -> tuple:
    ds = cls(str(root / "usps"), train=train, download=download)
    return ds.data, ds.targets, None


def _idx_files(cls, root: Path) -> tuple[Path, list]:
    """MNIST / FashionMNIST: the uncompressed idx files in ``<root>/<Class>/raw`` (the MD5s
    torchvision lists are those of the .gz downloads; loading only checks existence)."""
    return (
        root / cls.__name__ / "raw",
        [(os.path.splitext(os.path.basename(url))[0], None) for url, _ in cls.resources],
    )


def _idx_split(cls, root: Path, train: bool, download: bool) -> tuple:
    ds = cls(str(root), train=train, download=download)
    return ds.data.numpy(), ds.targets.numpy(), None


def _unpack_idx_gz(folder: Path, files: list) -> None:
    """MNIST / Fashion-MNIST as distributed are ``*-idx?-ubyte.gz``; torchvision's class
    only reads the unpacked files (it unpacks only after a download). Unpack any .gz
    present next to a missing file, with torchvision's own ``extract_archive``."""
    from torchvision.datasets.utils import extract_archive

    for fname, _ in files:
        gz = folder / f"{fname}.gz"
        if not (folder / fname).exists() and gz.is_file():
            try:
                extract_archive(str(gz), str(folder))
            except (OSError, EOFError) as exc:
                raise DatasetError(f"{gz}: cannot be unpacked ({exc})") from None


def _existence_checked(cls):
    """``cls`` (torchvision's CIFAR10 / CIFAR100 / SVHN / STL10) with every expected
    MD5 replaced by ``None``: torchvision's own ``check_integrity(path, None)`` then only
    checks that each file exists, and the class decodes the files exactly as it decodes
    the official ones. Same name and folders as ``cls``."""
    attrs = {}
    for key in ("train_list", "test_list"):
        if hasattr(cls, key):
            attrs[key] = [[f, None] for f, _ in getattr(cls, key)]
    if isinstance(getattr(cls, "meta", None), dict):
        attrs["meta"] = {**cls.meta, "md5": None}
    if isinstance(getattr(cls, "split_list", None), dict):
        attrs["split_list"] = {k: [v[0], v[1], None] for k, v in cls.split_list.items()}
    return type(cls.__name__, (cls,), attrs)


def read_torchvision(
    name: str, root: Path, download: bool, verify_md5: bool = True
) -> tuple[RawSplit, RawSplit]:
    """Decode a dataset with torchvision's own class (its file layout, checks and
    decoding). A refusal is turned into one clear error: files missing (where and how to
    get them), a file whose MD5 differs from the official release (torchvision verifies
    CIFAR, SVHN and STL-10 on every load), or files it cannot decode.

    ``verify_md5=False`` (``dataset.verify_md5: false``) loads CIFAR / SVHN / STL-10 files
    that differ from the official release (your own data in that layout, or the tiny
    files of the tests) with the same class, which then checks only that the files exist
    (:func:`_existence_checked`); MNIST, Fashion-MNIST and USPS are never MD5-checked by
    torchvision when loading."""
    import torchvision.datasets as tvd

    layout = _layout(name)
    folder, files = torchvision_files(name, root)
    if layout.idx_gz:
        _unpack_idx_gz(folder, files)
    try:
        cls = getattr(tvd, TORCHVISION_CLASSES[name])
        if layout.md5_checked and not verify_md5:
            cls = _existence_checked(cls)
        out = []
        for train in (True, False):
            x, y, classes = layout.split(cls, root, train, download)
            out.append(
                RawSplit(
                    _hwc(x, f"dataset '{name}'"),
                    _int_labels(y, f"dataset '{name}' labels"),
                    classes=classes,
                )
            )
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - every refusal becomes one clear error
        raise _torchvision_refusal(exc, name, root, download, verify_md5, folder, files) from None
    return out[0], out[1]


def _torchvision_refusal(
    exc: Exception,
    name: str,
    root: Path,
    download: bool,
    verify_md5: bool,
    folder: Path,
    files: list,
) -> DatasetError:
    """What a torchvision class's refusal means, in one line: a failed download, files
    missing (where and how to get them), a file failing the MD5 check, or files it
    cannot decode."""
    if download and isinstance(exc, (RuntimeError, OSError)):
        return DatasetError(f"dataset '{name}': download into {root} failed ({exc})")
    missing = [f for f, _ in files if not (folder / f).is_file()]
    if missing:
        return _missing(name, root, f" (no {folder / missing[0]})")
    from torchvision.datasets.utils import check_integrity

    bad = [
        f
        for f, md5 in files
        if verify_md5 and md5 is not None and not check_integrity(str(folder / f), md5)
    ]
    if bad:
        return DatasetError(
            f"dataset '{name}': {folder / bad[0]} fails torchvision's MD5 check (it is "
            "corrupted, truncated or not the official release): copy the official "
            "files there, use dataset.download: true, or set dataset.verify_md5: false "
            "to load files of your own in this layout"
        )
    detail = " ".join(str(exc).split())
    return DatasetError(
        f"dataset '{name}': torchvision.datasets.{TORCHVISION_CLASSES[name]} "
        f"cannot read the files in {folder} ({type(exc).__name__}: "
        f"{detail})"
    )


_CIFAR = TorchvisionLayout(_cifar_files, _cifar_split, md5_checked=True)
_IDX = TorchvisionLayout(_idx_files, _idx_split, md5_checked=False, idx_gz=True)

# dataset name -> how torchvision's class reads it: every dataset the catalog names a
# torchvision class for (tests/registry/test_registries.py); the datasets table
# (:data:`fedrcl_flwr.data.sources.table.SOURCES`) refers to these layouts
LAYOUTS: dict[str, TorchvisionLayout] = {
    "cifar10": _CIFAR,
    "cifar100": _CIFAR,
    "mnist": _IDX,
    "fmnist": _IDX,
    "svhn": TorchvisionLayout(_svhn_files, _svhn_split, md5_checked=True),
    "usps": TorchvisionLayout(_usps_files, _usps_split, md5_checked=False),
    "stl10": TorchvisionLayout(_stl10_files, _stl10_split, md5_checked=True),
}
