"""Hugging Face data: Flower Datasets' partitioners on our labels, and datasets saved with
``save_to_disk`` (the optional extra ``flwr-datasets``, which brings ``datasets``).

* :func:`flwr_datasets_split` — ``partition.scheme: flwr_datasets``: any sample-splitting
  partitioner of ``flwr_datasets.partitioner`` (checked by
  :mod:`fedrcl_flwr.config.partitioners`) run on a tiny in-memory ``datasets.Dataset`` of
  the training labels (columns ``label``, ``domain`` where the dataset has domains, and
  the row number), so it works on every dataset of the project; each client's index list
  is the row numbers of Flower's partition *i*, in Flower's order. Nothing is read from
  or sent to the network (:func:`fedrcl_flwr.config.partitioners.offline`).
* :func:`read_hf_disk` — ``dataset.name: hf_disk``: ``dataset.path`` is a directory
  written by ``DatasetDict.save_to_disk`` with splits ``train`` and ``test`` (others are
  ignored). ``dataset.image_column`` /
  ``dataset.label_column`` name the columns; null = detected: the one column of the
  ``Image`` feature type (else one named ``img`` / ``image``), the one ``ClassLabel``
  column (else one named ``label`` / ``labels`` / ``fine_label``). Images may be PIL
  images (the ``Image`` feature) or nested lists / arrays of pixels; they are converted
  as the ``npz`` reader converts arrays (uint8 as is, floats in [0, 1] scaled), PIL
  images to RGB (L when every image is greyscale). The images of a split must share one
  size (``dataset.image_size`` then resizes them as for every dataset).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedrcl_flwr.config.catalog import domain_datasets_in_words
from fedrcl_flwr.config.partitioners import build, install_hint, offline
from fedrcl_flwr.errors import ConfigError

IMAGE_NAMES = ("img", "image", "pixel_values", "pixels")
LABEL_NAMES = ("label", "labels", "fine_label", "target")
INDEX_COLUMN = "__row__"


def _datasets(where: str):
    with offline():
        try:
            import datasets
        except ImportError:
            raise ConfigError(f"{where} needs Hugging Face datasets ({install_hint()})") from None
    return datasets


def flwr_datasets_split(
    spec: dict,
    labels: np.ndarray,
    num_clients: int,
    seed: int,
    domains: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Index arrays of ``num_clients`` clients drawn by the partitioner ``spec``
    (``partition.partitioner``) from ``labels`` (and ``domains``). A problem Flower's
    partitioner raises on these labels (too many partitions, a class with too few
    samples) is one :class:`ConfigError` line."""
    from fedrcl_flwr.errors import PartitionError

    where = "partition.scheme flwr_datasets"
    partitioner, column = build(spec, num_clients, seed, where)
    if column == "domain" and domains is None:
        raise PartitionError(
            f"{where}: partition_by domain needs a dataset with domains "
            f"({domain_datasets_in_words()})"
        )
    datasets = _datasets(where)
    n = len(labels)
    cols: dict[str, Any] = {
        "label": np.asarray(labels, dtype=np.int64),
        INDEX_COLUMN: np.arange(n, dtype=np.int64),
    }
    if domains is not None:
        cols["domain"] = np.asarray(domains, dtype=np.int64)
    with offline():
        datasets.disable_progress_bars()
        ds = datasets.Dataset.from_dict(cols)
        try:
            partitioner.dataset = ds
            count = partitioner.num_partitions
            if count != num_clients:
                raise PartitionError(
                    f"{where}: {spec['name']} made {count} partitions but "
                    f"federation.num_clients is {num_clients}"
                )
            parts = [
                np.asarray(partitioner.load_partition(i)[INDEX_COLUMN], dtype=np.int64)
                for i in range(num_clients)
            ]
        except PartitionError:
            raise
        except Exception as exc:  # noqa: BLE001 - Flower's refusal is one line
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise PartitionError(f"{where} ({spec['name']}): {text}") from None
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise PartitionError(
            f"{where} ({spec['name']}): client(s) {empty[:5]} got no sample: every client "
            "needs at least one (fewer clients, or other arguments)"
        )
    return parts


