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
  column (else one named ``label`` / ``labels`` / ``fine_label``; never the domain
  column); ``dataset.domain_column`` (null = one domain) names each image's domain
  (:func:`_domain_ids`), so one saved dataset holds every domain. Images may be PIL
  images (the ``Image`` feature) or nested lists / arrays of pixels; they are converted
  as the ``npz`` reader converts arrays (uint8 as is, floats in [0, 1] scaled), PIL
  images to RGB (L when every image is greyscale). Images of one size are resized by
  ``dataset.image_size`` as for every dataset; images of several sizes need it, and are
  each resized to it as they are read (bilinear, as an image folder's). Checked before
  anything is read or fingerprinted (:func:`check_hf_disk`): ``dataset.path`` a folder
  holding ``dataset_dict.json`` with splits ``train`` and ``test``, each split folder's
  ``state.json`` naming at least one data file (an empty split is refused as such); a
  ``ClassLabel`` of at most :data:`~fedrcl_flwr.data.sources.raw.MAX_CLASSES` classes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedrcl_flwr.config.catalog import domain_datasets_in_words
from fedrcl_flwr.config.partitioners import build, install_hint, offline
from fedrcl_flwr.errors import ConfigError, shown

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
    samples) is one :class:`ConfigError` line, also when Flower's own arithmetic fails
    (:func:`_arithmetic_refusal`: ``ShardPartitioner`` with more shards than samples
    divides by a shard size of 0). Flower's warnings while it splits are shown only
    when the split succeeds (a refused split is its one line); the library deprecation
    notices it triggers (pyarrow's ``FutureWarning``) never."""
    import warnings

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
    cols = _label_columns(labels, domains)
    with offline(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
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
        except ArithmeticError as exc:
            raise PartitionError(_arithmetic_refusal(spec, n, num_clients, exc)) from None
        except Exception as exc:  # noqa: BLE001 - Flower's refusal is one line
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise PartitionError(f"{where} ({spec['name']}): {text}") from None
    _replay_warnings(caught)  # the split succeeded: Flower's notes about it are worth seeing
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise PartitionError(
            f"{where} ({spec['name']}): client(s) {empty[:5]} got no sample: every client "
            "needs at least one (fewer clients, or other arguments)"
        )
    return parts


def _label_columns(labels: np.ndarray, domains: np.ndarray | None) -> dict[str, Any]:
    """The columns of the in-memory dataset a partitioner splits: ``label``, the row
    number, and ``domain`` where the dataset has domains."""
    cols: dict[str, Any] = {
        "label": np.asarray(labels, dtype=np.int64),
        INDEX_COLUMN: np.arange(len(labels), dtype=np.int64),
    }
    if domains is not None:
        cols["domain"] = np.asarray(domains, dtype=np.int64)
    return cols


def _replay_warnings(caught: list) -> None:
    """Show the warnings recorded while Flower split, except the library deprecation
    notices (``DeprecationWarning``, ``PendingDeprecationWarning``, ``FutureWarning``)."""
    import warnings

    for w in caught:
        if not issubclass(
            w.category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
        ):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _arithmetic_refusal(spec: dict, n: int, num_clients: int, exc: ArithmeticError) -> str:
    """The one line of a partitioner whose arithmetic failed on ``n`` samples and
    ``num_clients`` clients: ``ShardPartitioner``'s shards must hold a sample each —
    ``num_shards_per_partition`` × clients at most the training samples (flwr-datasets
    0.6.1 divides by the shard size it computes, 0); any other partitioner's arithmetic
    error is named as such."""
    name = spec["name"]
    where = f"partition.scheme flwr_datasets ({name})"
    per = spec.get("num_shards_per_partition")
    if name == "ShardPartitioner" and isinstance(per, int) and spec.get("shard_size") is None:
        return (
            f"{where}: 'partition.partitioner.num_shards_per_partition' {per} × "
            f"{num_clients} clients = {per * num_clients} shards for {n} training samples: "
            f"a shard would hold no sample (at most {n // max(num_clients, 1)} per client)"
        )
    text = " ".join(str(exc).split()) or type(exc).__name__
    return (
        f"{where}: its arguments do not fit {n} training samples and {num_clients} "
        f"clients (Flower's arithmetic failed: {text})"
    )


# ------------------------------------------------------------------------- hf_disk


def _pick(features: dict, given: str | None, key: str, kind: str, names: tuple, path) -> str:
    from fedrcl_flwr.data.sources.raw import DatasetError

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


def _pixels(values: list, what: str, image_size: int | None = None) -> np.ndarray:
    """The images ``values`` as uint8 (N, H, W, C); images of several sizes each resized
    to ``image_size`` (PIL bilinear for PIL images, as an image folder's; antialiased
    bilinear for arrays), or refused without it."""
    from fedrcl_flwr.data.sources.raw import DatasetError, hwc

    first = values[0] if values else None
    pil = first is not None and hasattr(first, "mode") and hasattr(first, "convert")
    if pil:
        mode = (
            "L" if all(getattr(v, "mode", "") in ("L", "1", "I", "I;16") for v in values) else "RGB"
        )
        images = [v.convert(mode) for v in values]
        arrays = [np.asarray(v) for v in images]
    else:
        arrays = [np.asarray(v) for v in values]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1 and image_size is None:
        raise DatasetError(
            f"{what}: images of {len(shapes)} different shapes (e.g. {sorted(shapes)[:2]}); "
            "set dataset.image_size to resize each to one size"
        )
    if len(shapes) > 1 and pil:
        from PIL import Image

        size = (int(image_size), int(image_size))  # type: ignore[arg-type]
        arrays = [
            np.asarray(im if im.size == size else im.resize(size, Image.Resampling.BILINEAR))
            for im in images
        ]
    elif len(shapes) > 1:
        from fedrcl_flwr.data.sources.raw import resize_u8

        side = int(image_size)  # type: ignore[arg-type]
        resized = [resize_u8(hwc(a[None], what), side) for a in arrays]
        channels = sorted({r.shape[3] for r in resized})
        if len(channels) > 1:
            raise DatasetError(f"{what}: images with {channels[0]} and {channels[-1]} channels")
        return np.concatenate(resized)
    return hwc(np.stack(arrays) if arrays else np.zeros((0, 1, 1), np.uint8), what)


# what a folder written by DatasetDict.save_to_disk holds (datasets 2.x - 4.x)
DICT_FILE = "dataset_dict.json"
STATE_FILE = "state.json"
INFO_FILE = "dataset_info.json"
MAX_JSON_BYTES = 1 << 20  # dataset_dict.json, state.json (a few hundred bytes each)
# dataset_info.json: its ClassLabel names (MAX_CLASSES of them take about 2 MB)
MAX_INFO_BYTES = 16 << 20
SPLITS = ("train", "test")


def _small_json(path: Path, what: str, limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON of ``path``, a regular file of at most ``limit`` bytes (opened without
    following a link or blocking on a FIFO), or a :class:`DatasetError`."""
    import json
    import os
    import stat

    from fedrcl_flwr.data.sources.raw import MAX_CLASSES, DatasetError

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        raise DatasetError(f"{what}: cannot read {path.name} ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise DatasetError(f"{what}: {path.name} is not a regular file")
        if st.st_size > limit:
            raise DatasetError(
                f"{what}: {path.name} holds {st.st_size:,} bytes (at most {limit:,}: a "
                f"ClassLabel of more than {MAX_CLASSES:,} classes?)"
            )
        try:
            return json.loads(fh.read(limit + 1).decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise DatasetError(f"{what}: {path.name} is not JSON") from None


def check_hf_disk(path: str) -> None:
    """Check the ``DatasetDict`` saved at ``path`` before anything is read from it or the
    dataset cache fingerprints its folder: ``dataset.path`` a folder with
    ``dataset_dict.json`` naming both splits, each split folder's ``state.json`` naming
    its data files (none: an empty split) and its ``dataset_info.json`` no ``ClassLabel``
    of more than ``MAX_CLASSES`` classes (loading one of 10**6 takes half a minute).
    Anything else is one :class:`DatasetError` naming ``dataset.path``; no folder is
    walked."""
    import errno

    from fedrcl_flwr.data.sources.raw import MAX_CLASSES, DatasetError

    p = Path(path).expanduser()
    try:
        is_dir = p.is_dir()
        exists = is_dir or p.exists()
    except OSError as exc:  # a name too long, a loop of links
        why = "a file name too long" if exc.errno == errno.ENAMETOOLONG else exc.strerror
        raise DatasetError(
            f"dataset.path {shown(str(p))}: cannot be looked up ({why or exc})"
        ) from None
    if not exists:
        raise DatasetError(f"hf_disk dataset {shown(str(p), 300)} does not exist (dataset.path)")
    what = f"dataset.path {p}"
    if not is_dir or not (p / DICT_FILE).is_file():
        raise DatasetError(
            f"{what}: not a DatasetDict saved with save_to_disk (no {DICT_FILE} in a folder); "
            "save DatasetDict({'train': ..., 'test': ...}) with save_to_disk"
        )
    meta = _small_json(p / DICT_FILE, what)
    held = meta.get("splits") if isinstance(meta, dict) else None
    if not isinstance(held, list) or not set(SPLITS) <= {str(h) for h in held}:
        shown_held = ", ".join(str(h)[:40] for h in held[:10]) if isinstance(held, list) else "?"
        raise DatasetError(
            f"{what}: need a DatasetDict with splits train and test (found {shown_held}); "
            "save DatasetDict({'train': ..., 'test': ...}) with save_to_disk"
        )
    for split in SPLITS:
        state = _small_json(p / split / STATE_FILE, f"{what} [{split}]")
        data = state.get("_data_files") if isinstance(state, dict) else None
        if not isinstance(data, list):
            raise DatasetError(f"{what} [{split}]: {STATE_FILE} names no data files")
        if not data:
            raise DatasetError(
                f"{what}: split {split!r} is empty (no rows): train and test each need at "
                "least one image"
            )
        names = [d.get("filename") if isinstance(d, dict) else None for d in data]
        if not all(isinstance(n, str) and n and "/" not in n and n != ".." for n in names):
            raise DatasetError(f"{what} [{split}]: {STATE_FILE} names a data file outside it")
        info = _small_json(p / split / INFO_FILE, f"{what} [{split}]", MAX_INFO_BYTES)
        features = info.get("features") if isinstance(info, dict) else None
        for column, feat in (features if isinstance(features, dict) else {}).items():
            names_ = feat.get("names") if isinstance(feat, dict) else None
            if isinstance(names_, list) and feat.get("_type") == "ClassLabel":
                if len(names_) > MAX_CLASSES:
                    raise DatasetError(
                        f"{what} [{split}]: the ClassLabel of column {shown(column)} has "
                        f"{len(names_):,} classes (at most {MAX_CLASSES:,})"
                    )


def read_hf_disk(
    path: str,
    image_column: str | None,
    label_column: str | None,
    image_size: int | None = None,
    domain_column: str | None = None,
):
    """(train, test, domain names) of the dataset saved at ``path``: two
    :class:`~fedrcl_flwr.data.sources.raw.RawSplit` (see the module docstring) and the
    domain names (``[]`` without ``domain_column``; see :func:`_domain_ids`)."""
    from fedrcl_flwr.data.sources.raw import MAX_CLASSES, DatasetError, RawSplit, int_labels

    check_hf_disk(path)
    p = Path(path).expanduser()
    splits = _train_and_test(p)
    features = dict(splits["train"].features)
    dom = None
    if domain_column is not None:
        dom = _pick(features, domain_column, "dataset.domain_column", "", (), p)
    # a ClassLabel domain column is no candidate for the detected label column
    rest = {c: f for c, f in features.items() if c != dom or label_column == dom}
    img = _pick(features, image_column, "dataset.image_column", "Image", IMAGE_NAMES, p)
    lab = _pick(rest, label_column, "dataset.label_column", "ClassLabel", LABEL_NAMES, p)
    if img == lab:
        raise DatasetError(f"{p}: image and label column are both {img!r}")

    # a ClassLabel names the classes (some may be absent from both splits): its count
    # is the number of classes, as CIFAR's class list is
    classes = getattr(features[lab], "num_classes", None)
    if classes is not None and not 0 < int(classes) <= MAX_CLASSES:
        raise DatasetError(
            f"{p}: the ClassLabel of column {lab} has {int(classes):,} classes "
            f"(at most {MAX_CLASSES:,})"
        )

    if dom is not None:
        if dom in (img, lab):
            raise DatasetError(
                f"{p}: 'dataset.domain_column' {dom!r} is also the image or label column"
            )

    def read(ds, split: str):
        what = f"{p} [{split}] column {img}"
        y = int_labels(np.asarray(ds[lab]), f"{p} [{split}] column {lab}")
        x = _pixels(ds[img], what, image_size)
        return x, y

    x, y = read(splits["train"], "train")
    xt, yt = read(splits["test"], "test")
    if dom is None:
        return RawSplit(x, y, classes=classes), RawSplit(xt, yt), []
    d, dt, names = _domain_ids(splits, dom, features[dom], p)
    return RawSplit(x, y, d, classes=classes), RawSplit(xt, yt, dt), names


def _train_and_test(p: Path) -> dict:
    """The ``train`` and ``test`` splits of the ``DatasetDict`` saved at ``p``; anything
    else (an unreadable folder, one ``Dataset``, a split missing) is one
    :class:`~fedrcl_flwr.data.sources.raw.DatasetError`."""
    from fedrcl_flwr.data.sources.raw import DatasetError

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
    return {s: obj[s] for s in ("train", "test")}


def _domain_ids(splits: dict, column: str, feature: Any, p: Path):
    """``dataset.domain_column``: each image's domain id in train and test, and the domain
    names. A ``ClassLabel`` column: its ids and names; strings: the names in sorted
    order of the training split's values (a test value the training split lacks is
    refused: no client could hold that domain); non-negative integers: the ids, named
    ``domain0``, ``domain1``, ... Each domain is resized with the rest to
    ``dataset.image_size`` (images of several sizes: see :func:`_pixels`)."""
    from fedrcl_flwr.data.sources.raw import DatasetError, int_labels

    where = f"{p} 'dataset.domain_column' {column!r}"
    train = list(splits["train"][column])
    test = list(splits["test"][column])
    names = getattr(feature, "names", None)
    if names is not None:
        ids = [
            int_labels(np.asarray(v), f"{where} [{s}]")
            for s, v in (("train", train), ("test", test))
        ]
        return ids[0], ids[1], [str(n) for n in names]
    if all(isinstance(v, str) for v in train + test):
        known = sorted(set(train))
        unseen = sorted(set(test) - set(known))
        if unseen:
            raise DatasetError(
                f"{where}: test domain(s) {unseen[:5]} never occur in the training split"
            )
        index = {n: i for i, n in enumerate(known)}
        return (
            np.asarray([index[v] for v in train], np.int64),
            np.asarray([index[v] for v in test], np.int64),
            known,
        )
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in train + test):
        d = int_labels(np.asarray(train), f"{where} [train]")
        dt = int_labels(np.asarray(test), f"{where} [test]")
        top = int(max(d.max(initial=0), dt.max(initial=0)))
        return d, dt, [f"domain{i}" for i in range(top + 1)]
    raise DatasetError(f"{where}: values must be all strings, all integers or a ClassLabel")
