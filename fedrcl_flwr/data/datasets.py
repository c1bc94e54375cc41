"""Datasets: one in-memory image representation for every source.

Every source (the embedded synthetic data, torchvision's CIFAR-10/100, MNIST,
Fashion-MNIST, SVHN, USPS, STL-10, Tiny-ImageNet, image-folder trees such as PACS,
Office-10, DomainNet and HAM10000, Digit-5, and user ``.npz`` arrays) is read once into
``uint8`` arrays and wrapped in :class:`ImageArrayDataset`, which normalises (the
training set's per-channel mean/std, fixed constants such as the authors', or not at all:
``dataset.normalize``) and augments whole batches on tensors (random rotation, random
crop with padding, horizontal flip, per dataset; pixel-exact to torchvision's transforms
on the PIL image for the same draws: ``fedrcl_flwr/augment.py``). Clients never copy data:
they hold index arrays into the one training set of their process.

Each source's reader is in :mod:`fedrcl_flwr.data.sources` (one module per format, and
the table :data:`~fedrcl_flwr.data.sources.table.SOURCES` that names them); this module
assembles what they read into a :class:`DataBundle` (:func:`load_dataset`) and iterates
batches over it (:func:`iterate_batches`). Nothing is downloaded unless ``download=True``;
a missing dataset raises :class:`DatasetError` saying where it looked and how to get it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch.utils.data import Dataset

from fedrcl_flwr.accel import gather_rows, to_device, transfer_plan
from fedrcl_flwr.augment import AugmentSpec
from fedrcl_flwr.data.sources.raw import DatasetError, RawSplit
from fedrcl_flwr.data.sources.raw import resize_u8 as _resize_u8
from fedrcl_flwr.data.sources.table import SOURCES, read_source
from fedrcl_flwr.errors import ConfigError

# --------------------------------------------------------------------------------------
# The one dataset class
# --------------------------------------------------------------------------------------


@dataclass
class AugmentDraws:
    """The random draws of one training batch (:meth:`ImageArrayDataset.draw_augment`):
    rotation angles in degrees, crop offsets (row ``top``, column ``left``) and the
    flip mask; ``None`` where that transform is off."""

    angles: torch.Tensor | None = None
    top: torch.Tensor | None = None
    left: torch.Tensor | None = None
    flip: torch.Tensor | None = None


class ImageArrayDataset(Dataset):
    """Images held as a ``uint8`` tensor (N, C, H, W) plus labels.

    ``dataset[i]`` returns ``(x, y)`` with ``x`` normalised float32 (C, H, W) (augmented
    when an :class:`AugmentSpec` is active); :meth:`get_batch` returns a whole batch with
    vectorised augmentation drawn from a given generator — the training loop's fast path.
    ``images`` is only ever read (it may be a read-only memory map).
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: np.ndarray,
        mean,
        std,
        augment: AugmentSpec | None = None,
    ):
        self.images = images
        self.labels = np.asarray(labels, dtype=np.int64)
        self._labels_t = torch.as_tensor(self.labels)
        self.mean = torch.as_tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.as_tensor(std, dtype=torch.float32).view(-1, 1, 1)
        self.augment = augment if augment is not None and augment.active else None
        self._stats_on: dict = {}  # device -> (mean, std) there

    def _stats(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, std)`` on ``device`` (copied there once)."""
        if device.type == "cpu":
            return self.mean, self.std
        key = str(device)
        if key not in self._stats_on:
            self._stats_on[key] = (to_device(self.mean, device), to_device(self.std, device))
        return self._stats_on[key]

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def plain(self) -> ImageArrayDataset:
        """The same data without augmentation (for embedding / evaluation)."""
        return ImageArrayDataset(
            self.images, self.labels, self.mean.flatten(), self.std.flatten(), None
        )

    def _normalise(self, u8: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(u8.device)
        return (u8.float().div_(255.0) - mean) / std

    def __getitem__(self, i):
        x, y = self.get_batch(np.asarray([int(i)]))
        return x[0], int(y[0])

    def draw_augment(self, b: int, generator: torch.Generator | None = None) -> AugmentDraws:
        """The random draws of a training batch of ``b`` samples, in this order (all from
        ``generator`` on the host): rotation angles (``torch.rand(b)``), then, with a crop,
        column and row offsets (``torch.randint(0, 2·pad + 1, (b,))`` each) and flips
        (``torch.rand(b) < 0.5``), or, without a crop, flips alone."""
        from fedrcl_flwr.augment import draw_angles, draw_crop_flip

        aug = self.augment
        draws = AugmentDraws()
        if aug is None:
            return draws
        if aug.rotation > 0:
            draws.angles = draw_angles(b, aug.rotation, generator)
        if aug.crop_pad > 0:
            draws.top, draws.left, draws.flip = draw_crop_flip(b, aug.crop_pad, aug.flip, generator)
        elif aug.flip:
            draws.flip = torch.rand(b, generator=generator) < 0.5
        return draws

    def apply_augment(self, u8: torch.Tensor, draws: AugmentDraws) -> torch.Tensor:
        """The normalised float32 batch of the ``uint8`` images ``u8`` (B, C, H, W) under
        ``draws``: as torchvision's ``RandomRotation`` -> ``RandomCrop(padding)`` ->
        ``RandomHorizontalFlip`` -> ``ToTensor`` -> ``Normalize`` on the PIL images with
        these angles / offsets / flips (``pad_fill: black``; with ``mean`` the crop pads
        the normalised image with 0). Rotation, crop and flip only move pixels, so they run
        on the ``uint8`` values, on ``u8``'s device."""
        from fedrcl_flwr.augment import crop_flip, rotate

        aug = self.augment
        if draws.angles is not None:
            u8 = rotate(u8, draws.angles)
        if aug is None or draws.top is None or draws.left is None:  # drawn together
            x = self._normalise(u8)
            if draws.flip is not None:
                do = to_device(draws.flip, u8.device)
                x = torch.where(do[:, None, None, None], x.flip(3), x)
            return x
        if aug.pad_fill == "black":
            return self._normalise(crop_flip(u8, draws.top, draws.left, draws.flip, aug.crop_pad))
        return crop_flip(self._normalise(u8), draws.top, draws.left, draws.flip, aug.crop_pad)

    def get_batch(
        self, idx, generator: torch.Generator | None = None, device: torch.device | None = None
    ):
        """Samples ``idx`` as ``(x, y)`` on ``device`` (default: the CPU).

        The ``uint8`` pixels and the labels are gathered on the host (into pinned memory
        for a CUDA device) and copied without blocking; augmentation (rotation, crop,
        flip: :meth:`draw_augment`, :meth:`apply_augment`) and normalisation then run
        there as batched tensor ops. Every random draw comes from ``generator`` on the
        host, in the same order whatever the device."""
        idx_t = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        dev = torch.device("cpu" if device is None else device)
        pin, _ = transfer_plan(dev)
        u8 = to_device(gather_rows(self.images, idx_t, pin), dev)
        y = to_device(gather_rows(self._labels_t, idx_t, pin), dev)
        if self.augment is None:
            return self._normalise(u8), y
        return self.apply_augment(u8, self.draw_augment(len(idx_t), generator)), y