# ------------------------------------------------------------------------- hf_disk


def _pick(features: dict, given: str | None, key: str, kind: str, names: tuple, path) -> str:
    from fedrcl_flwr.data.raw import DatasetError

    if given is not None:
        if given not in features:
            raise DatasetError(
                f"{path}: '{key}' {given!r} is not a column (columns: {', '.join(features)})"
            )
        return given
    typed = [c for c, f in features.items() if type(f).__name__ == kind]
    if len(typed) == 1:
        return typed[0]
    named = [c for c in names if c in features]
    if len(typed) == 0 and named:
        return named[0]
    raise DatasetError(
        f"{path}: cannot tell the {'image' if kind == 'Image' else 'label'} column "
        f"(columns: {', '.join(features)}); set '{key}'"
    )


def _pixels(values: list, what: str) -> np.ndarray:
    from fedrcl_flwr.data.raw import DatasetError, hwc

    first = values[0] if values else None
    if first is not None and hasattr(first, "mode") and hasattr(first, "convert"):  # PIL
        mode = (
            "L" if all(getattr(v, "mode", "") in ("L", "1", "I", "I;16") for v in values) else "RGB"
        )
        arrays = [np.asarray(v.convert(mode)) for v in values]
    else:
        arrays = [np.asarray(v) for v in values]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise DatasetError(
            f"{what}: images of {len(shapes)} different shapes (e.g. {sorted(shapes)[:2]}); "
            "store one size or set dataset.image_size"
        )
    return hwc(np.stack(arrays) if arrays else np.zeros((0, 1, 1), np.uint8), what)


def read_hf_disk(
    path: str,
    image_column: str | None,
    label_column: str | None,
):
    """(train, test) :class:`~fedrcl_flwr.data.datasets.RawSplit` of the dataset saved at
    ``path`` (see the module docstring)."""
    from fedrcl_flwr.data.raw import DatasetError, RawSplit, int_labels

    p = Path(path).expanduser()
    if not p.exists():
        raise DatasetError(f"hf_disk dataset {p} does not exist (dataset.path)")
    datasets = _datasets("dataset.name hf_disk")
    with offline():
        datasets.disable_progress_bars()
        try:
            obj = datasets.load_from_disk(str(p))
        except Exception as exc:  # noqa: BLE001 - an unreadable folder is one line
            text = " ".join(str(exc).split())
            raise DatasetError(
                f"{p}: not a dataset saved with save_to_disk ({text[:200]})"
            ) from None
    if not isinstance(obj, datasets.DatasetDict) or not {"train", "test"} <= set(obj):
        held = ", ".join(obj) if isinstance(obj, datasets.DatasetDict) else "one Dataset"
        raise DatasetError(
            f"{p}: need a DatasetDict with splits train and test (found {held}); save "
            "DatasetDict({'train': ..., 'test': ...}) with save_to_disk"
        )
    splits = {s: obj[s] for s in ("train", "test")}
    features = dict(splits["train"].features)
    img = _pick(features, image_column, "dataset.image_column", "Image", IMAGE_NAMES, p)
    lab = _pick(features, label_column, "dataset.label_column", "ClassLabel", LABEL_NAMES, p)
    if img == lab:
        raise DatasetError(f"{p}: image and label column are both {img!r}")

    def read(ds, split: str):
        what = f"{p} [{split}] column {img}"
        x = _pixels(ds[img], what)
        y = int_labels(np.asarray(ds[lab]), f"{p} [{split}] column {lab}")
        return x, y

    x, y = read(splits["train"], "train")
    xt, yt = read(splits["test"], "test")
    # a ClassLabel names the classes (some may be absent from both splits): its count
    # is the number of classes, as CIFAR's class list is
    classes = getattr(features[lab], "num_classes", None)
    return RawSplit(x, y, classes=classes), RawSplit(xt, yt)