@dataclass
class DataBundle:
    """What an experiment trains and tests on.

    ``train_domains`` / ``test_domains`` hold one domain id per sample (``None`` for
    single-domain data); ``domain_names`` names them. ``val`` is the held-out part of the
    training set (``dataset.val_fraction``), or ``None``.
    """

    name: str
    train: ImageArrayDataset
    test: ImageArrayDataset
    train_labels: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    in_channels: int
    image_size: int
    train_domains: np.ndarray | None = None
    test_domains: np.ndarray | None = None
    domain_names: list = field(default_factory=list)
    val: ImageArrayDataset | None = None


# --------------------------------------------------------------------------------------
# Assembly
# --------------------------------------------------------------------------------------


def default_augment(name: str, image_size: int) -> AugmentSpec:
    """The standard augmentation of dataset ``name`` (:data:`SOURCES`' ``augment``); for
    natural images of any size (``augment`` ``None``: image folders, and a name not in
    the table) a crop padded by an eighth of the image size, and a flip."""
    source = SOURCES.get(name)
    if source is not None and source.augment is not None:
        return source.augment
    return AugmentSpec(max(1, image_size // 8), True)


def augment_spec(
    name: str,
    image_size: int,
    augment: bool,
    rotation: float = 0.0,
    crop_pad: int | None = None,
    flip: bool | None = None,
    pad_fill: str = "mean",
) -> AugmentSpec | None:
    """The training augmentation of a dataset: its standard crop/flip
    (:func:`default_augment`; none for ``npz``) with ``dataset.rotation`` / ``crop_pad`` /
    ``flip`` / ``pad_fill`` applied; ``None`` when ``dataset.augment`` is off or nothing is
    left. Not part of the prepared arrays (it is drawn per batch), so changing it never
    rebuilds the dataset cache."""
    if not augment:
        return None
    aug = replace(default_augment(name, image_size), pad_fill=str(pad_fill))
    if rotation > 0:
        aug = replace(aug, rotation=float(rotation))
    if crop_pad is not None:
        aug = replace(aug, crop_pad=int(crop_pad))
    if flip is not None:
        aug = replace(aug, flip=bool(flip))
    return aug if aug.active else None


def normalisation(normalize, x: np.ndarray, what: str = "dataset") -> tuple[list, list]:
    """``(mean, std)`` per channel of ``dataset.normalize``: the training images'
    statistics (``True``), none (``False``: 0 / 1) or the given ``{mean, std}`` constants
    (checked against the images' channels: a :class:`DatasetError` otherwise)."""
    channels = int(x.shape[-1])
    if normalize is True:
        return _channel_stats(x)
    if normalize is False or normalize is None:
        return [0.0] * channels, [1.0] * channels
    from fedrcl_flwr.config import normalize_constants

    try:
        constants = normalize_constants(normalize, what, channels)
    except ConfigError as exc:
        raise DatasetError(str(exc)) from None
    assert constants is not None  # None only for true / false, handled above
    mean, std = constants
    return mean, std


def _channel_stats(x: np.ndarray) -> tuple[list, list]:
    sample = x[:: max(1, len(x) // 10000)].astype(np.float64) / 255.0
    mean = sample.mean(axis=(0, 1, 2))
    std = sample.std(axis=(0, 1, 2))
    std = np.where(std < 1e-6, 1.0, std)
    return mean.tolist(), std.tolist()


def load_dataset(
    name: str,
    *,
    root: str = "~/data",
    path: str | None = None,
    download: bool = False,
    augment: bool = True,
    normalize: bool = True,
    image_size: int | None = None,
    synthetic: dict | None = None,
    seed: int = 0,
    val_fraction: float = 0.0,
    domains: list | None = None,
    test_fraction: float = 0.2,
    test_split: str = "random",
    rotation: float = 0.0,
    crop_pad: int | None = None,
    verify_md5: bool = True,
    flip: bool | None = None,
    pad_fill: str = "mean",
    image_column: str | None = None,
    label_column: str | None = None,
    domain_column: str | None = None,
) -> DataBundle:
    """Load a dataset into a :class:`DataBundle` (see the module docstring).
    ``normalize``: ``True`` | ``False`` | ``{"mean": [...], "std": [...]}``.

    Steps: read the source's ``uint8`` images (:func:`read_source`), check the two
    splits (:func:`_check_splits`), resize (``image_size``: :func:`_resized`), count the
    classes (:func:`_num_classes`), hold out a validation share
    (:func:`_hold_out_validation`), then wrap train / test / validation with the
    normalisation and augmentation (:func:`_bundle`)."""
    tr, te, dnames, class_list = read_source(
        name,
        root,
        path=path,
        download=download,
        image_size=image_size,
        synthetic=synthetic,
        seed=seed,
        domains=domains,
        test_fraction=test_fraction,
        verify_md5=verify_md5,
        test_split=test_split,
        columns=(image_column, label_column, domain_column),
    )
    _check_splits(name, tr, te)
    tr, te = _resized(name, tr, te, image_size)
    num_classes = _num_classes(name, tr, te, class_list)
    tr, val_split = _hold_out_validation(tr, val_fraction, seed)
    mean, std = normalisation(normalize, tr.x, f"dataset {name!r}")
    aug = augment_spec(name, int(tr.x.shape[1]), augment, rotation, crop_pad, flip, pad_fill)
    return _bundle(name, tr, te, val_split, dnames, num_classes, (mean, std), aug)


def _bundle(
    name: str,
    tr: RawSplit,
    te: RawSplit,
    val_split: RawSplit | None,
    dnames: list,
    num_classes: int,
    stats: tuple[list, list],
    aug: AugmentSpec | None,
) -> DataBundle:
    """The :class:`DataBundle` of the final splits: each wrapped as an
    :class:`ImageArrayDataset` with the normalisation ``stats`` (``(mean, std)``), the
    training set with the augmentation ``aug``; domains kept only when the training set
    has more than one."""
    mean, std = stats
    size = int(tr.x.shape[1])

    def wrap(split: RawSplit, aug_spec):
        imgs = torch.from_numpy(np.ascontiguousarray(split.x.transpose(0, 3, 1, 2)))
        return ImageArrayDataset(imgs, split.y, mean, std, aug_spec)

    has_domains = tr.d is not None and len(np.unique(tr.d)) > 1
    return DataBundle(
        name=name,
        train=wrap(tr, aug),
        test=wrap(te, None),
        train_labels=tr.y,
        test_labels=te.y,
        num_classes=num_classes,
        in_channels=int(tr.x.shape[-1]),
        image_size=size,
        train_domains=tr.d if has_domains else None,
        test_domains=te.d if has_domains and te.d is not None else None,
        domain_names=dnames if has_domains else [],
        val=wrap(val_split, None) if val_split is not None else None,
    )


def _resized(
    name: str, tr: RawSplit, te: RawSplit, image_size: int | None
) -> tuple[RawSplit, RawSplit]:
    """Both splits resized to ``image_size`` (as read when ``None``); train and test
    images of different shapes are a :class:`DatasetError`."""
    if image_size is not None:
        tr = RawSplit(_resize_u8(tr.x, image_size), tr.y, tr.d)
        te = RawSplit(_resize_u8(te.x, image_size), te.y, te.d)
    if tr.x.shape[1:] != te.x.shape[1:] and len(te.y):
        raise DatasetError(
            f"dataset '{name}': train images {tr.x.shape[1:]} and test images "
            f"{te.x.shape[1:]} differ; set dataset.image_size"
        )
    return tr, te


def _check_splits(name: str, tr: RawSplit, te: RawSplit) -> None:
    if len(tr.y) == 0:
        raise DatasetError(f"dataset '{name}' has no training images")
    if len(te.y) == 0:
        raise DatasetError(
            f"dataset '{name}' has no test images (every experiment is evaluated on a test set)"
        )
    unseen = sorted(set(np.unique(te.y).tolist()) - set(np.unique(tr.y).tolist()))
    if unseen:
        raise DatasetError(
            f"dataset '{name}': test classes {unseen[:10]} never occur in the "
            "training set (no client could learn them)"
        )


def _num_classes(name: str, tr: RawSplit, te: RawSplit, class_list: int | None) -> int:
    """The largest label + 1, or the classes the source's own class list names
    (:func:`read_source`: CIFAR's ``batches.meta``, the authors' ``K``; the synthetic
    generator's ``num_classes``)."""
    num_classes = int(max(tr.y.max(), te.y.max() if len(te.y) else 0)) + 1
    if class_list is not None:  # e.g. CIFAR: the classes batches.meta names (their K)
        if num_classes > class_list:
            raise DatasetError(
                f"dataset '{name}': label {num_classes - 1} but the class "
                f"list names only {class_list} classes"
            )
        num_classes = class_list
    return num_classes


def _hold_out_validation(
    tr: RawSplit, val_fraction: float, seed: int
) -> tuple[RawSplit, RawSplit | None]:
    """A seeded, stratified validation share of the training set (UniVarFL: 90/10):
    ``(training set without it, validation set)``; none when ``val_fraction`` is 0."""
    if val_fraction <= 0:
        return tr, None
    rng = np.random.default_rng([seed, 1234])
    hold = np.zeros(len(tr.y), bool)
    for c in np.unique(tr.y):
        idx = np.flatnonzero(tr.y == c)
        hold[rng.choice(idx, int(round(val_fraction * len(idx))), replace=False)] = True
    return (
        RawSplit(tr.x[~hold], tr.y[~hold], None if tr.d is None else tr.d[~hold]),
        RawSplit(tr.x[hold], tr.y[hold]),
    )


def _takes_device(get_batch) -> bool:
    import inspect

    try:
        return "device" in inspect.signature(get_batch).parameters
    except (TypeError, ValueError):
        return False


# what becomes of an epoch's last, incomplete batch (:func:`batch_bounds`)
LAST_BATCH_RULES = ("keep", "drop", "fold")


def batch_bounds(n: int, batch_size: int, last_batch: str = "keep") -> list[tuple[int, int]]:
    """``(start, stop)`` of each batch of ``n`` samples in batches of ``batch_size``.

    ``last_batch`` says what becomes of the last, incomplete batch: ``keep`` it (PyTorch's
    ``DataLoader`` default); ``drop`` it (``DataLoader(drop_last=True)``: FedUV's
    ``utils/dataloader.py``, sonhamin/FedUV @ dd2e3c5, and RethinkFL's label-skew loader;
    fewer than ``batch_size`` samples make no batch at all); ``fold``: never a batch of
    one — a last batch of a single sample joins the batch before it (which then holds
    ``batch_size + 1``), and a lone single sample makes no batch (a BatchNorm layer in
    training mode cannot normalise one sample; :func:`fedrcl_flwr.training.last_batch_rule`
    picks ``fold`` for such models). Every other batch is the same under all three.
    """
    if last_batch not in LAST_BATCH_RULES:
        raise ValueError(f"last_batch must be one of {', '.join(LAST_BATCH_RULES)}")
    bounds = [(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]
    if not bounds or bounds[-1][1] - bounds[-1][0] == batch_size:
        return bounds
    if last_batch == "drop":
        return bounds[:-1]
    if last_batch == "fold" and bounds[-1][1] - bounds[-1][0] == 1:
        if len(bounds) == 1:
            return []
        return bounds[:-2] + [(bounds[-2][0], n)]
    return bounds


def iterate_batches(
    dataset,
    indices,
    batch_size: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
    last_batch: str = "keep",
):
    """The project's one batch iterator: ``(x, y)`` batches of ``dataset[indices]``.

    Without ``generator``: in order and un-augmented (evaluation, embedding). With it
    (training, via ``runtime.make_batches``): the indices in a random order and the
    dataset's augmentation, both drawn from ``generator``. Datasets with ``get_batch``
    (every built-in one) fetch a whole batch at once; others are read sample by sample.
    ``device``: where the batches are delivered; a ``get_batch`` that takes ``device``
    (:meth:`ImageArrayDataset.get_batch`) moves the ``uint8`` pixels there and
    normalises / augments there, other datasets' batches are moved as they come.
    ``last_batch``: what becomes of the last, incomplete batch (:func:`batch_bounds`).
    """
    ds = dataset
    indices = np.asarray(indices, dtype=np.int64)
    if generator is None:
        ds = dataset.plain() if hasattr(dataset, "plain") else dataset
    else:
        indices = indices[torch.randperm(len(indices), generator=generator).numpy()]
    batch_has_device = (
        device is not None and hasattr(ds, "get_batch") and _takes_device(ds.get_batch)
    )
    for start, stop in batch_bounds(len(indices), batch_size, last_batch):
        chunk = indices[start:stop]
        if batch_has_device:
            yield ds.get_batch(chunk, generator=generator, device=device)
            continue
        if hasattr(ds, "get_batch"):
            x, y = ds.get_batch(chunk, generator=generator)
        else:
            xs, ys = zip(*(ds[int(j)] for j in chunk))
            x, y = torch.stack(xs), torch.as_tensor(ys)
        yield to_device(x, device), to_device(y, device)
